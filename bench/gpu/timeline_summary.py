"""The Trainer's step timelines (``TRAINOP_TIMELINE_STEPS``, issue #21): what grew in the slow steps.

Each run directory holds ``rank<r>.timeline.jsonl`` from every rank (``bench_hooks.Timeline``): one line per
step with the host's time for the step and for each part of the loop, garbage collection, the training
thread's CPU time and context switches, the process's CPU time, and on GPUs the device's time for the step
and the host's lead over the device. Here:

- a step's **period** is rank 0's device time for it (the host's, on the CPU); a step is **slow** when its
  period exceeds the median by more than ``--slow`` (default 10 %);
- threads (the training thread ``main``, the autograd engine's ``autograd``, the pin-memory thread ``pin``):
  ``_run_ms`` on a CPU, ``_wait_ms`` ready but waiting for one, ``_moved`` 1 when it ran on another CPU
  than at the step before; ``_steal_ms`` the hypervisor's steal time on the CPU it last ran on, and
  ``steal_ms`` over every CPU (a virtual machine's CPU time taken by its host; 10 ms ticks);
- per rank, each column's mean over the normal steps and over the slow ones: the column that grows on one
  rank and not on the others is where the slow steps' time went;
- **episodes**: runs of slow steps (gaps of up to 2 normal steps joined); for each, the rank whose host was
  behind (the smallest lead over its device: its device waited for it, the other ranks' devices waited in the
  all-reduce) and its columns against its own medians.

    python3 bench/gpu/timeline_summary.py DIR [DIR ...] [--slow 0.10] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
from typing import Any

PARTS = ("data", "forward_backward", "optimizer", "metrics", "control", "report")
COUNTERS = ("gc_ms", "thread_cpu_ms", "process_cpu_ms", "voluntary_switches", "involuntary_switches")


def load(directory: pathlib.Path) -> dict[int, list[dict[str, Any]]]:
    """Every rank's rows, by rank; each row flattened (``data_ms``, ... and ``other_ms``: the step's host time
    outside the marked parts)."""
    ranks: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(directory.glob("rank*.timeline.jsonl")):
        lines = path.read_text().splitlines()
        if not lines:
            continue
        head = json.loads(lines[0])
        rows = []
        for line in lines[1:]:
            row = json.loads(line)
            parts = row.pop("sections_ms")
            for part in PARTS:
                row[f"{part}_ms"] = parts.get(part, 0.0)
            row["other_ms"] = row["host_ms"] - sum(parts.values())
            for name, thread in sorted(row.pop("threads", {}).items()):
                row[f"{name}_run_ms"] = thread["run_ms"]  # on a CPU
                row[f"{name}_wait_ms"] = thread["wait_ms"]  # ready, waiting for a CPU
                if "steal_ms" in thread:  # the hypervisor's, on the CPU it last ran on
                    row[f"{name}_steal_ms"] = thread["steal_ms"]
                row[f"{name}_moved"] = int(bool(rows) and rows[-1].get(f"{name}_cpu") != thread["cpu"])
                row[f"{name}_cpu"] = thread["cpu"]
            rows.append(row)
        ranks[int(head["rank"])] = rows
    if not ranks:
        raise SystemExit(
            f"{directory}: no rank*.timeline.jsonl (set TRAINOP_TIMELINE_STEPS and TRAINOP_TIMELINE_DIR)"
        )
    return ranks


def columns(rows: list[dict[str, Any]]) -> list[str]:
    names = ["host_ms", *(f"{p}_ms" for p in PARTS), "other_ms", *COUNTERS]
    if rows:  # the scheduler's account of each thread the timeline followed
        names += [k for k in rows[0] if k.endswith(("_run_ms", "_wait_ms", "_steal_ms", "_moved"))]
        if rows[0].get("steal_ms") is not None:
            names.append("steal_ms")
    if rows and "lead_ms" in rows[0]:
        names[1:1] = ["device_ms", "lead_ms"]
    return names


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def summarise(ranks: dict[int, list[dict[str, Any]]], *, slow: float) -> dict[str, Any]:
    steps = sorted(set.intersection(*({row["step"] for row in rows} for rows in ranks.values())))
    by_rank = {rank: {row["step"]: row for row in rows} for rank, rows in ranks.items()}
    reference = by_rank[min(by_rank)]
    key = "device_ms" if "device_ms" in reference[steps[0]] else "host_ms"
    period = {step: reference[step][key] for step in steps}
    median = statistics.median(period.values())
    slow_steps = [step for step in steps if period[step] > (1 + slow) * median]
    slow_set = set(slow_steps)
    names = columns(list(reference.values()))
    per_rank = {}
    for rank, rows in sorted(by_rank.items()):
        normal = [rows[s] for s in steps if s not in slow_set]
        hit = [rows[s] for s in slow_steps]
        per_rank[rank] = {
            name: {"normal": mean([r[name] for r in normal]), "slow": mean([r[name] for r in hit])}
            for name in names
        }
    medians = {
        rank: {name: statistics.median(rows[s][name] for s in steps) for name in names}
        for rank, rows in by_rank.items()
    }
    episodes: list[list[int]] = []
    for step in slow_steps:
        if episodes and step - episodes[-1][-1] <= 3:
            episodes[-1].append(step)
        else:
            episodes.append([step])
    described = []
    for episode in episodes:
        span = [s for s in steps if episode[0] <= s <= episode[-1]]
        lost = sum(period[s] - median for s in span)
        behind: dict[int, int] = {}
        for s in span:
            if "lead_ms" in names:
                rank = min(by_rank, key=lambda r: by_rank[r][s]["lead_ms"])
                behind[rank] = behind.get(rank, 0) + 1
        culprit = max(behind, key=lambda r: behind[r]) if behind else None
        excess = {}
        if culprit is not None:
            rows = by_rank[culprit]
            excess = {
                name: sum(rows[s][name] - medians[culprit][name] for s in span)
                for name in names
                if name not in ("device_ms", "lead_ms")
            }
        described.append(
            {
                "first": episode[0],
                "last": episode[-1],
                "slow_steps": len(episode),
                "lost_ms": lost,
                "behind": behind,
                "culprit": culprit,
                "culprit_excess": excess,
            }
        )
    return {
        "period_key": key,
        "steps": len(steps),
        "median_period_ms": median,
        "slow_steps": len(slow_steps),
        "lost_ms": sum(period[s] - median for s in slow_steps),
        "total_ms": sum(period.values()),
        "per_rank": per_rank,
        "medians": medians,
        "episodes": described,
    }


def render(name: str, summary: dict[str, Any], *, slow: float) -> str:
    out = [
        f"### {name}",
        "",
        f"{summary['steps']} steps; median period ({summary['period_key']}) "
        f"{summary['median_period_ms']:.2f} ms; "
        f"{summary['slow_steps']} steps over +{100 * slow:.0f} %, which lost {summary['lost_ms']:.0f} ms of "
        f"{summary['total_ms']:.0f} ({100 * summary['lost_ms'] / summary['total_ms']:.1f} %).",
        "",
    ]
    ranks = sorted(summary["per_rank"])
    names = list(summary["per_rank"][ranks[0]])
    out.append("| column | " + " | ".join(f"rank {r} normal | rank {r} slow" for r in ranks) + " |")
    out.append("| --- |" + " ---: | ---: |" * len(ranks))
    for column in names:
        cells = []
        for r in ranks:
            v = summary["per_rank"][r][column]
            cells += [f"{v['normal']:.2f}", f"{v['slow']:.2f}"]
        out.append(f"| {column} | " + " | ".join(cells) + " |")
    out.append("")
    episodes = sorted(summary["episodes"], key=lambda e: -e["lost_ms"])[:15]
    if episodes:
        out.append(
            "Episodes (the 15 costliest): the rank whose host was behind, and its columns' excess over its"
        )
        out.append("own medians, summed over the episode's steps (ms; switches as counts).")
        out.append("")
        out.append("| steps | slow | lost ms | behind (rank: steps) | culprit's largest excesses |")
        out.append("| --- | ---: | ---: | --- | --- |")
        for e in episodes:
            top = sorted(e["culprit_excess"].items(), key=lambda kv: -kv[1])[:4]
            tops = ", ".join(f"{k} {v:+.1f}" for k, v in top)
            behind = ", ".join(f"{r}: {n}" for r, n in sorted(e["behind"].items()))
            out.append(
                f"| {e['first']}-{e['last']} | {e['slow_steps']} | {e['lost_ms']:.1f} | {behind} | {tops} |"
            )
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dirs", nargs="+", type=pathlib.Path, help="directories of rank*.timeline.jsonl")
    parser.add_argument(
        "--slow", type=float, default=0.10, help="a slow step's excess over the median period"
    )
    parser.add_argument("--json", type=pathlib.Path, help="write every summary here as JSON")
    args = parser.parse_args(argv)
    results = {}
    for directory in args.dirs:
        summary = summarise(load(directory), slow=args.slow)
        results[str(directory)] = summary
        print(render(str(directory), summary, slow=args.slow))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
