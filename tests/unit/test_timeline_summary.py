"""bench/gpu/timeline_summary.py: the slow steps of a step timeline and the rank and part they came from.

Hand-made timelines of two ranks (the lines ``bench_hooks.Timeline`` writes) with one known sag; nothing else
is needed.
"""

from __future__ import annotations

import json
import pathlib
from types import ModuleType
from typing import Any

import bench_scripts


def load() -> ModuleType:
    return bench_scripts.load("timeline_summary.py", "timeline_summary")


def row(
    step: int,
    *,
    data: float = 1.0,
    lead: float = 20.0,
    period: float = 40.0,
    wait: float = 0.0,
    steal: float = 0.0,
) -> dict[str, Any]:
    parts = {"data": data, "forward_backward": 30.0, "optimizer": 5.0, "metrics": 0.1, "control": 0.2}
    return {
        "step": step,
        "wall": 1000.0 + step,
        "host_ms": period,
        "sections_ms": parts,
        "gc_ms": 0.0,
        "gc_count": 0,
        "thread_cpu_ms": 30.0,
        "process_cpu_ms": 40.0,
        "voluntary_switches": 10,
        "involuntary_switches": 0,
        "device_ms": period,
        "lead_ms": lead,
        "threads": {
            "main": {"run_ms": 20.0, "wait_ms": 0.0, "slices": 9, "cpu": 3, "steal_ms": 0.0},
            "autograd": {
                "run_ms": 25.0,
                "wait_ms": wait,
                "slices": 4,
                "cpu": 5 if wait else 4,
                "steal_ms": steal,
            },
        },
        "steal_ms": steal,
    }


def write(directory: pathlib.Path, rank: int, rows: list[dict[str, Any]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    head = {"rank": rank, "world_size": 2, "start": 0, "steps": len(rows), "facts": {}}
    text = "\n".join(json.dumps(line) for line in [head, *rows]) + "\n"
    (directory / f"rank{rank}.timeline.jsonl").write_text(text)


def test_a_sag_in_one_ranks_loader_is_found_and_named(tmp_path: pathlib.Path, capsys: Any) -> None:
    """Steps 10-12 take 60 ms instead of 40 on both ranks (the all-reduce makes every rank's device wait);
    rank 1's host was behind (lead near 0) and its ``next()`` took 21 ms instead of 1."""
    sag = {10, 11, 12}
    rank0 = [row(s, period=60.0 if s in sag else 40.0) for s in range(1, 41)]
    rank1 = [
        # rank 1's host fell behind; its autograd thread waited 2 ms for a CPU, on another CPU than before
        row(s, data=21.0, lead=0.3, period=60.0, wait=2.0, steal=10.0) if s in sag else row(s)
        for s in range(1, 41)
    ]
    write(tmp_path / "run", 0, rank0)
    write(tmp_path / "run", 1, rank1)
    module = load()

    summary = module.summarise(module.load(tmp_path / "run"), slow=0.10)
    assert summary["steps"] == 40 and summary["slow_steps"] == 3
    assert summary["median_period_ms"] == 40.0 and summary["lost_ms"] == 60.0
    (episode,) = summary["episodes"]
    assert (episode["first"], episode["last"], episode["culprit"]) == (10, 12, 1)
    assert episode["behind"] == {1: 3}
    top = max(episode["culprit_excess"], key=lambda k: episode["culprit_excess"][k])
    assert top in ("data_ms", "host_ms") and episode["culprit_excess"]["data_ms"] == 60.0
    assert episode["culprit_excess"]["other_ms"] == 0.0  # the step's time outside the parts did not grow
    assert summary["per_rank"][1]["data_ms"] == {"normal": 1.0, "slow": 21.0}
    assert summary["per_rank"][0]["data_ms"] == {"normal": 1.0, "slow": 1.0}
    assert summary["per_rank"][1]["autograd_wait_ms"] == {"normal": 0.0, "slow": 2.0}
    assert episode["culprit_excess"]["autograd_wait_ms"] == 6.0
    # It moved to CPU 5 at step 10 and stayed there, then back at step 13 (a normal step).
    assert episode["culprit_excess"]["autograd_moved"] == 1
    assert summary["per_rank"][1]["autograd_moved"]["normal"] == 1 / 37
    assert summary["per_rank"][0]["main_run_ms"] == {"normal": 20.0, "slow": 20.0}
    # The hypervisor took a tick from rank 1's autograd thread's CPU in each slow step.
    assert summary["per_rank"][1]["autograd_steal_ms"] == {"normal": 0.0, "slow": 10.0}
    assert summary["per_rank"][1]["steal_ms"] == {"normal": 0.0, "slow": 10.0}
    assert episode["culprit_excess"]["steal_ms"] == 30.0

    assert module.main([str(tmp_path / "run"), "--json", str(tmp_path / "s.json")]) == 0
    text = capsys.readouterr().out
    assert "3 steps over +10 %, which lost 60 ms of 1660 (3.6 %)" in text
    assert "| 10-12 | 3 | 60.0 | 1: 3 |" in text
    assert json.loads((tmp_path / "s.json").read_text())[str(tmp_path / "run")]["slow_steps"] == 3


def test_steps_that_both_ranks_did_not_record_are_left_out(tmp_path: pathlib.Path) -> None:
    write(tmp_path / "run", 0, [row(s) for s in range(1, 11)])
    write(tmp_path / "run", 1, [row(s) for s in range(1, 8)])  # this rank's window ended with training
    module = load()
    summary = module.summarise(module.load(tmp_path / "run"), slow=0.10)
    assert summary["steps"] == 7 and summary["slow_steps"] == 0 and summary["episodes"] == []
