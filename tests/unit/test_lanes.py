"""``make test``'s lanes (tests/lanes.py): every test runs in exactly one, and the merged summary is
judged by CI's gate as a single run's would be."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from _pytest.mark.expression import Expression

from tests import lanes, tier_gate

MARKERS = ("controlplane", "ray", "e2e", "nodeagent", "gpu", "slow")


@pytest.mark.parametrize(
    "present",
    [set(c) for n in range(len(MARKERS) + 1) for c in itertools.combinations(MARKERS, n)],
    ids=lambda present: "+".join(sorted(present)) or "none",
)
def test_every_combination_of_markers_runs_in_exactly_one_lane(present: set[str]) -> None:
    matching = [
        lane.name
        for lane in lanes.LANES
        if Expression.compile(lane.marker).evaluate(lambda m, **_: m in present)
    ]
    assert len(matching) == 1, (present, matching)


def summary(
    tiers: dict[str, dict[str, int]], deselected: list[str], *, exitstatus: int = 0
) -> dict[str, Any]:
    return {
        "version": tier_gate.SUMMARY_VERSION,
        "ci": True,
        "args": [],
        "started": 100.0,
        "finished": 200.0,
        "exitstatus": exitstatus,
        "tiers": tiers,
        "skipped": [],
        "deselected": [{"nodeid": nodeid, "tier": nodeid.split("/")[0]} for nodeid in deselected],
    }


def test_the_merge_adds_outcomes_and_counts_as_deselected_only_what_no_lane_ran() -> None:
    cluster = summary(
        {"e2e": {"passed": 3, "deselected": 1}, "unit": {"deselected": 2}},
        ["unit/a", "unit/b", "e2e/user-k"],
    )
    unit = summary(
        {"e2e": {"deselected": 4}, "unit": {"passed": 2}},
        ["e2e/x", "e2e/y", "e2e/z", "e2e/user-k"],
    )
    merged = lanes.merge([cluster, unit])
    assert merged["tiers"] == {"e2e": {"passed": 3, "deselected": 1}, "unit": {"passed": 2}}
    assert [d["nodeid"] for d in merged["deselected"]] == ["e2e/user-k"]
    assert merged["exitstatus"] == 0
    assert "tier e2e: 1 test(s) deselected" in " ".join(tier_gate.check(merged))


def test_a_failing_lane_fails_the_merge_and_an_empty_lane_does_not() -> None:
    passed = summary({"unit": {"passed": 1}}, [])
    empty = summary({}, [], exitstatus=lanes.NO_TESTS)
    assert lanes.merge([passed, empty])["exitstatus"] == 0
    assert lanes.merge([empty, summary({"unit": {"failed": 1}}, [], exitstatus=1)])["exitstatus"] == 1
    assert lanes.merge([empty, empty])["exitstatus"] == lanes.NO_TESTS


def test_ci_refuses_a_merged_run_in_which_a_tier_ran_in_neither_lane() -> None:
    ran = {tier: {"passed": 1} for tier in tier_gate.REQUIRED_TIERS if tier != "nodeagent"}
    merged = lanes.merge([summary(ran, []), summary({}, [], exitstatus=lanes.NO_TESTS)])
    assert tier_gate.check(merged) == [
        "tier nodeagent: no test passed (none collected): it did not run, which CI does not accept"
    ]


def test_the_merge_names_each_lane() -> None:
    names = [lane.name for lane in lanes.LANES]
    merged = lanes.merge([summary({"unit": {"passed": 1}}, []) for _ in names])
    assert list(merged["lanes"]) == names


def test_a_background_lanes_progress_line_is_the_last_line_of_its_log(tmp_path: Any) -> None:
    log = tmp_path / "lane.log"
    assert lanes._last_line(log) == "(no log yet)"
    log.write_text("")
    assert lanes._last_line(log) == "(no output yet)"
    log.write_text("x" * 10_000 + "\ne2e/test_failures.py ..\n\n")
    assert lanes._last_line(log) == "e2e/test_failures.py .."
