"""docs/install.md's values table is the chart's values: every value documented once, with its real
default; nothing documented that the chart does not have."""

from __future__ import annotations

from typing import Any

import yaml

from .conftest import CHART_DIR, REPO_ROOT

INSTALL_DOC = REPO_ROOT / "docs" / "install.md"


def _table() -> dict[str, str]:
    text = INSTALL_DOC.read_text()
    table = text.split("<!-- values-table:start -->", 1)[1].split("<!-- values-table:end -->", 1)[0]
    rows: dict[str, str] = {}
    for line in table.strip().splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        key, default = cells[0].strip("`"), cells[1].strip("`")
        assert key not in rows, f"{key} documented twice"
        rows[key] = default
    return rows


def _leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            found.update(_leaves(value, f"{prefix}{key}."))
        else:
            found[f"{prefix}{key}"] = value
    return found


def _lookup(tree: dict[str, Any], dotted: str) -> Any:
    # Keys may contain dots only at the leaf level we document (none today); walk segment by segment.
    node: Any = tree
    for part in dotted.split("."):
        node = node[part]
    return node


def test_every_value_is_documented_exactly_once() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    rows = _table()
    for leaf in _leaves(values):
        covering = [key for key in rows if leaf == key or leaf.startswith(f"{key}.")]
        assert len(covering) == 1, f"{leaf} is documented by {covering or 'no row'} in docs/install.md"


def test_documented_defaults_are_the_real_defaults() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    for key, default in _table().items():
        try:
            actual = _lookup(values, key)
        except (KeyError, TypeError):
            raise AssertionError(
                f"docs/install.md documents {key}, which values.yaml does not have"
            ) from None
        assert yaml.safe_load(default) == actual or (default == "" and actual == ""), (
            f"{key}: documented default {default!r}, actual {actual!r}"
        )
