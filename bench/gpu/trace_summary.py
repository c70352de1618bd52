"""Where a training step's time goes, from torch.profiler traces: bare DDP against the trainer (issue #21).

    python3 bench/gpu/trace_summary.py --run bare=DIR --run trainer=DIR [--json out.json] [--text out.md]

Each DIR holds ``rank<r>.trace.json.gz`` (Chrome traces: ``bare_ddp.py --trace-steps``, or the trainer's
``TRAINOP_TRACE_STEPS`` window, ``trainop_trainer.bench_hooks``) and ``rank<r>.env.json``. Every profiled step
is a CPU range ``bare.step#N`` / ``trainop.step#N`` on the loop's thread. Per rank:

- **GPU, per step**: the *training stream* is the stream with the most kernel time, NCCL's kernels not
  counted (they spin while waiting for the peers: with a compiled model the NCCL stream can have the most).
  Step i's GPU span starts at the first training-stream kernel launched during step i; the period is the
  distance to the next step's start (n steps give n-1 periods). Each period splits into four parts that add
  up: ``train_stream_busy`` (kernels on the training stream), ``nccl_exposed`` (NCCL kernels running while the
  training stream is idle: communication not hidden), ``other_exposed`` (copies and kernels of other
  streams while both are idle: the input copy and normalisation), ``idle`` (nothing on the GPU: it waits
  for the host). Also: NCCL kernel time, other-stream kernel time, copies by direction, kernels per step,
  the idle gaps (count, time, the longest with what the loop's thread was doing then), and the host's
  lead: how long a training-stream kernel waited between its launch and its start (near zero: the GPU
  was waiting for the launch).
- **host, per step**: the loop's step time; the time in each ``trainop.*`` / ``bare.*`` section and in
  PyTorch's own ranges (the DataLoader's ``__next__``, ``Optimizer.step``, DDP's ``forward``); calls that
  block the thread or the device (stream/device/event synchronisations, ``aten::item``, synchronous copies,
  host/device allocations) and collectives on CPU (gloo) and GPU (NCCL) by count.

The text puts the runs side by side (mean over ranks) with the difference, and lists where facts of the
processes differ (threads, CUDA_VISIBLE_DEVICES, NCCL/OMP variables). Only the standard library is used.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import itertools
import json
import pathlib
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

STEP = re.compile(r"^(?:bare|trainop)\.step#(\d+)$")
SECTION = re.compile(r"^(?:bare|trainop)\.(?!step#)([\w.]+)$")
TORCH_RANGES = {
    "data loader __next__": re.compile(r"^enumerate\(DataLoader\)#.*__next__$"),
    "Optimizer.step": re.compile(r"^Optimizer\.step#"),
    "Optimizer.zero_grad": re.compile(r"^Optimizer\.zero_grad#"),
    "DDP.forward": re.compile(r"^DistributedDataParallel\.forward$"),
}
BLOCKING = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "cudaHostAlloc",
    "cudaMallocHost",
    "cudaFreeHost",
    "cudaHostRegister",
    "cudaMalloc",
    "cudaFree",
    "aten::_local_scalar_dense",
    "aten::item",
)
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
GAP_MIN_US = 10.0
Interval = tuple[float, float]


# ------------------------------------------------------------------------------------------ intervals
def merge(intervals: Iterable[Interval]) -> list[Interval]:
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def clip(merged: list[Interval], window: Interval) -> list[Interval]:
    lo, hi = window
    return [(max(a, lo), min(b, hi)) for a, b in merged if b > lo and a < hi]


def measure(merged: list[Interval]) -> float:
    return sum(b - a for a, b in merged)


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Merged ``a`` minus merged ``b``."""
    out: list[Interval] = []
    j = 0
    for start, end in a:
        cur = start
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < end:
            out.append((cur, end))
    return out


def gaps(merged: list[Interval], window: Interval) -> list[Interval]:
    return subtract([window], merged)


