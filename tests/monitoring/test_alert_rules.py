"""The Prometheus rules: valid for promtool, unit-tested with promtool, and complete.

The behaviour of each alert (when it fires, with which labels and text) is in the promtool unit tests
(monitoring/prometheus/tests/*.test.yaml); this module runs them, proves they can fail, and checks that
every alert has a firing and a quiet case, a severity and a runbook section in docs/monitoring.md.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import REPO_ROOT, RULE_TESTS, RULES_FILE, run_promtool

REQUIRED_ALERTS = {
    "TrainopJobFailed",
    "TrainopJobStalled",
    "TrainopRestartStorm",
    "TrainopCheckpointStale",
    "TrainopGPUUnderutilised",
    "TrainopAllReduceBandwidthLow",
    "TrainopOperatorDown",
    "TrainopReconcileErrors",
}
MONITORING_DOC = REPO_ROOT / "docs" / "monitoring.md"


def _alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def _alert_cases() -> list[tuple[str, list[dict[str, Any]]]]:
    """(alertname, exp_alerts) of every alert_rule_test in every promtool test file."""
    found = []
    for path in RULE_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                found.append((case["alertname"], case.get("exp_alerts") or []))
    return found


def test_rules_pass_promtool_check(promtool: Path) -> None:
    result = run_promtool(promtool, "check", "rules", str(RULES_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_pass(promtool: Path) -> None:
    assert RULE_TESTS, "no monitoring/prometheus/tests/*.test.yaml"
    result = run_promtool(promtool, "test", "rules", *map(str, RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_TESTS)


@pytest.mark.parametrize(
    ("original", "mutant"),
    [
        ("> 15 * 60", "> 45 * 60"),  # TrainopJobStalled waits three times longer
        ("expr: vector(10e9)", "expr: vector(1e9)"),  # the InfiniBand floor drops under the fallback number
        ('phase="Failed"', 'phase="Failing"'),  # TrainopJobFailed watches a phase that does not exist
        ("< 30", "< 20"),  # TrainopGPUUnderutilised threshold
        ('up{job="trainop-operator"}', 'up{job="trainop"}'),  # TrainopOperatorDown looks at the wrong job
        # TrainopAllReduceBandwidthLow forgets the backend and holds gloo (CPU) jobs to NCCL's floors.
        ('bytes_per_second{backend="nccl"}', "bytes_per_second"),
    ],
    ids=[
        "stalled-threshold",
        "bandwidth-floor",
        "failed-phase",
        "gpu-threshold",
        "operator-job",
        "bandwidth-backend",
    ],
)
def test_promtool_unit_tests_catch_a_broken_rule(
    promtool: Path, tmp_path: Path, original: str, mutant: str
) -> None:
    """The unit tests are worth something only if a wrong rule makes them fail."""
    text = RULES_FILE.read_text()
    assert original in text
    (tmp_path / "prometheus" / "tests").mkdir(parents=True)
    (tmp_path / "prometheus" / "trainop.rules.yaml").write_text(text.replace(original, mutant, 1))
    for path in RULE_TESTS:
        shutil.copy(path, tmp_path / "prometheus" / "tests" / path.name)
    tests = sorted((tmp_path / "prometheus" / "tests").glob("*.test.yaml"))
    result = run_promtool(promtool, "test", "rules", *map(str, tests))
    assert result.returncode != 0, f"promtool tests still pass with {original!r} -> {mutant!r}"


def test_every_required_alert_exists() -> None:
    names = {rule["alert"] for rule in _alert_rules()}
    assert names >= REQUIRED_ALERTS, f"missing: {sorted(REQUIRED_ALERTS - names)}"


def test_every_alert_has_severity_summary_description_and_runbook_section() -> None:
    doc = MONITORING_DOC.read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", doc, re.M)
    }
    for rule in _alert_rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        runbook = rule["annotations"]["runbook"]
        assert runbook == f"docs/monitoring.md#{name.lower()}", name
        assert name.lower() in anchors, f"docs/monitoring.md has no section '{name}'"


def test_every_alert_rule_fires_in_a_unit_test_and_stays_quiet_in_another() -> None:
    cases = _alert_cases()
    for rule in _alert_rules():
        name = rule["alert"]
        rule_labels = rule["labels"].items()
        firing = [
            expected
            for alertname, alerts in cases
            if alertname == name
            for expected in alerts
            if rule_labels <= expected["exp_labels"].items()
        ]
        assert firing, f"no promtool case where {name} {dict(rule_labels)} fires"
        assert any(alertname == name and not alerts for alertname, alerts in cases), (
            f"no quiet case for {name}"
        )
