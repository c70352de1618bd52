"""tests/cost.py: the machine's busy time read from /proc/stat, and the table of the costliest tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import cost

STAT = """cpu  100 20 30 1000 50 5 5 7 0 0
cpu0 50 10 15 500 25 2 3 4 0 0
intr 12345
"""


def test_busy_time_counts_user_nice_system_irq_softirq_and_not_idle_iowait_or_steal() -> None:
    assert cost.busy_seconds(STAT, 100.0) == pytest.approx((100 + 20 + 30 + 5 + 5) / 100.0)


def test_a_stat_text_without_the_aggregate_line_is_refused() -> None:
    with pytest.raises(ValueError, match="aggregate 'cpu' line"):
        cost.busy_seconds("cpu0 1 2 3 4\n", 100.0)


def test_the_machine_busy_time_moves_forward_while_this_process_burns_cpu() -> None:
    before = cost.machine_busy_s()
    assert before is not None  # Linux: /proc/stat is there
    total = 0
    for i in range(3_000_000):
        total += i
    after = cost.machine_busy_s()
    assert after is not None and after > before, (before, after, total)


def test_the_table_ranks_by_cpu_counts_the_totals_and_names_the_lane() -> None:
    costs = [
        cost.Cost("tests/a.py::test_cheap", "unit", 1.0, 0.5),
        cost.Cost("e2e/b.py::test_dear", "e2e", 100.0, 180.0),
        cost.Cost("tests/c.py::test_middle", "ray", 30.0, 40.0),
    ]
    lines = cost.table(costs, lane="unit", top=2)
    assert lines[0].startswith("lane unit:")
    assert lines[1] == "3 tests: 131 s, 220 CPU-s of the machine (1.68 cores)"
    assert [line.split()[-1] for line in lines[3:]] == ["e2e/b.py::test_dear", "tests/c.py::test_middle"]


def test_without_cpu_readings_the_table_ranks_by_wall_time_and_says_so() -> None:
    costs = [cost.Cost("t::a", "unit", 2.0, None), cost.Cost("t::b", "unit", 5.0, None)]
    lines = cost.table(costs, lane=None)
    assert lines[0] == "2 tests: 7 s (the machine's CPU could not be read here)"
    assert [line.split()[-1] for line in lines[2:]] == ["t::b", "t::a"]
    assert cost.table([], lane=None) == []


def test_costs_are_written_beside_the_tier_summary() -> None:
    assert cost.cost_path(Path("out/test-tiers.json")) == Path("out/test-tiers-cost.json")
    assert cost.as_json([cost.Cost("t::a", "unit", 2.0, 1.5)]) == [
        {"nodeid": "t::a", "tier": "unit", "wall_s": 2.0, "cpu_s": 1.5}
    ]
