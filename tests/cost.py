"""What each test cost the machine: wall time and CPU time of the whole machine while it ran (issue #14).

``make test`` is CPU-bound on a 2-core box (docs/reliability.md, "CI"): its time is set by the CPU the tests
burn, most of it in processes that are not pytest's children in any simple way (Ray's daemons and workers,
the node agent's pods, the control plane). So a test's cost is read from ``/proc/stat``: the machine's busy
time (user, nice, system, irq, softirq; not idle, iowait or steal) from the start of its setup to the end of
its teardown. Nothing else should run beside ``make test``; while both lanes of ``make test`` run
(tests/lanes.py), each lane's numbers include the other lane's work, and its table says so.

The tier plugin (tests/tiers.py) records every test, writes them as JSON beside the tier summary
(``<summary>-cost.json``) and prints the costliest at the end of the run.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

#: Rows of the table printed at the end of a run.
TOP = 15
_BUSY_FIELDS = (0, 1, 2, 5, 6)  # user, nice, system, irq, softirq (idle 3, iowait 4, steal 7 are not)


def busy_seconds(stat_text: str, ticks_per_s: float) -> float:
    """The machine's busy CPU time in seconds from the text of ``/proc/stat`` (its aggregate ``cpu`` line)."""
    for line in stat_text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [int(value) for value in fields[1:]]
            return sum(values[i] for i in _BUSY_FIELDS if i < len(values)) / ticks_per_s
    raise ValueError("/proc/stat has no aggregate 'cpu' line")


def machine_busy_s() -> float | None:
    """The machine's busy CPU seconds so far, or None where ``/proc/stat`` cannot be read (not Linux)."""
    try:
        text = Path("/proc/stat").read_text()
        return busy_seconds(text, float(os.sysconf("SC_CLK_TCK")))
    except (OSError, ValueError):
        return None


@dataclasses.dataclass(frozen=True)
class Cost:
    nodeid: str
    tier: str
    wall_s: float
    cpu_s: float | None  # the machine's busy CPU seconds over the test, or None (not measurable here)


def table(costs: list[Cost], *, lane: str | None, top: int = TOP) -> list[str]:
    """The costliest tests by machine CPU (by wall time where CPU was not measured), with the totals."""
    if not costs:
        return []
    measured = [cost for cost in costs if cost.cpu_s is not None]
    ranked = sorted(costs, key=lambda cost: (cost.cpu_s or 0.0, cost.wall_s), reverse=True)[:top]
    lines = []
    if lane:
        lines.append(f"lane {lane}: the machine's CPU includes what the other lane ran at the same time")
    wall = sum(cost.wall_s for cost in costs)
    if measured:
        cpu = sum(cost.cpu_s or 0.0 for cost in measured)
        cores = cpu / max(wall, 1e-9)
        lines.append(f"{len(costs)} tests: {wall:.0f} s, {cpu:.0f} CPU-s of the machine ({cores:.2f} cores)")
    else:
        lines.append(f"{len(costs)} tests: {wall:.0f} s (the machine's CPU could not be read here)")
    lines.append(f"{'CPU-s':>8} {'wall s':>8}  tier          test")
    for cost in ranked:
        cpu_text = f"{cost.cpu_s:8.1f}" if cost.cpu_s is not None else f"{'-':>8}"
        lines.append(f"{cpu_text} {cost.wall_s:8.1f}  {cost.tier:<12}  {cost.nodeid}")
    return lines


def as_json(costs: list[Cost]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(cost) for cost in costs]


def cost_path(summary_path: Path) -> Path:
    """Where a run's costs go: beside its tier summary (``test-tiers-cost.json`` for ``test-tiers.json``)."""
    return summary_path.with_name(f"{summary_path.stem}-cost.json")
