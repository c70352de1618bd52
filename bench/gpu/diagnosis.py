"""Issue #21's part of the GPU suite: what a diagnostic trainer run does after its timed steps; its tables.

``suite.py`` imports this (same directory). A trainer run chosen for diagnosis (Ray Train, ResNet-50 eager,
``--diagnose-gpus``) goes on after its timed steps, in this order, each part only when asked:

1. **A/B blocks** (``trainop_trainer.bench_hooks``): ``--ab-rounds`` rounds of the ``--ab-variants`` (runtime
   switches, e.g. ``input=f32`` against ``default``), ``--ab-steps`` steps each, interleaved (ABCABC) so that
   drift falls on every variant alike; each block is timed between device synchronisations.
2. **a trace window** of ``--trace-steps`` steps under torch.profiler on every rank (the same window
   ``bare_ddp.py --trace-steps`` takes in bare DDP, for ``trace_summary.py``);
3. **recovery**: a checkpoint, one worker killed five steps later, Ray Train restarts the group, which
   resumes and trains a few more steps; the log gives kill -> new group -> resumed -> first step.

It also counts the lines of Ray's that a user reads as failures (the preemption watcher's error, the
placement-group cleaner's repeated notice, and the one INFO line that now explains the latter) and renders
the A/B, ladder and log-line tables.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import statistics
from typing import Any

TIME = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
AB_LINE = re.compile(
    r"rank0 \S+ INFO: ab block (\S+) steps (\d+)-(\d+): ([\d.]+) ms/step, ([\d.]+) samples/s"
    r"(?:; gc (\d+) collections \(gen0/1/2 (\S+)\), ([\d.]+) ms, longest ([\d.]+) ms)?"
)
GROUP_UP_LINE = re.compile(TIME + r" rank0 \S+ INFO: network facts:")
RUNTIME_UP_LINE = re.compile(TIME + r" rank0 \S+ INFO: runtime up in ([\d.]+)s")
SETUP_LINE = re.compile(TIME + r" rank0 \S+ INFO: \S+ built in ([\d.]+)s; trainer set up in ([\d.]+)s")
NOISE = {
    "preemption_watcher_error": re.compile(r"'PreemptionWatcher'.*max_restarts > 0"),
    "cleaner_failed_query": re.compile(r"Failed to query Ray Train Controller actor state"),
    "cleaner_explained_once": re.compile(r"placement-group cleaner cannot reach the Ray State API"),
}
DEFAULT_AB_VARIANTS = "default,input=lean,input=f32"


def ts(text: str) -> float:
    return datetime.datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """The steps of one trainer run: timed (warmup, last], then A/B blocks, a trace window, recovery."""

    warmup: int
    last: int
    ab: tuple[int, int, tuple[str, ...]] | None = None  # (first step, steps per block, variants in order)
    trace: tuple[int, int] | None = None  # (after this step, steps)
    checkpoint_at: int | None = None  # recovery: checkpoint here, kill five steps later
    max_steps: int = 0

    @property
    def kill_at(self) -> int | None:
        return None if self.checkpoint_at is None else self.checkpoint_at + 5

    def env(self, trace_dir: str) -> dict[str, str]:
        env: dict[str, str] = {}
        if self.ab is not None:
            start, steps, variants = self.ab
            env["TRAINOP_AB_BLOCKS"] = f"{start}:{steps}:{','.join(variants)}"
        if self.trace is not None:
            env["TRAINOP_TRACE_STEPS"] = f"{self.trace[0]}:{self.trace[1]}"
            env["TRAINOP_TRACE_DIR"] = trace_dir
        if self.kill_at is not None:
            env["TRAINOP_INJECT_FAILURE_AT_STEP"] = str(self.kill_at)
        return env

    def extra_steps(self) -> int:
        """Steps after the timed ones (for the time estimate)."""
        return self.max_steps - self.last


def plan_run(
    *,
    warmup: int,
    steps: int,
    ab_variants: tuple[str, ...] = (),
    ab_steps: int = 20,
    ab_rounds: int = 2,
    trace_steps: int = 0,
    recovery: bool = False,
    report_every: int = 10,
) -> RunPlan:
    """Blocks and windows start on report boundaries, so each holds the same number of report syncs."""
    last = warmup + steps
    cursor = last
    ab = None
    if ab_variants and ab_rounds > 0:
        order = tuple(ab_variants) * ab_rounds
        ab = (cursor, ab_steps, order)
        cursor += ab_steps * len(order)
    trace = None
    if trace_steps > 0:
        trace = (cursor, trace_steps)
        cursor += -(-trace_steps // report_every) * report_every
    checkpoint_at = None
    if recovery:
        checkpoint_at = cursor + report_every
        cursor = checkpoint_at + 5 + 2 * report_every
    return RunPlan(
        warmup=warmup, last=last, ab=ab, trace=trace, checkpoint_at=checkpoint_at, max_steps=max(cursor, last)
    )


def parse_ab(text: str, *, workload: str, gpus: int, impl: str) -> list[dict[str, Any]]:
    return [
        {
            "impl": "ab",
            "trainer": impl,
            "workload": workload,
            "world_size": gpus,
            "variant": m.group(1),
            "from_step": int(m.group(2)),
            "to_step": int(m.group(3)),
            "ms_per_step": float(m.group(4)),
            "samples_per_second": float(m.group(5)),
            "gc_collections": int(m.group(6)) if m.group(6) else None,
            "gc_ms": float(m.group(8)) if m.group(8) else None,
            "gc_longest_ms": float(m.group(9)) if m.group(9) else None,
        }
        for m in AB_LINE.finditer(text)
    ]


def count_noise(text: str) -> dict[str, int]:
    return {name: len(pattern.findall(text)) for name, pattern in NOISE.items()}


def recovery_detail(text: str, kill_time: float) -> dict[str, float]:
    """Kill -> the restarted group's first trainop line (Ray Train's part: detection, teardown, workers), and
    what the restarted group's set-up took (runtime, model build, Trainer set-up)."""
    detail: dict[str, float] = {}
    for match in GROUP_UP_LINE.finditer(text):
        if ts(match.group(1)) > kill_time:
            detail["kill_to_new_group_s"] = ts(match.group(1)) - kill_time
            break
    for match in RUNTIME_UP_LINE.finditer(text):
        if ts(match.group(1)) > kill_time:
            detail["restart_runtime_s"] = float(match.group(2))
            break
    for match in SETUP_LINE.finditer(text):
        if ts(match.group(1)) > kill_time:
            detail["restart_build_s"] = float(match.group(2))
            detail["restart_trainer_setup_s"] = float(match.group(3))
            break
    return detail


