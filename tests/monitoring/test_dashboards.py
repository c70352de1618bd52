"""The Grafana dashboards: generated from monitoring/grafana/dashboards.py, loadable, and every query valid.

Query validity is promtool's verdict: each panel query (Grafana variables replaced) becomes a recording
rule in a scratch file that `promtool check rules` must accept.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from . import promql
from .conftest import DASHBOARDS, MONITORING, run_promtool

GENERATOR = MONITORING / "grafana" / "dashboards.py"


def _load(path: Path) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(path.read_text())
    return dashboard


def _targets(dashboard: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(panel["title"], target) for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_dashboards_are_the_generator_output(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(GENERATOR), str(tmp_path)], check=True, capture_output=True)
    generated = sorted(path.name for path in tmp_path.glob("*.json"))
    assert generated == sorted(path.name for path in DASHBOARDS)
    for name in generated:
        assert (tmp_path / name).read_text() == (MONITORING / "grafana" / name).read_text(), (
            f"monitoring/grafana/{name} is stale: run python monitoring/grafana/dashboards.py"
        )


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_dashboard_is_well_formed_for_grafana_provisioning(path: Path) -> None:
    dashboard = _load(path)
    assert dashboard["uid"].startswith("trainop-") and len(dashboard["uid"]) <= 40
    assert dashboard["title"].startswith("trainop / ")
    assert isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    occupied: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & occupied, f"panel {panel['title']!r} overlaps another"
        occupied |= cells
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            refs = [target["refId"] for target in panel["targets"]]
            assert refs and len(refs) == len(set(refs)), panel["title"]
    for title, target in _targets(dashboard):
        assert target["datasource"]["uid"] == "${datasource}", title
        # Variables a query uses must exist on the dashboard.
        for variable in ("$namespace", "$job", "$rank", "$kind"):
            if variable in target["expr"]:
                assert variable[1:] in variables, f"{title}: {variable} is not a variable of {path.name}"


def test_every_dashboard_query_parses_with_promtool(promtool: Path, tmp_path: Path) -> None:
    rules = []
    origin = {}
    for path in DASHBOARDS:
        dashboard = _load(path)
        for title, target in _targets(dashboard):
            record = f"dashboard_check:q{len(rules)}"
            origin[record] = f"{path.name}: {title}"
            rules.append({"record": record, "expr": promql.substitute_grafana_variables(target["expr"])})
    assert len(rules) > 30
    scratch = tmp_path / "dashboard-queries.rules.yaml"
    scratch.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}))
    result = run_promtool(promtool, "check", "rules", str(scratch))
    assert result.returncode == 0, (
        f"{result.stdout}{result.stderr}\n(queries: {json.dumps(origin, indent=1)})"
    )


def test_promtool_query_check_rejects_a_broken_query(promtool: Path, tmp_path: Path) -> None:
    """Guards the guard: the scratch-rules trick really parses the expressions."""
    scratch = tmp_path / "broken.rules.yaml"
    scratch.write_text(
        yaml.safe_dump(
            {"groups": [{"name": "g", "rules": [{"record": "x:y", "expr": "sum by (le (rate(foo[5m]))"}]}]}
        )
    )
    assert run_promtool(promtool, "check", "rules", str(scratch)).returncode != 0