# -------------------------------------------------------------------------------------------- loading
def load_events(path: pathlib.Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]


def is_nccl(name: str) -> bool:
    return name.startswith("nccl")  # ncclDevKernel_AllReduce_..., ncclKernel_...


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ------------------------------------------------------------------------------------------- analysis
def summarize_rank(events: list[dict[str, Any]]) -> dict[str, Any]:
    steps = sorted(
        (e for e in events if e.get("cat") == "user_annotation" and STEP.match(e["name"])),
        key=lambda e: float(e["ts"]),
    )
    if len(steps) < 2:
        return {"error": f"{len(steps)} step ranges in the trace (need 2 or more)"}
    loop_tid = steps[0]["tid"]
    loop_pid = steps[0]["pid"]
    n = len(steps)
    step_starts = [float(s["ts"]) for s in steps]
    host_end = float(steps[-1]["ts"]) + float(steps[-1]["dur"])

    def step_of(ts: float) -> int | None:
        i = bisect.bisect_right(step_starts, ts) - 1
        if i < 0 or ts > host_end:
            return None
        return i

    launches: dict[Any, dict[str, Any]] = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launches[corr] = e
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    kernels = [e for e in gpu if e.get("cat") == "kernel"]
    # Kernel time per stream, NCCL's kernels apart (they spin while they wait for the peers).
    stream_time: dict[Any, float] = defaultdict(float)
    nccl_stream_time: dict[Any, float] = defaultdict(float)
    for k in kernels:
        stream = (k.get("args") or {}).get("stream", k.get("tid"))
        (nccl_stream_time if is_nccl(str(k.get("name", ""))) else stream_time)[stream] += float(k["dur"])
    result: dict[str, Any] = {"steps": n, "loop_thread": loop_tid}

    # ---- host side
    host_steps = [float(s["dur"]) for s in steps]
    result["host_step_ms"] = statistics.mean(host_steps) / 1e3
    sections: dict[str, float] = defaultdict(float)
    blocking: dict[str, list[float]] = defaultdict(list)
    collectives: dict[str, int] = defaultdict(int)
    t0, t1 = step_starts[0], host_end
    for e in events:
        ts = float(e["ts"])
        if ts < t0 or ts > t1:
            continue
        name = str(e.get("name", ""))
        cat = e.get("cat")
        on_loop = e.get("tid") == loop_tid and e.get("pid") == loop_pid
        if cat == "user_annotation" and on_loop:
            m = SECTION.match(name)
            if m:
                sections[m.group(1)] += float(e["dur"])
            for label, pattern in TORCH_RANGES.items():
                if pattern.match(name):
                    sections[label] += float(e["dur"])
        if name in BLOCKING and cat in ("cuda_runtime", "cuda_driver", "cpu_op"):
            where = "loop" if on_loop else "other threads"
            blocking[f"{name} ({where})"].append(float(e["dur"]))
        if cat in ("cpu_op", "user_annotation") and (name.startswith(("gloo:", "nccl:")) or "c10d::" in name):
            collectives[name] += 1
    result["host_sections_ms"] = {k: v / n / 1e3 for k, v in sorted(sections.items())}
    result["blocking_per_step"] = {
        k: {"count": len(v) / n, "ms": sum(v) / n / 1e3, "max_ms": max(v) / 1e3}
        for k, v in sorted(blocking.items())
    }
    result["collectives_per_step"] = {k: v / n for k, v in sorted(collectives.items())}

    # ---- GPU side
    if not kernels:
        result["gpu"] = None
        return result
    busiest = stream_time or nccl_stream_time  # only NCCL kernels: the stream with the most of them
    train_stream = max(busiest, key=lambda s: busiest[s])

    def stream_of(e: dict[str, Any]) -> Any:
        return (e.get("args") or {}).get("stream", e.get("tid"))

    firsts: dict[int, float] = {}
    leads: list[float] = []
    per_step_kernels: dict[int, int] = defaultdict(int)
    for k in kernels:
        launch = launches.get((k.get("args") or {}).get("correlation"))
        if launch is None:
            continue
        i = step_of(float(launch["ts"]))
        if i is None:
            continue
        per_step_kernels[i] += 1
        if stream_of(k) == train_stream:
            start = float(k["ts"])
            firsts[i] = min(firsts.get(i, start), start)
            leads.append(start - float(launch["ts"]))
    starts = [firsts[i] for i in range(n) if i in firsts]
    if len(starts) < 2:
        result["gpu"] = {"error": "fewer than two steps with training-stream kernels"}
        return result
    window = (starts[0], starts[-1])
    periods = [b - a for a, b in itertools.pairwise(starts)]
    span = window[1] - window[0]
    count = len(periods)

    def union(selected: Iterable[dict[str, Any]]) -> list[Interval]:
        return clip(merge((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in selected), window)

    train = union(k for k in kernels if stream_of(k) == train_stream)
    nccl = union(k for k in kernels if is_nccl(str(k["name"])))
    other = union(e for e in gpu if stream_of(e) != train_stream and not is_nccl(str(e.get("name", ""))))
    everything = union(gpu)
    nccl_exposed = subtract(nccl, train)
    other_exposed = subtract(subtract(other, train), nccl)
    idle = gaps(everything, window)
    copies: dict[str, float] = defaultdict(float)
    for e in gpu:
        if e.get("cat") == "gpu_memcpy":
            lo, hi = max(float(e["ts"]), window[0]), min(float(e["ts"]) + float(e["dur"]), window[1])
            if hi > lo:
                copies[str(e["name"]).split(" (")[0]] += hi - lo
    long_gaps = [g for g in idle if g[1] - g[0] >= GAP_MIN_US]
    loop_events = [
        e
        for e in events
        if e.get("tid") == loop_tid
        and e.get("pid") == loop_pid
        and e.get("cat") in ("user_annotation", "cpu_op", "cuda_runtime")
        and not STEP.match(str(e.get("name", "")))
    ]

    def doing(at: float) -> str:
        inside = [e for e in loop_events if float(e["ts"]) <= at <= float(e["ts"]) + float(e["dur"])]
        annotations = [e for e in inside if e.get("cat") == "user_annotation"]
        ops = [e for e in inside if e.get("cat") != "user_annotation"]
        parts = []
        if annotations:
            parts.append(min(annotations, key=lambda e: float(e["dur"]))["name"])
        if ops:
            parts.append(min(ops, key=lambda e: float(e["dur"]))["name"])
        return " / ".join(parts) or "(outside any range)"

    top = sorted(long_gaps, key=lambda g: g[0] - g[1])[:6]
    result["gpu"] = {
        "train_stream": train_stream,
        "period_ms": span / count / 1e3,
        "periods_ms": [round(p / 1e3, 3) for p in periods],
        "train_stream_busy_ms": measure(train) / count / 1e3,
        "nccl_exposed_ms": measure(nccl_exposed) / count / 1e3,
        "other_exposed_ms": measure(other_exposed) / count / 1e3,
        "idle_ms": measure(idle) / count / 1e3,
        "nccl_kernel_ms": measure(nccl) / count / 1e3,
        "other_stream_ms": measure(other) / count / 1e3,
        "copies_ms": {k: v / count / 1e3 for k, v in sorted(copies.items())},
        "kernels_per_step": statistics.mean(per_step_kernels[i] for i in range(n)),
        "gaps_per_step": len(long_gaps) / count,
        "gap_ms_per_step": measure(long_gaps) / count / 1e3,
        "longest_gaps": [
            {
                "ms": round((b - a) / 1e3, 3),
                "at_ms": round((a - window[0]) / 1e3, 2),
                "loop": doing((a + b) / 2),
            }
            for a, b in top
        ],
        "launch_lead_ms": {
            "median": pct(leads, 0.5) / 1e3,
            "p10": pct(leads, 0.1) / 1e3,
            "under_50us_pct": 100.0 * sum(1 for x in leads if x < 50.0) / max(1, len(leads)),
        },
    }
    return result


def mean_of(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Numeric fields averaged over ranks (nested dicts too); lists and strings from rank 0."""
    good = [r for r in ranks if "error" not in r]
    if not good:
        return {"error": "no usable rank"}

    def combine(values: list[Any]) -> Any:
        first = values[0]
        if isinstance(first, bool) or not isinstance(first, (int, float, dict)):
            return first
        if isinstance(first, dict):
            keys = sorted({k for v in values if isinstance(v, dict) for k in v})
            return {k: combine([v.get(k, 0.0) for v in values if isinstance(v, dict)]) for k in keys}
        return statistics.mean(float(v) for v in values if isinstance(v, (int, float)))

    return {k: combine([r.get(k) for r in good if r.get(k) is not None] or [None]) for k in good[0]}


def summarize_dir(directory: pathlib.Path) -> dict[str, Any]:
    ranks: list[dict[str, Any]] = []
    facts: list[dict[str, Any]] = []
    for path in sorted(
        directory.glob("rank*.trace.json*"), key=lambda p: int(re.sub(r"\D", "", p.name) or 0)
    ):
        summary = summarize_rank(load_events(path))
        summary["rank"] = int(re.sub(r"\D", "", path.name.split(".")[0]))
        ranks.append(summary)
        env = path.parent / f"rank{summary['rank']}.env.json"
        if env.is_file():
            facts.append(json.loads(env.read_text()))
    return {"dir": str(directory), "ranks": ranks, "mean": mean_of(ranks), "facts": facts}


# --------------------------------------------------------------------------------------------- output
ROWS = (
    ("GPU period per step (ms)", ("gpu", "period_ms")),
    ("  training stream busy", ("gpu", "train_stream_busy_ms")),
    ("  NCCL exposed (training stream idle)", ("gpu", "nccl_exposed_ms")),
    ("  other streams exposed (input copy/normalise)", ("gpu", "other_exposed_ms")),
    ("  GPU idle (waiting for the host)", ("gpu", "idle_ms")),
    ("NCCL kernel time", ("gpu", "nccl_kernel_ms")),
    ("other-stream time", ("gpu", "other_stream_ms")),
    ("idle gaps >= 10 us per step (count)", ("gpu", "gaps_per_step")),
    ("idle gap time per step", ("gpu", "gap_ms_per_step")),
    ("kernels per step (count)", ("gpu", "kernels_per_step")),
    ("launch lead, median (ms)", ("gpu", "launch_lead_ms", "median")),
    ("launch lead, p10 (ms)", ("gpu", "launch_lead_ms", "p10")),
    ("kernels started < 50 us after launch (%)", ("gpu", "launch_lead_ms", "under_50us_pct")),
    ("host: loop step time", ("host_step_ms",)),
)


def dig(data: Any, path: tuple[str, ...]) -> float | None:
    for key in path:
        if not isinstance(data, dict) or key not in data or data[key] is None:
            return None
        data = data[key]
    return float(data) if isinstance(data, (int, float)) else None


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render(runs: dict[str, dict[str, Any]]) -> str:
    labels = list(runs)
    means = {label: runs[label]["mean"] for label in labels}
    ranks = {label: len(runs[label]["ranks"]) for label in labels}
    steps = {label: means[label].get("steps") for label in labels}
    head = "| per step, mean over ranks | " + " | ".join(
        f"{label} ({ranks[label]} ranks, {steps[label]} steps)" for label in labels
    )
    delta = len(labels) == 2
    lines = [head + (" | difference |" if delta else " |"), "|" + " --- |" * (len(labels) + 1 + int(delta))]

    def row(title: str, values: list[float | None]) -> None:
        cells = [fmt(v) for v in values]
        if delta:
            a, b = values
            cells.append("-" if a is None or b is None else f"{b - a:+.3f}")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")

    for title, path in ROWS:
        row(title, [dig(means[label], path) for label in labels])
    keys: list[tuple[str, str]] = []
    for field in ("host_sections_ms", "blocking_per_step", "collectives_per_step"):
        for label in labels:
            for key in means[label].get(field) or {}:
                if (field, key) not in keys:
                    keys.append((field, key))
    for field, key in keys:
        if field == "host_sections_ms":
            row(f"host: {key} (ms)", [dig(means[label], (field, key)) for label in labels])
        elif field == "blocking_per_step":
            row(f"blocking: {key}, calls", [dig(means[label], (field, key, "count")) for label in labels])
            row(f"blocking: {key}, ms", [dig(means[label], (field, key, "ms")) for label in labels])
        else:
            row(f"collective: {key}, calls", [dig(means[label], (field, key)) for label in labels])
    for label in labels:
        for r in runs[label]["ranks"]:
            g = r.get("gpu") or {}
            if "error" in r or "error" in g:
                lines.append(f"\n{label} rank {r.get('rank')}: {r.get('error') or g.get('error')}")
                continue
            lines.append(
                f"\n{label} rank {r['rank']}: periods (ms) {g.get('periods_ms')}; copies (ms/step) "
                f"{ {k: round(v, 3) for k, v in (g.get('copies_ms') or {}).items()} }"
            )
            for gap in g.get("longest_gaps") or []:
                lines.append(f"  gap {gap['ms']} ms at +{gap['at_ms']} ms: loop thread in {gap['loop']}")
    if delta:
        facts = [runs[label]["facts"][0] if runs[label]["facts"] else {} for label in labels]
        differences = []
        for key in ("torch_threads", "torch_interop_threads", "cpus_allowed", "cudnn_benchmark", "switches"):
            if facts[0].get(key) != facts[1].get(key):
                differences.append(f"{key}: {facts[0].get(key)} -> {facts[1].get(key)}")
        env_a, env_b = facts[0].get("env", {}), facts[1].get("env", {})
        for key in sorted(set(env_a) | set(env_b)):
            if env_a.get(key) != env_b.get(key):
                differences.append(f"{key}: {env_a.get(key, '(unset)')} -> {env_b.get(key, '(unset)')}")
        threads = [f.get("threads", {}) for f in facts]
        differences.append(
            "threads: "
            + f"{sum(threads[0].values())} -> {sum(threads[1].values())} ("
            + ", ".join(
                f"{k}: {threads[0].get(k, 0)}->{threads[1].get(k, 0)}"
                for k in sorted(set(threads[0]) | set(threads[1]))
                if threads[0].get(k, 0) != threads[1].get(k, 0)
            )
            + ")"
        )
        for key in ("gc_tracked_objects", "gc_in_window"):
            if facts[0].get(key) != facts[1].get(key):
                differences.append(f"{key}: {facts[0].get(key)} -> {facts[1].get(key)}")
        lines.append(f"\nProcess facts, rank 0, {labels[0]} -> {labels[1]}:")
        lines.extend(f"- {d}" for d in differences)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, help="LABEL=DIR (give two to compare)")
    parser.add_argument("--json", default=None, help="write the whole summary here")
    parser.add_argument("--text", default=None, help="write the table here (it is printed too)")
    args = parser.parse_args(argv)
    runs: dict[str, dict[str, Any]] = {}
    for item in args.run:
        label, _, directory = item.partition("=")
        path = pathlib.Path(directory)
        if not path.is_dir() or not any(path.glob("rank*.trace.json*")):
            print(
                f"trace_summary: no rank*.trace.json* under {directory} ({label}): skipped", file=sys.stderr
            )
            continue
        runs[label] = summarize_dir(path)
    if not runs:
        print("trace_summary: nothing to summarise", file=sys.stderr)
        return 1
    text = render(runs)
    print(text)
    if args.text:
        pathlib.Path(args.text).write_text(text + "\n")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(runs, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