# -------------------------------------------------------------------------------------------- tables
def ab_table(results: list[dict[str, Any]]) -> list[str]:
    blocks = [r for r in results if r.get("impl") == "ab"]
    if not blocks:
        return []
    lines = [
        "",
        "A/B blocks inside one trainer run (same processes; blocks interleaved; each between device syncs):",
        "",
        "| run | variant | blocks | ms/step (each) | mean ms/step | samples/s | vs default | GC ms (max) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    runs = sorted({(b["trainer"], b["workload"], b["world_size"]) for b in blocks})
    for trainer, workload, gpus in runs:
        mine = [
            b for b in blocks if (b["trainer"], b["workload"], b["world_size"]) == (trainer, workload, gpus)
        ]
        variants: dict[str, list[dict[str, Any]]] = {}
        for b in mine:
            variants.setdefault(b["variant"], []).append(b)
        default = variants.get("default")
        base = statistics.mean(b["ms_per_step"] for b in default) if default else None
        for variant, items in variants.items():
            ms = statistics.mean(b["ms_per_step"] for b in items)
            rate = statistics.mean(b["samples_per_second"] for b in items)
            vs = "" if base is None or variant == "default" else f"{100.0 * (base / ms - 1.0):+.2f} % speed"
            gc_ms = [b["gc_ms"] for b in items if b.get("gc_ms") is not None]
            gc_max = max((b.get("gc_longest_ms") or 0.0) for b in items)
            gc_text = f"{sum(gc_ms):.1f} ({gc_max:.1f})" if gc_ms else ""
            lines.append(
                f"| {trainer}{gpus} {workload} | {variant} | {len(items)} | "
                + ", ".join(f"{b['ms_per_step']:.2f}" for b in items)
                + f" | {ms:.3f} | {rate:,.0f} | {vs} | {gc_text} |"
            )
    return lines


def ladder_table(results: list[dict[str, Any]]) -> list[str]:
    rungs = [r for r in results if r.get("impl") == "ladder"]
    if not rungs:
        return []
    lines = [
        "",
        "Ladder (ladder.py, torchrun, ResNet-50 eager: bare DDP plus one trainer part per rung):",
        "",
        "| GPUs | rung | ms/step | samples/s | added to | added ms/step | added % |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    by_name = {(r["world_size"], r["rung"]): r for r in rungs}
    for r in rungs:
        parent = by_name.get((r["world_size"], r.get("added_to")))
        added = r.get("added_ms")
        share = "" if added is None or parent is None else f"{100.0 * added / parent['step_ms']:+.2f} %"
        lines.append(
            f"| {r['world_size']} | {r['rung']} | {r['step_ms']:.3f} | {r['samples_per_second']:,.0f} | "
            f"{r.get('added_to') or ''} | {'' if added is None else f'{added:+.3f}'} | {share} |"
        )
    return lines


def noise_table(results: list[dict[str, Any]]) -> list[str]:
    runs = [r for r in results if r.get("ray_noise") is not None]
    if not runs:
        return []
    lines = [
        "",
        "Ray's lines a user reads as failures, per trainer run (expected: 0, 0, at most 1 explaining line):",
        "",
        "| run | PreemptionWatcher error | 'Failed to query Ray Train Controller' | explained (INFO, once) |",
        "| --- | --- | --- | --- |",
    ]
    for r in runs:
        noise = r["ray_noise"]
        lines.append(
            f"| {r['impl']}{r['world_size']} {r['workload']} | {noise['preemption_watcher_error']} | "
            f"{noise['cleaner_failed_query']} | {noise['cleaner_explained_once']} |"
        )
    return lines


def gpu_process_lines(results: list[dict[str, Any]]) -> list[str]:
    """Processes seen on each GPU during multi-GPU runs: more than one on a GPU is a stray CUDA context."""
    lines = []
    for r in results:
        seen = r.get("gpu_processes")
        if r.get("world_size", 1) > 1 and seen:
            counts = ", ".join(f"GPU {gpu}: {len(pids)}" for gpu, pids in sorted(seen.items()))
            lines.append(f"- {r['impl']}{r['world_size']} {r['workload']}: processes per GPU {counts}")
    return ["", "Processes per GPU during multi-GPU runs (NVML; 1 each expected):", *lines] if lines else []
