"""The GPU benchmark suite: bare DDP against the trainop trainer (Ray Train and torchrun), in one call.

    python3 bench/gpu/suite.py --out OUT [--deadline-s 540] [--gpus 1,2,4,8] [--workloads resnet50,...]
                               [--only allreduce,bare1,ray8,...] [--recovery-gpus 2]
    python3 bench/gpu/suite.py --table A/results.jsonl [B/results.jsonl ...] [--json]   # offline
    python3 bench/gpu/suite.py --dry-run --assume-gpus 8 [--only ...]   # the plan and its time, no GPU

Run it through ``bench/gpu/run_all.sh`` on the device machine (it installs the carried wheels and sets
the environment). Everything does not fit one 10-minute call (docs/benchmarks-gpu.md gives the calls for
2, 4 and 8 GPUs). ``--gpus`` (default: 1, 2, 4, ... up to and including the machine's GPU count) sets the
GPU counts of the default phases and of ``allreduce``; ``--workloads`` (default
``resnet50,resnet50-compile,gpt-compile``) the workloads of the bare and trainer phases. Phases run in
the order given (priority order); a phase whose estimate no longer fits before the deadline is skipped
and named as skipped in the table, and so is one that needs more GPUs than the machine has. ``N`` below
is any GPU count:

- ``allreduce``: standalone NCCL all-reduce (16 MiB, 256 MiB, 1 GiB) and the trainer's probe function,
  for every N >= 2 of ``--gpus``, under the network profile the trainer resolves on the node (``auto``:
  NVLink on one node); ``allreduceN``: only on N GPUs.
- ``bareN``: ``bare_ddp.py`` on N GPUs (the selected workloads in one torchrun). The first compiled runs fill
  the Inductor cache that later runs reuse; with both compiled workloads selected, ``bare1`` compiles
  ResNet-50 on GPU 0 while a warm-up process compiles GPT-small on GPU 1.
- ``rayN``: ``python -m trainop_trainer --config ...`` (the product entry point: TorchTrainer,
  ScalingConfig(num_workers=N, use_gpu=True)) joined to one local Ray head started here.
- recovery, inside ``rayN``'s ResNet-50 eager run for N = ``--recovery-gpus`` (default 2; 0: never) after
  its timed steps: a checkpoint, one worker killed (``TRAINOP_INJECT_FAILURE_AT_STEP``), Ray Train
  restarts the group -> time from the kill to the first step after the resume, from the workers' logs.
- ``ckpt`` (= ``ckpt2``) / ``ckptN``: ``ckpt_bench.py``, GPT-small (eager: the cost is seconds per
  checkpoint, whatever the step time) on N GPUs: per-checkpoint cost, background (DCP async save, pinned
  staging) vs sync.
- ``rayNw8``: Ray, N GPUs, compiled ResNet-50 with 8 DataLoader workers per rank instead of 4.
- ``launchN``: ``torchrun -m trainop_trainer.launch`` (the same Trainer without Ray).

Issue #21 (the trainer within 1 % of bare DDP) adds, all in the same call:

- ``bareN`` with N = ``--diagnose-gpus`` (default 2) profiles ResNet-50 eager (or ``--trace-workload``) for
  ``--trace-steps`` steps after its timed ones (``bare_ddp.py --trace-steps``), and ``rayN``'s run of that
  workload has the same trace window; its ResNet-50 eager run goes on after its timed steps with A/B blocks
  of runtime switches and the recovery test
  (``diagnosis.py`` says in which order). ``trace_summary.py`` compares the two traces into
  ``OUT/profile.md`` and ``OUT/profile.json``: the step period split into training-stream time, exposed
  NCCL, exposed copies and idle GPU, and the host's time per section of the loop. Phases may name one
  workload: ``ray2-resnet50``.
- ``ladderN``: ``ladder.py`` under torchrun: bare DDP plus one part of the trainer per rung.
- every Ray run's log is searched for Ray's lines that users read as failures (counted in the table), and
  NVML lists the processes on each GPU during every run (a stray CUDA context on another rank's GPU shows).

Trainer throughput comes from rank 0's report lines (``step S/T ... R samples/s``, one per 10 steps,
each window bounded by a device synchronisation): windows that start at or after ``--warmup`` steps,
total samples over total time. Peak memory of every run comes from NVML (memory used on the GPU, CUDA
context and allocator cache included), sampled every 0.2 s. The table and ``OUT/summary.json`` give, for
every GPU count, the scaling efficiency against 1 GPU of the same implementation and the trainer / bare
DDP ratio at the same count, and check the targets of issues #7 and #21.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from typing import Any

import diagnosis  # bench/gpu/diagnosis.py: this script's directory is on sys.path

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
PEAK_BF16_TFLOPS = 989.0  # H100/H200 SXM dense bf16 (datasheet); MFU is quoted against it
# Steps per measured run (--warmup, --steps): 20 warm-up steps absorb compilation, 60 are timed (6 report
# windows): the call's time goes to process start, worker groups and compilation, not to steps.
WARMUP = 20
STEPS = 60
REPORT_EVERY = 10
TIME = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
STEP_LINE = re.compile(
    TIME + r" rank0 \S+ INFO: step (\d+)/\d+ epoch \d+ loss \S+ ([\d.]+|-) samples/s"
    r"(?: \(window of steps (\d+)-(\d+)\))?"  # a lagged report (switches report_sync) gives its window
)
PROBE_LINE = re.compile(r"all-reduce probe: ([\d.]+) GB/s bus bandwidth \((\d+) MiB")
CKPT_LINE = re.compile(r"checkpoint step (\d+): ([\d.]+)s on the training thread")
KILL_LINE = re.compile(
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) rank\d+ \S+ WARNING: trainop: injected failure"
)
RESUME_LINE = re.compile(
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) rank0 \S+ INFO: resuming from \S+ \(step (\d+)"
)
PROFILE_LINE = re.compile(r"rank0 \S+ INFO: network profile (\S+) -> (\S+) \(")
PHASE = re.compile(
    r"(allreduce|bare|ray|launch|ckpt|ladder)(\d*)(w8)?(?:-(resnet50|resnet50-compile|gpt-compile))?"
)
# NVLink multicast (NVLS) stays off in every process this suite starts: a program that uses it can take
# the host's shared GPUs out of service (the device machines' notes). run_all.sh exports the same.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

WORKLOADS = {
    # name: (model, compile, batch per GPU, unit)
    "resnet50": ("resnet50", False, 256, "img"),
    "resnet50-compile": ("resnet50", True, 256, "img"),
    "gpt-compile": ("gpt-small", True, 16, "tok"),
    "gpt": ("gpt-small", False, 16, "tok"),
    # The same with 8 DataLoader workers per rank instead of 4: is compiled ResNet-50 input-bound?
    "resnet50-compile-w8": ("resnet50", True, 256, "img"),
}
TRAINER_WORKLOADS = ("resnet50", "resnet50-compile", "gpt-compile")
SMOKE = False  # --smoke: tiny models on CPU (gloo), no compile: checks this script, not the GPUs
TABLE_WORKLOADS = ("resnet50", "resnet50-compile", "resnet50-compile-w8", "gpt-compile", "gpt")
IMPLS = ("bare", "ray", "launch")
TARGET_SCALING_PCT = 95.0  # issue #7: ResNet-50 eager, 8 GPUs, per-GPU throughput against 1 GPU
TARGET_RATIO_PCT = 99.0  # issue #21 (was 97 % in #7): the trainer through Ray Train against bare DDP
TARGET_SCALING_GAP = 1.0  # issue #21: the trainer's scaling within 1 point of bare DDP's
TARGET_RECOVERY_S = 25.0  # issue #21: kill -> first step after the resume, 2 and 4 GPUs

# Seconds each run is expected to take, from the 2x H200 calls of 2026-11-26 (docs/benchmarks-gpu.md), with
# some margin: a run is skipped when its estimate no longer fits before the deadline. A run costs its fixed
# part (processes, imports, NCCL set-up; for Ray also the driver, the worker group's start (14-22 s), the
# Trainer's set-up (4-6.5 s), the final checkpoint and the tear-down), its compilation and its steps.
# Compilations are cached per device (the Inductor cache key holds the device index), so a run is "warm"
# when the same graph was compiled on each of its devices earlier in the call (``Suite.warmth``). Bare DDP
# and the trainer compile the same GPT graph, but not the same ResNet-50 graph (the trainer's images arrive
# in bf16, bare DDP's in float32).
FIXED_S = {"bare": 10.0, "ray": 33.0, "launch": 15.0}  # per process group; + 2 s per GPU beyond the first
STEP_S = {"resnet50": 0.058, "resnet50-compile": 0.042, "resnet50-compile-w8": 0.042, "gpt-compile": 0.042}
COMPILE_S = {  # (cold on one GPU, cold on several at once, warm)
    "resnet50-compile": (37.0, 45.0, 10.0),
    "resnet50-compile-w8": (37.0, 45.0, 10.0),
    "gpt-compile": (15.0, 20.0, 6.0),
}
BUILD_S = 3.0  # bare DDP: model, data and DDP of one workload
GPT_CHECKPOINT_S = 3.0  # the trainer's final checkpoint of GPT-small's 1.5 GB of state
RECOVERY_S = (
    30.0  # kill -> restarted group (~21 s) -> Trainer set-up and resume (~6.5 s); + steps in the plan
)
ALLREDUCE_S = 10.0  # + 2 s per GPU: 8.6 s measured on 2 GPUs (three sizes and the probe function)
CKPT_S = 65.0  # + 3 s per GPU: 58 s measured on 2 GPUs
RAY_START_S = 6.0  # `ray start --head`: 5.5 s measured
TRACE_S = 8.0  # a 10-step trace window: the profiler's overhead, writing and compressing the trace
LADDER_FIXED_S = 12.0  # torchrun, NCCL set-up
LADDER_RUNG_S = 4.5  # model, DDP, loader workers, 40 steps


@dataclasses.dataclass(frozen=True)
class Phase:
    """One entry of ``--only``: ``kind`` in allreduce/bare/ray/launch/ckpt/ladder, ``gpus`` (None:
    ``allreduce`` over every N >= 2 of ``--gpus``), ``w8``: 8 DataLoader workers (``rayNw8``), ``workload``:
    only that one of the bare and trainer phases (``ray2-resnet50``)."""

    kind: str
    gpus: int | None
    w8: bool = False
    workload: str | None = None

    def label(self, gpus: int) -> str:
        """The phase's name on ``gpus`` GPUs: bare8, ray2w8, allreduce4, ray2-resnet50, ..."""
        return f"{self.kind}{gpus}{'w8' if self.w8 else ''}{'-' + self.workload if self.workload else ''}"


def parse_phase(text: str) -> Phase:
    match = PHASE.fullmatch(text.strip())
    if not match:
        raise ValueError(
            f"unknown phase {text!r}: expected allreduce[N], bareN, rayN, rayNw8, launchN, ckpt[N], ladderN, "
            "with -WORKLOAD after bareN/rayN/launchN to run only that workload"
        )
    kind, digits, w8, workload = match.group(1), match.group(2), bool(match.group(3)), match.group(4)
    gpus = int(digits) if digits else None
    if kind == "ckpt" and gpus is None:
        gpus = 2  # the historical ``ckpt`` phase: 2 GPUs
    if gpus is None and kind in ("bare", "ray", "launch", "ladder"):
        raise ValueError(f"phase {text!r} needs a GPU count, e.g. {kind}1 or {kind}8")
    if gpus is not None and gpus < 1:
        raise ValueError(f"phase {text!r}: the GPU count must be at least 1")
    if w8 and kind != "ray":
        raise ValueError(f"phase {text!r}: only rayNw8 exists")
    if workload and (w8 or kind not in ("bare", "ray", "launch")):
        raise ValueError(f"phase {text!r}: only bareN, rayN and launchN take a workload")
    return Phase(kind, gpus, w8, workload)


def parse_gpus(text: str) -> list[int]:
    counts = sorted({int(part) for part in text.split(",") if part.strip()})
    if not counts or counts[0] < 1:
        raise ValueError(f"--gpus {text!r}: expected GPU counts >= 1, e.g. 1,2,4,8")
    return counts


def default_gpus(count: int) -> list[int]:
    """1, 2, 4, ... below ``count``, and ``count`` itself: 8 GPUs -> 1,2,4,8; 6 -> 1,2,4,6."""
    counts, n = [], 1
    while n < count:
        counts.append(n)
        n *= 2
    return [*counts, count] if count >= 1 else []


def default_phases(gpus: list[int]) -> list[Phase]:
    """allreduce, bareN..., rayN..., ckpt (2 GPUs), launchN (largest first): for --gpus 1,2 this is the
    suite's historical order (allreduce, bare1, bare2, ray1, ray2, ckpt, launch2, launch1)."""
    phases = [Phase("allreduce", None)]
    phases += [Phase("bare", n) for n in gpus]
    phases += [Phase("ray", n) for n in gpus]
    if 2 in gpus:
        phases.append(Phase("ckpt", 2))
    phases += [Phase("launch", n) for n in reversed(gpus)]
    return phases


def plan_phases(
    phases: list[Phase], gpus: list[int], available: int | None
) -> tuple[list[tuple[Phase, int]], list[str]]:
    """Expand ``allreduce`` to one run per N >= 2 of ``gpus`` and drop what needs more GPUs than
    ``available`` (None: no limit, the CPU smoke test). Returns ((phase, N) in order, what was dropped)."""
    runs: list[tuple[Phase, int]] = []
    dropped: list[str] = []
    for phase in phases:
        counts = [n for n in gpus if n >= 2] if phase.gpus is None else [phase.gpus]
        for n in counts:
            if phase.kind == "allreduce" and n < 2:
                dropped.append(f"allreduce{n} (needs 2 GPUs or more)")
            elif available is not None and n > available:
                dropped.append(f"{phase.label(n)} (needs {n} GPUs, {available} here)")
            else:
                runs.append((phase, n))
    return runs, dropped


LADDER_RUNGS = "bare,ddp,input,input-lean,loader,control,report"


def set_smoke() -> None:
    global SMOKE, WARMUP, STEPS, REPORT_EVERY
    SMOKE, WARMUP, STEPS, REPORT_EVERY = True, 2, 4, 2
    for name in ("resnet50", "resnet50-compile", "resnet50-compile-w8"):
        WORKLOADS[name] = ("resnet18", False, 4, "img")
    WORKLOADS["gpt-compile"] = WORKLOADS["gpt"] = ("gpt-tiny", False, 2, "tok")


def ts(text: str) -> float:
    return datetime.datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


# ------------------------------------------------------------------------------------------ GPU sampler
class GpuSampler:
    """Memory used and utilisation of every GPU, every 0.2 s, through NVML."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int, float, float]] = []  # (time, gpu, GiB used, util %)
        self.processes: list[tuple[float, int, int]] = []  # (time, gpu, pid): compute processes, every 1 s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.names: list[str] = []

    def start(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.names = [str(pynvml.nvmlDeviceGetName(h)) for h in self._handles]
            self._pynvml = pynvml
        except Exception as exc:  # a missing NVML only loses the memory column
            print(f"suite: no NVML sampling ({exc})", flush=True)
            return
        self._thread.start()

    def _run(self) -> None:
        nv = self._pynvml
        tick = 0
        while not self._stop.wait(0.2):
            now = time.time()
            tick += 1
            for index, handle in enumerate(self._handles):
                try:
                    used = nv.nvmlDeviceGetMemoryInfo(handle).used / 2**30
                    util = float(nv.nvmlDeviceGetUtilizationRates(handle).gpu)
                    if tick % 5 == 0:
                        for proc in nv.nvmlDeviceGetComputeRunningProcesses(handle):
                            self.processes.append((now, index, int(proc.pid)))
                except nv.NVMLError:
                    continue
                self.samples.append((now, index, used, util))

    def stop(self) -> None:
        self._stop.set()

    def window(self, start: float, end: float) -> dict[str, Any]:
        peak: dict[int, float] = {}
        for t, gpu, used, _util in self.samples:
            if start <= t <= end:
                peak[gpu] = max(peak.get(gpu, 0.0), used)
        busy = [g for g, used in peak.items() if used > 1.0]
        pids: dict[str, set[int]] = {}
        for t, gpu, pid in self.processes:
            if start <= t <= end:
                pids.setdefault(str(gpu), set()).add(pid)
        return {
            "nvml_peak_gib": max(peak.values()) if peak else None,
            "gpus_used": sorted(busy),
            "gpu_processes": {gpu: sorted(found) for gpu, found in sorted(pids.items())},
        }


# --------------------------------------------------------------------------------------------- suite
@dataclasses.dataclass
class Suite:
    out: pathlib.Path
    deadline: float  # time.monotonic() value
    sampler: GpuSampler
    results: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    ray_address: str | None = None
    port: int = 9400
    recovery_gpus: int = 2  # rayN with N == this runs the recovery test in its ResNet-50 eager run
    # Issue #21 (diagnosis.py): bareN and rayN's ResNet-50 eager run with N == diagnose_gpus are traced,
    # and the latter also runs the A/B blocks.
    diagnose_gpus: int = 2
    trace_steps: int = 10
    # The workload whose bareN/rayN runs are traced (the A/B blocks and the recovery test stay with eager
    # ResNet-50): e.g. resnet50-compile for the compiled gap of #21.
    trace_workload: str = "resnet50"
    ab_variants: tuple[str, ...] = tuple(diagnosis.DEFAULT_AB_VARIANTS.split(","))
    ab_steps: int = 20
    ab_rounds: int = 2
    # (graph, device index) compiled so far in this call (``graph``)
    warmth: set[tuple[str, int]] = dataclasses.field(default_factory=set)
    _summary: subprocess.Popen[str] | None = None

    # -------------------------------------------------------------------------------- estimates
    def run_estimate(self, impl: str, workload: str, gpus: int, *, recovery: bool = False) -> float:
        """Seconds one run takes (see FIXED_S and the comment above it); bare runs without FIXED_S."""
        warm = all((graph(impl, workload), device) in self.warmth for device in range(gpus))
        plan = None if impl == "bare" else self.plan(impl, gpus, workload, recovery=recovery)
        steps = WARMUP + STEPS + (plan.extra_steps() if plan else 0)
        seconds = STEP_S.get(workload, 0.05) * steps
        if workload in COMPILE_S:
            cold_one, cold_many, hot = COMPILE_S[workload]
            seconds += hot if warm else cold_one if gpus == 1 else cold_many
        if impl == "bare":
            return seconds + BUILD_S + (TRACE_S if self.traced_bare(gpus, workload) else 0.0)
        seconds += FIXED_S[impl] + 2.0 * (gpus - 1)
        if plan is not None and plan.trace:
            seconds += TRACE_S
        if recovery:
            seconds += RECOVERY_S + gpus
        if workload.startswith("gpt"):
            seconds += GPT_CHECKPOINT_S
        return seconds

    def compiled(self, impl: str, workload: str, gpus: int) -> None:
        """After a run: its compilation is in the cache for each of its devices."""
        self.warmth.update((graph(impl, workload), device) for device in range(gpus))

    def traced_bare(self, gpus: int, workload: str) -> bool:
        return gpus == self.diagnose_gpus and workload == self.trace_workload and self.trace_steps > 0

    def phase_estimate(self, phase: Phase, gpus: int, workloads: list[str]) -> float:
        """The whole phase on ``gpus`` GPUs (what ``--dry-run`` prints; each run is checked on its own)."""
        if phase.workload is not None:
            workloads = [phase.workload]
        if phase.kind == "ladder":
            return LADDER_FIXED_S + LADDER_RUNG_S * len(LADDER_RUNGS.split(","))
        if phase.kind == "allreduce":
            return ALLREDUCE_S + 2.0 * gpus
        if phase.kind == "ckpt":
            return CKPT_S + 3.0 * gpus
        if phase.kind == "bare":
            return (
                FIXED_S["bare"]
                + 2.0 * (gpus - 1)
                + sum(self.run_estimate("bare", w, gpus) for w in workloads)
            )
        if phase.w8:
            return self.run_estimate("ray", "resnet50-compile-w8", gpus)
        return sum(
            self.run_estimate(
                phase.kind,
                w,
                gpus,
                recovery=phase.kind == "ray" and w == "resnet50" and gpus == self.recovery_gpus,
            )
            for w in workloads
        )

    @property
    def traces(self) -> pathlib.Path:
        return self.out / "traces"

    def plan(self, impl: str, gpus: int, workload: str, *, recovery: bool) -> diagnosis.RunPlan:
        """What a trainer run does after its timed steps (diagnosis.plan_run)."""
        diagnose = impl == "ray" and workload == "resnet50" and gpus == self.diagnose_gpus
        traced = impl == "ray" and workload == self.trace_workload and gpus == self.diagnose_gpus
        return diagnosis.plan_run(
            warmup=WARMUP,
            steps=STEPS,
            ab_variants=self.ab_variants if diagnose else (),
            ab_steps=REPORT_EVERY if SMOKE else self.ab_steps,
            ab_rounds=self.ab_rounds,
            trace_steps=(3 if SMOKE else self.trace_steps) if traced else 0,
            recovery=recovery,
            report_every=REPORT_EVERY,
        )

    @property
    def logs(self) -> pathlib.Path:
        path = self.out / "logs"
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def results_file(self) -> pathlib.Path:
        return self.out / "results.jsonl"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def record(self, result: dict[str, Any]) -> None:
        self.results.append(result)
        with self.results_file.open("a") as f:
            f.write(json.dumps(result) + "\n")
        print("RESULT " + json.dumps(result), flush=True)

    def fits(self, what: str, estimate_s: float) -> bool:
        if self.left() >= estimate_s:
            return True
        self.skipped.append(what)
        print(f"suite: skipping {what}: {self.left():.0f}s left, needs ~{estimate_s:.0f}s", flush=True)
        return False

    def run(
        self, name: str, cmd: list[str], *, env: dict[str, str] | None = None
    ) -> tuple[int, str, float, float]:
        """Run ``cmd`` in its own session, output to logs/<name>.log; killed at the deadline."""
        log_path = self.logs / f"{name}.log"
        timeout = max(5.0, self.left())
        start = time.time()
        print(
            f"suite: [{time.strftime('%H:%M:%S')}] {name}: {' '.join(cmd)} ({self.left():.0f}s left)",
            flush=True,
        )
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                cwd=REPO,
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = -9
                print(f"suite: {name} killed at the deadline", flush=True)
        end = time.time()
        text = log_path.read_text(errors="replace")
        print(f"suite: {name} rc={rc} in {end - start:.1f}s", flush=True)
        if rc != 0:
            print("\n".join(text.splitlines()[-25:]), flush=True)
        return rc, text, start, end

    # ----------------------------------------------------------------------------- configs
    def trainer_config(
        self,
        name: str,
        workload: str,
        gpus: int,
        *,
        max_steps: int,
        report_every: int | None = None,
        interval_steps: int | None = None,
    ) -> pathlib.Path:
        model, compile_, batch, _unit = WORKLOADS[workload]
        self.port += 10
        if model.startswith("resnet"):
            dataset = {
                "kind": "synthetic",
                "imageSize": 32 if SMOKE else 224,
                "numWorkers": 0 if SMOKE else 8 if workload.endswith("-w8") else 4,
            }
            hp = {"optimizer": "sgd", "learningRate": 0.1, "momentum": 0.9}
        else:
            dataset = {
                "kind": "synthetic",
                "sequenceLength": 64 if SMOKE else 1024,
                "numWorkers": 0 if SMOKE else 2,
            }
            hp = {"optimizer": "adamw", "learningRate": 6e-4, "weightDecay": 0.1}
        # Enough samples that no epoch ends inside a run (an epoch boundary restarts the loader).
        dataset["numSamples"] = batch * gpus * (max_steps + 20)
        checkpoint: dict[str, Any] = {"keepLast": 2}
        checkpoint["intervalSteps" if interval_steps else "intervalMinutes"] = interval_steps or 1440
        spec = {
            "workload": {"model": model, "dataset": dataset},
            "hyperparameters": {"maxSteps": max_steps, "batchSizePerWorker": batch, **hp},
            "precision": "bf16",
            "compile": compile_,
            "workers": {"replicas": gpus, "gpusPerWorker": 0, "cpusPerWorker": 1}
            if SMOKE
            else {"replicas": 1, "gpusPerWorker": gpus, "cpusPerWorker": 8},
            "checkpoint": checkpoint,
            "network": {"profile": "auto", "probeMegabytes": 256},
            "reporting": {
                "everySteps": report_every or REPORT_EVERY,
                "everySeconds": 3600,
                "metricsPort": self.port,
            },
            "failurePolicy": {"maxWorkerFailures": 2},
        }
        run = f"{name}-{int(time.time())}"
        config = {"jobName": name, "runName": run, "storagePath": "/tmp/trainop-bench", "spec": spec}
        path = self.logs / f"{name}.json"
        path.write_text(json.dumps(config, indent=1))
        return path

    # ------------------------------------------------------------------------------ phases
    def allreduce(self, gpus: int) -> None:
        """Standalone all-reduce on ``gpus`` GPUs (allreduce.py appends its own lines to results.jsonl)."""
        name = f"allreduce{gpus}"
        if not self.fits(name, ALLREDUCE_S + 2.0 * gpus):
            return
        _, text, _, _ = self.run(
            name,
            [
                *torchrun(gpus),
                str(HERE / "allreduce.py"),
                "--out",
                str(self.results_file),
                "--profile",
                "auto",
            ],
        )
        for line in text.splitlines():
            if line.startswith("ALLREDUCE "):
                self.results.append({"impl": "allreduce", **json.loads(line[len("ALLREDUCE ") :])})

    def bare(self, gpus: int, workloads: list[str]) -> None:
        if not workloads:
            return
        traced = self.traced_bare(gpus, self.trace_workload) and self.trace_workload in workloads
        if not self.fits(f"bare{gpus}", self.phase_estimate(Phase("bare", gpus), gpus, workloads)):
            return
        trace = (
            [
                "--trace-steps",
                str(3 if SMOKE else self.trace_steps),
                "--trace-dir",
                str(self.traces / f"bare{gpus}"),
                "--trace-workload",
                self.trace_workload,
            ]
            if traced
            else []
        )
        _, text, start, end = self.run(
            f"bare{gpus}",
            torchrun(gpus)
            + [
                str(HERE / "bare_ddp.py"),
                "--workloads",
                ",".join(workloads),
                "--warmup",
                str(WARMUP),
                "--steps",
                str(STEPS),
            ]
            + trace
            # Smoke: tiny models on CPU, not compiled, under the same workload names.
            + (["--cpu", "--tiny", "--no-compile"] if SMOKE else []),
        )
        for workload in workloads:
            self.compiled("bare", workload, gpus)
        self.start_trace_summary()
        for line in text.splitlines():
            if line.startswith("BARE "):
                result = json.loads(line[len("BARE ") :])
                result.update(self.sampler.window(start, end))
                self.record(result)

    def ladder(self, gpus: int) -> None:
        """ladder.py: bare DDP plus one trainer part per rung (ResNet-50 eager)."""
        name = f"ladder{gpus}"
        if not self.fits(name, self.phase_estimate(Phase("ladder", gpus), gpus, [])):
            return
        cmd = [*torchrun(gpus), str(HERE / "ladder.py"), "--rungs", LADDER_RUNGS]
        if SMOKE:
            cmd += ["--cpu", "--tiny", "--warmup", "2", "--steps", "4"]
        _, text, _, _ = self.run(name, cmd)
        for line in text.splitlines():
            if line.startswith("LADDER "):
                self.record(json.loads(line[len("LADDER ") :]))

    def start_trace_summary(self) -> None:
        """Once the bare and the trainer traces exist: trace_summary.py in the background (a few seconds of
        one core while the next runs go on), into OUT/profile.{md,json}."""
        n = self.diagnose_gpus
        runs = [("bare DDP", self.traces / f"bare{n}"), ("trainer (Ray)", self.traces / f"ray{n}")]
        if self._summary is not None or not all(any(p.glob("rank*.trace.json*")) for _, p in runs):
            return
        cmd = [sys.executable, str(HERE / "trace_summary.py")]
        for label, path in runs:
            cmd += ["--run", f"{label}={path}"]
        cmd += ["--json", str(self.out / "profile.json"), "--text", str(self.out / "profile.md")]
        self._summary = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def finish_trace_summary(self) -> str:
        if self._summary is None:
            return ""
        try:
            out, _ = self._summary.communicate(timeout=max(30.0, self.left() + 60.0))
        except subprocess.TimeoutExpired:
            self._summary.kill()
            return "Profile: trace_summary.py did not finish in time (the traces are in traces.tar.gz)."
        if self._summary.returncode != 0:
            return f"Profile: trace_summary.py failed:\n{out[-2000:]}"
        steps = 3 if SMOKE else self.trace_steps
        return (
            f"Profile: {self.trace_workload}, {self.diagnose_gpus} GPUs, {steps} steps after the timed ones "
            f"(trace_summary.py; profile.json has every rank):\n\n{out.strip()}"
        )

    def trainer(self, impl: str, gpus: int, workload: str, *, recovery: bool = False) -> None:
        """One trainer run: timed steps, then what ``self.plan`` adds (A/B blocks, a trace window, and with
        ``recovery`` (Ray only) a checkpoint, one worker killed 5 steps later, the restarted group's
        steps)."""
        name = f"{impl}{gpus}-{workload}"
        plan = self.plan(impl, gpus, workload, recovery=recovery)
        if not self.fits(name, self.run_estimate(impl, workload, gpus, recovery=recovery)):
            return
        config = self.trainer_config(
            name, workload, gpus, max_steps=plan.max_steps, interval_steps=plan.checkpoint_at
        )
        env = plan.env(str(self.traces / f"{impl}{gpus}"))
        if impl == "ray":
            if self.ray_address:
                env["RAY_ADDRESS"] = self.ray_address
            cmd = [sys.executable, "-m", "trainop_trainer", "--config", str(config)]
        else:
            cmd = [*torchrun(gpus), "-m", "trainop_trainer.launch", "--config", str(config)]
        rc, text, start, end = self.run(name, cmd, env=env)
        self.compiled(impl, workload, gpus)
        kill = KILL_LINE.search(text)
        before_kill = text[: kill.start()] if kill else text
        result = parse_trainer_log(before_kill, workload=workload, gpus=gpus, warmup=WARMUP, last=plan.last)
        result.update(impl=impl, workload=workload, world_size=gpus, rc=rc, wall_s=end - start)
        result.update(self.sampler.window(start, end))
        if impl == "ray":
            result["ray_noise"] = diagnosis.count_noise(text)
        self.record(result)
        for block in diagnosis.parse_ab(before_kill, workload=workload, gpus=gpus, impl=impl):
            self.record(block)
        if recovery:
            self.record(parse_recovery(text, kill, result, workload=workload, gpus=gpus, rc=rc))
        if plan.trace:
            self.start_trace_summary()

    def ckpt(self, gpus: int = 2) -> None:
        name = f"ckpt-gpt-{gpus}"
        if not self.fits(name, CKPT_S + 3.0 * gpus):
            return
        config = self.trainer_config(name, "gpt", gpus, max_steps=100000)
        _, text, _, _ = self.run(
            name,
            torchrun(gpus)
            + [
                str(HERE / "ckpt_bench.py"),
                "--config",
                str(config),
                "--warmup",
                "30",
                "--base",
                "60",
                "--after",
                "100",
                "--repeats",
                "2",
                "--modes",
                "background,sync",
            ]
            + (["--warmup", "2", "--base", "4", "--after", "4", "--repeats", "1"] if SMOKE else []),
        )
        for line in text.splitlines():
            if line.startswith("CKPT "):
                self.record(json.loads(line[len("CKPT ") :]))

    def start_warmer(self) -> None:
        """Compile GPT-small (DDP, one process) on GPU 1 into the shared Inductor cache while ResNet-50
        compiles on GPU 0: later GPT runs load it instead of compiling. Waited for before anything else
        uses GPU 1 (``wait_warmer``); its few steps overlap only ResNet-50's compilation on GPU 0."""
        log = (self.logs / "warmer.log").open("w")
        self._warmer_start = time.time()
        self._warmer: subprocess.Popen[bytes] | None = subprocess.Popen(
            [
                *torchrun(1),
                str(HERE / "bare_ddp.py"),
                "--workloads",
                "gpt-compile",
                "--warmup",
                "2",
                "--steps",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "1", "TORCHINDUCTOR_COMPILE_THREADS": "8"},
        )

    def wait_warmer(self) -> None:
        warmer = getattr(self, "_warmer", None)
        if warmer is None:
            return
        try:
            rc = warmer.wait(timeout=max(1.0, min(240.0, self.left())))
        except subprocess.TimeoutExpired:
            os.killpg(warmer.pid, signal.SIGKILL)
            rc = warmer.wait()
        print(
            f"suite: warmer rc={rc}, ended {time.time() - self._warmer_start:.0f}s after its start",
            flush=True,
        )
        self._warmer = None

    def start_ray(self, num_gpus: int) -> None:
        env: dict[str, str] = {}
        if os.environ.get("TRAINOP_WARM_SPARES") == "1":
            # As on a TrainingJob's worker pods with warm spares: this raylet preloads what a spare
            # imports and prestarts no other idle workers (run_all.sh puts operator/ on the path).
            from trainop.api import trainer_config

            env = trainer_config.spare_raylet_env()
        rc, _, _, _ = self.run(
            "ray-start",
            [
                sys.executable,
                "-m",
                "ray.scripts.scripts",
                "start",
                "--head",
                "--port=6390",
                f"--num-gpus={num_gpus}",
                f"--num-cpus={os.cpu_count() or 8}",
                "--include-dashboard=false",
                "--disable-usage-stats",
            ],
            env=env,
        )
        if rc == 0:
            self.ray_address = "127.0.0.1:6390"
        else:
            print("suite: ray start failed; every Ray run starts its own local Ray", flush=True)

    def stop_ray(self) -> None:
        if self.ray_address:
            subprocess.run(
                [sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"],
                capture_output=True,
                timeout=60,
            )


def graph(impl: str, workload: str) -> str:
    """What a run compiles, as far as the Inductor cache is concerned (see COMPILE_S)."""
    return workload if impl == "bare" or not workload.startswith("resnet") else f"{workload} (trainer)"


def torchrun(gpus: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}"]


def parse_recovery(
    text: str, kill: re.Match[str] | None, timed: dict[str, Any], *, workload: str, gpus: int, rc: int
) -> dict[str, Any]:
    """Kill -> resumed group -> first report after the resume (REPORT_EVERY steps later; the first step is
    estimated by taking off REPORT_EVERY - 1 steps at the timed step time)."""
    result: dict[str, Any] = {"impl": "recovery", "workload": workload, "world_size": gpus, "rc": rc}
    resume = RESUME_LINE.search(text, kill.end()) if kill else None
    if not (kill and resume):
        result["error"] = "no kill or no resume line in the log"
        return result
    resumed_step = int(resume.group(2))
    after = [m for m in STEP_LINE.finditer(text, resume.end()) if int(m.group(2)) > resumed_step]
    result.update(resumed_from_step=resumed_step, kill_to_resume_s=ts(resume.group(1)) - ts(kill.group(1)))
    # Ray Train's part (failure detection, teardown, new worker processes) ends at the new group's first line.
    result.update(diagnosis.recovery_detail(text, ts(kill.group(1))))
    if after:
        steps = int(after[0].group(2)) - resumed_step
        to_report = ts(after[0].group(1)) - ts(kill.group(1))
        rate = timed.get("samples_per_second")
        step_s = WORKLOADS[workload][2] * gpus / rate if rate else 0.0
        result.update(
            first_report_step=int(after[0].group(2)),
            kill_to_first_report_s=to_report,
            kill_to_first_step_s=to_report - (steps - 1) * step_s,
        )
    return result


def parse_trainer_log(text: str, *, workload: str, gpus: int, warmup: int, last: int) -> dict[str, Any]:
    batch = WORKLOADS[workload][2]
    windows: list[tuple[int, int, float]] = []  # (from step, to step, rate)
    previous = 0
    for match in STEP_LINE.finditer(text):
        step = int(match.group(2))
        rate = match.group(3)
        if match.group(4) is not None:  # the rate of an earlier window, named in the line
            first, last_of_window = int(match.group(4)), int(match.group(5))
            if last_of_window > first and rate != "-" and all(w[1] != last_of_window for w in windows):
                windows.append((first, last_of_window, float(rate)))
        elif step > previous and rate != "-":
            windows.append((previous, step, float(rate)))
        previous = max(previous, step)
    timed = [(a, b, r) for a, b, r in windows if a >= warmup and b <= last]
    result: dict[str, Any] = {}
    if timed:
        samples = sum((b - a) * batch * gpus for a, b, _ in timed)
        seconds = sum((b - a) * batch * gpus / r for a, b, r in timed)
        result["samples_per_second"] = samples / seconds
        result["timed_steps"] = sum(b - a for a, b, _ in timed)
        result["window_rates"] = [round(r, 1) for _, _, r in timed]
        if WORKLOADS[workload][3] == "tok":
            result["tokens_per_second"] = result["samples_per_second"] * 1024
    probe = PROBE_LINE.search(text)
    if probe:
        result["probe_busbw_gbps"] = float(probe.group(1))
    profile = PROFILE_LINE.search(text)
    if profile:
        result["network_profile"] = profile.group(2)
    stalls = [float(m.group(2)) for m in CKPT_LINE.finditer(text)]
    if stalls:
        result["final_checkpoint_stall_s"] = stalls[-1]
    return result


# -------------------------------------------------------------------------------------------- table
def rate_of(r: dict[str, Any]) -> float:
    """Throughput in the workload's unit per second: images, or tokens (samples x sequence length)."""
    unit = WORKLOADS.get(r["workload"], ("", False, 0, "img"))[3]
    seq = r.get("sequence_length") or (64 if SMOKE else 1024)
    return float(r["samples_per_second"]) * (seq if unit == "tok" else 1)


def pct(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f} %"


def fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows for every (workload, GPU count, implementation) with a throughput: per-GPU throughput,
    scaling = per-GPU throughput on N GPUs / on 1 GPU of the same implementation (100 % at N = 1),
    ratio = this implementation / bare DDP at the same N; MFU for GPT; the issue-#7 target checks.

    Results may come from several calls (``--table a.jsonl b.jsonl``: each result's ``_src``): the
    references are taken from the same call when it has them, else from another, and then flagged
    ``cross_call`` (another machine, perhaps: the numbers are not comparable then)."""

    def find(impl: str, workload: str, gpus: int, src: Any = None) -> tuple[dict[str, Any] | None, bool]:
        candidates = [
            r
            for r in results
            if r.get("impl") == impl
            and r.get("workload") == workload
            and r.get("world_size") == gpus
            and r.get("samples_per_second")
        ]
        same = [r for r in candidates if r.get("_src") == src]
        if same:
            return same[0], False
        return (candidates[0], True) if candidates else (None, False)

    flops = next((r["flops_per_token"] for r in results if r.get("flops_per_token")), None)
    sizes = sorted({int(r["world_size"]) for r in results if r.get("samples_per_second")})
    rows: list[dict[str, Any]] = []
    for workload in TABLE_WORKLOADS:
        unit = WORKLOADS[workload][3]
        for gpus in sizes:
            for impl in IMPLS:
                r, _ = find(impl, workload, gpus)
                if r is None:
                    continue
                src = r.get("_src")
                rate = rate_of(r)
                per_gpu = rate / gpus
                row: dict[str, Any] = {
                    "workload": workload,
                    "world_size": gpus,
                    "impl": impl,
                    "unit": unit,
                    "rate": rate,
                    "per_gpu": per_gpu,
                    "samples_per_second": r["samples_per_second"],
                    "scaling_pct": None,
                    "ratio_to_bare_pct": None,
                    "mfu_pct": None,
                    "rc": r.get("rc", 0),
                    "timed_steps": r.get("timed_steps", r.get("steps")),
                    "nvml_peak_gib": r.get("nvml_peak_gib"),
                    "peak_allocated_gib": r.get("peak_allocated_gib"),
                    "network_profile": r.get("network_profile"),
                    "probe_busbw_gbps": r.get("probe_busbw_gbps"),
                    "cross_call": [],
                }
                if src is not None:
                    row["source"] = src
                one, cross = find(impl, workload, 1, src)
                if one is not None:
                    row["scaling_pct"] = 100.0 * per_gpu / rate_of(one)
                    if cross:
                        row["cross_call"].append("scaling")
                if impl != "bare":
                    bare, cross = find("bare", workload.removesuffix("-w8"), gpus, src)
                    if bare is not None:
                        row["ratio_to_bare_pct"] = (
                            100.0 * r["samples_per_second"] / bare["samples_per_second"]
                        )
                        if cross:
                            row["cross_call"].append("ratio")
                if unit == "tok" and flops:
                    row["mfu_pct"] = 100.0 * per_gpu * flops / (PEAK_BF16_TFLOPS * 1e12)
                rows.append(row)

    targets: list[dict[str, Any]] = []
    eager_multi = [r for r in rows if r["workload"] == "resnet50" and r["world_size"] > 1]
    for impl in ("bare", "ray"):
        candidates = [r for r in eager_multi if r["impl"] == impl and r["scaling_pct"] is not None]
        if candidates:
            top = max(candidates, key=lambda r: r["world_size"])
            targets.append(
                {
                    "target": f"ResNet-50 eager scaling >= {TARGET_SCALING_PCT:.0f} % at 8 GPUs",
                    "impl": impl,
                    "world_size": top["world_size"],
                    "value_pct": top["scaling_pct"],
                    "met": top["scaling_pct"] >= TARGET_SCALING_PCT,
                    "final": top["world_size"] >= 8,
                }
            )
    for r in rows:
        if r["impl"] == "ray" and r["ratio_to_bare_pct"] is not None and not r["workload"].endswith("-w8"):
            targets.append(
                {
                    "target": f"trainer (Ray) >= {TARGET_RATIO_PCT:.0f} % of bare DDP",
                    "impl": "ray",
                    "workload": r["workload"],
                    "world_size": r["world_size"],
                    "value_pct": r["ratio_to_bare_pct"],
                    "met": r["ratio_to_bare_pct"] >= TARGET_RATIO_PCT,
                    "final": True,
                }
            )
    by_key = {(r["workload"], r["world_size"], r["impl"]): r for r in rows}
    for r in rows:
        bare = by_key.get((r["workload"], r["world_size"], "bare"))
        if r["impl"] != "ray" or r["world_size"] < 2 or bare is None:
            continue
        if r["scaling_pct"] is None or bare["scaling_pct"] is None:
            continue
        gap = bare["scaling_pct"] - r["scaling_pct"]
        targets.append(
            {
                "target": f"trainer (Ray) scaling within {TARGET_SCALING_GAP:.0f} point of bare DDP's",
                "impl": "ray",
                "workload": r["workload"],
                "world_size": r["world_size"],
                "value": gap,
                "unit": "points behind",
                "met": gap <= TARGET_SCALING_GAP,
                "final": True,
            }
        )
    for r in results:
        if r.get("impl") == "recovery" and r.get("kill_to_first_step_s") is not None:
            targets.append(
                {
                    "target": f"recovery (kill -> first step after the resume) <= {TARGET_RECOVERY_S:.0f} s",
                    "impl": "ray",
                    "workload": r.get("workload"),
                    "world_size": r.get("world_size"),
                    "value": r["kill_to_first_step_s"],
                    "unit": "s",
                    "met": r["kill_to_first_step_s"] <= TARGET_RECOVERY_S,
                    "final": True,
                }
            )
    allreduce = [
        {key: r.get(key) for key in ("kind", "world_size", "mib", "busbw_gbps", "ms", "profile", "_src")}
        for r in results
        if r.get("impl") == "allreduce"
    ]
    machines = [r for r in results if r.get("impl") == "machine"]
    return {
        "flops_per_token": flops,
        "rows": rows,
        "targets": targets,
        "allreduce": sorted(allreduce, key=lambda r: (r["world_size"] or 0, r["kind"] or "", r["mib"] or 0)),
        "machines": machines,
    }


def card_name(results: list[dict[str, Any]], fallback: str = "(unknown card)") -> str:
    machines = sorted({r["gpu_name"] for r in results if r.get("impl") == "machine" and r.get("gpu_name")})
    if machines:
        return "; ".join(machines)
    return next((r["gpu"] for r in results if r.get("gpu")), fallback)


def build_table(results: list[dict[str, Any]], skipped: list[str], gpu_name: str) -> str:
    summary = summarize(results)
    flops = summary["flops_per_token"]
    rows = summary["rows"]
    lines = [
        f"Card: {gpu_name}. Throughput after {WARMUP} warm-up steps over {STEPS} steps; "
        "per GPU = total / GPUs;",
        "scaling = per-GPU throughput on N GPUs / on 1 GPU of the same implementation; "
        "ratio = trainer / bare DDP",
        "at the same GPU count; * = the reference comes from another call (maybe another machine).",
    ]
    if flops:
        lines.append(
            "MFU = tokens/s x FLOPs per token / (989 TFLOP/s x GPUs), FLOPs per token = "
            f"6N + 12 L H Q T = {flops / 1e6:.1f} M"
        )
    if rows:
        lines += [
            "",
            "| workload | GPUs | impl | total | per GPU | scaling | ratio to bare | MFU "
            "| peak mem GiB (NVML / allocated) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
    for row in rows:
        scaling = "" if row["world_size"] == 1 else pct(row["scaling_pct"])
        if scaling and "scaling" in row["cross_call"]:
            scaling += " *"
        ratio = pct(row["ratio_to_bare_pct"])
        if ratio and "ratio" in row["cross_call"]:
            ratio += " *"
        mem_text = " / ".join(
            f"{v:.1f}" if v else "-" for v in (row["nvml_peak_gib"], row["peak_allocated_gib"])
        )
        label = (
            row["impl"]
            if row["rc"] == 0
            else f"{row['impl']} (rc={row['rc']}, killed at the deadline?: {row['timed_steps']} steps)"
        )
        lines.append(
            f"| {row['workload']} | {row['world_size']} | {label} | {row['rate']:,.0f} {row['unit']}/s "
            f"| {row['per_gpu']:,.0f} | {scaling} | {ratio} | {pct(row['mfu_pct'])} | {mem_text} |"
        )

    # The scaling table of issue #7: one line per workload and GPU count, bare DDP next to the trainer.
    sizes = sorted({row["world_size"] for row in rows})
    trainer_impls = [impl for impl in ("ray", "launch") if any(row["impl"] == impl for row in rows)]
    if len(sizes) > 1 or trainer_impls:
        head = "| workload | GPUs | bare DDP | scaling |"
        rule = "| --- | --- | --- | --- |"
        for impl in trainer_impls:
            head += f" trainer ({'Ray Train' if impl == 'ray' else 'torchrun'}) | scaling | / bare |"
            rule += " --- | --- | --- |"
        lines += ["", "Scaling (per-GPU throughput against 1 GPU) and trainer / bare DDP:", "", head, rule]
        by_key = {(row["workload"], row["world_size"], row["impl"]): row for row in rows}
        for workload in TABLE_WORKLOADS:
            for gpus in sizes:
                cells = []
                for impl in ("bare", *trainer_impls):
                    row = by_key.get((workload, gpus, impl))
                    if row is None:
                        cells += ["", ""] + ([""] if impl != "bare" else [])
                        continue
                    scaling = "" if gpus == 1 else pct(row["scaling_pct"])
                    if scaling and "scaling" in row["cross_call"]:
                        scaling += " *"
                    partial = "" if row["rc"] == 0 else f" (rc={row['rc']}, {row['timed_steps']} steps)"
                    cells += [f"{row['per_gpu']:,.0f} {row['unit']}/s/GPU{partial}", scaling]
                    if impl != "bare":
                        ratio = pct(row["ratio_to_bare_pct"])
                        cells.append(ratio + (" *" if ratio and "ratio" in row["cross_call"] else ""))
                if any(cells):
                    lines.append(f"| {workload} | {gpus} | " + " | ".join(cells) + " |")
    if summary["targets"]:
        lines += ["", "Targets (issues #7 and #21):"]
        for t in summary["targets"]:
            gpus = f"{t['world_size']} GPU{'s' if t['world_size'] > 1 else ''}"
            where = f"{t.get('workload', 'resnet50')}, {gpus}, {t['impl']}"
            verdict = "met" if t["met"] else "MISSED"
            if not t["final"]:
                verdict += f" (at {t['world_size']} GPUs; the target is for 8)"
            value = f"{t['value_pct']:.1f} %" if "value_pct" in t else f"{t['value']:.1f} {t['unit']}"
            lines.append(f"- {t['target']}: {where}: {value} -> {verdict}")

    ar = summary["allreduce"]
    if ar:
        lines += [
            "",
            "| all-reduce | GPUs | MiB | bus bandwidth GB/s | ms per op | network profile |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for r in ar:
            lines.append(
                f"| {r['kind']} | {r['world_size']} | {r['mib']} | {fmt(r['busbw_gbps'], 1)} "
                f"| {fmt(r['ms'], 3)} | {r.get('profile') or ''} |"
            )
        for row in rows:
            if row["probe_busbw_gbps"]:
                lines.append(
                    f"| trainer start-up probe ({row['impl']}, {row['workload']}) | {row['world_size']} "
                    f"| 256 | {row['probe_busbw_gbps']:.1f} | | {row['network_profile'] or ''} |"
                )
    ck = [r for r in results if r.get("impl") == "checkpoint"]
    if ck:
        lines += [
            "",
            "| checkpoint mode | workload | GPUs | stall s (median) | cost s (median) "
            "| cost s (each, in order) "
            "| overhead every 60 s (median) | every 10 min |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in ck:
            lines.append(
                f"| {r['mode']} | {r['workload']}{' compiled' if r['compile'] else ''} | {r['world_size']} | "
                f"{r['stall_s']:.3f} | {r['cost_s']:.3f} | {', '.join(f'{c:.3f}' for c in r['costs_s'])} "
                f"| {r['overhead_at_60s_pct']:.2f} % "
                f"| {r['overhead_at_600s_pct']:.3f} % |"
            )
    for r in (r for r in results if r.get("impl") == "recovery"):
        num = {key: f"{value:.1f}" for key, value in r.items() if isinstance(value, float)}
        lines += [
            "",
            f"Recovery (Ray Train, {r['world_size']} GPUs, {r['workload']}, rc={r.get('rc')}): "
            f"worker killed -> restarted group's first line {num.get('kill_to_new_group_s', '-')} s (Ray "
            f"Train: detection, teardown, new workers) -> resumed from step {r.get('resumed_from_step')} at "
            f"{num.get('kill_to_resume_s', '-')} s (runtime {num.get('restart_runtime_s', '-')} s, "
            f"model {num.get('restart_build_s', '-')} s, Trainer set-up "
            f"{num.get('restart_trainer_setup_s', '-')} s, checkpoint load) -> first step "
            f"after the resume {num.get('kill_to_first_step_s', '-')} s (first report, step "
            f"{r.get('first_report_step')}: {num.get('kill_to_first_report_s', '-')} s).",
        ]
    lines += diagnosis.ab_table(results)
    lines += diagnosis.ladder_table(results)
    lines += diagnosis.noise_table(results)
    lines += diagnosis.gpu_process_lines(results)
    if skipped:
        lines += ["", "Not run: " + ", ".join(skipped)]
    return "\n".join(lines)


def load_results(paths: list[str]) -> list[dict[str, Any]]:
    """results.jsonl files; with several, each result is tagged with its file (``_src``)."""
    results = []
    for path in paths:
        for line in pathlib.Path(path).read_text().splitlines():
            if line.strip():
                result = json.loads(line)
                if len(paths) > 1:
                    result["_src"] = path
                results.append(result)
    return results


# --------------------------------------------------------------------------------------------- main
def visible_gpus() -> int:
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:  # no torch here: the smoke test needs none in this process
        return 0


def main(argv: list[str] | None = None) -> int:
    global WARMUP, STEPS, LADDER_RUNGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "out" / "gpu"))
    parser.add_argument("--deadline-s", type=float, default=540.0, help="seconds from --t0 (default: now)")
    parser.add_argument("--t0", type=float, default=None, help="epoch seconds the budget counts from")
    parser.add_argument("--only", default=None, help="comma-separated phases, in the order to run them")
    parser.add_argument(
        "--gpus",
        default=None,
        help="GPU counts of the default phases and of allreduce (default: 1,2,4.. up to all)",
    )
    parser.add_argument(
        "--workloads",
        default=",".join(TRAINER_WORKLOADS),
        help=f"workloads of the bare and trainer phases, from {','.join(TRAINER_WORKLOADS)}",
    )
    parser.add_argument(
        "--recovery-gpus", type=int, default=2, help="rayN with this N runs the recovery test (0: none)"
    )
    parser.add_argument("--table", nargs="+", default=None, help="render the table of results.jsonl file(s)")
    parser.add_argument("--json", action="store_true", help="with --table: print the summary as JSON")
    parser.add_argument("--dry-run", action="store_true", help="print the phases that would run, and exit")
    parser.add_argument(
        "--assume-gpus", type=int, default=None, help="with --dry-run: plan for a machine with this many GPUs"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny CPU models: a test of this script")
    parser.add_argument("--warmup", type=int, default=WARMUP, help="warm-up steps of every measured run")
    parser.add_argument("--steps", type=int, default=STEPS, help="timed steps of every measured run")
    parser.add_argument(
        "--diagnose-gpus",
        type=int,
        default=2,
        help="bareN/rayN with this N are traced, rayN runs A/B (0: none)",
    )
    parser.add_argument(
        "--trace-steps", type=int, default=10, help="steps in each trace window (0: no trace)"
    )
    parser.add_argument(
        "--trace-workload",
        default="resnet50",
        help="the workload whose bareN/rayN runs (N = --diagnose-gpus) are traced",
    )
    parser.add_argument(
        "--ab-variants",
        default=diagnosis.DEFAULT_AB_VARIANTS,
        help="runtime-switch variants of the A/B blocks ('' for none)",
    )
    parser.add_argument("--ab-steps", type=int, default=20, help="steps per A/B block")
    parser.add_argument("--ab-rounds", type=int, default=2, help="rounds of the A/B variants")
    parser.add_argument("--ladder-rungs", default=LADDER_RUNGS, help="rungs of the ladderN phases")
    args = parser.parse_args(argv)
    WARMUP, STEPS, LADDER_RUNGS = args.warmup, args.steps, args.ladder_rungs
    if args.smoke:
        set_smoke()
    if args.table:
        results = load_results(args.table)
        if args.json:
            print(json.dumps(summarize(results), indent=1))
        else:
            print(build_table(results, [], card_name(results)))
        return 0

    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in TRAINER_WORKLOADS]
    if unknown:
        parser.error(f"--workloads: unknown {unknown}; choose from {', '.join(TRAINER_WORKLOADS)}")
    if args.assume_gpus is not None and not args.dry_run:
        parser.error("--assume-gpus only plans (--dry-run)")
    available = args.assume_gpus if args.assume_gpus is not None else None if args.smoke else visible_gpus()
    if available == 0:
        parser.error("no GPU visible here (torch.cuda.device_count() == 0); --smoke runs on CPU")
    try:
        if args.gpus:
            gpus = parse_gpus(args.gpus)
        else:
            gpus = [1, 2] if available is None else default_gpus(available)
        if args.only:
            phases = [parse_phase(p) for p in args.only.split(",") if p.strip()]
        else:
            phases = default_phases(gpus)
    except ValueError as exc:
        parser.error(str(exc))
    runs, dropped = plan_phases(phases, gpus, available)
    elapsed = time.time() - (args.t0 or time.time())
    sampler = GpuSampler()
    suite = Suite(
        out=pathlib.Path(args.out),
        deadline=time.monotonic() + args.deadline_s - elapsed,
        sampler=sampler,
        recovery_gpus=args.recovery_gpus,
        diagnose_gpus=args.diagnose_gpus,
        trace_steps=args.trace_steps,
        trace_workload=args.trace_workload,
        ab_variants=tuple(v.strip() for v in args.ab_variants.split(",") if v.strip()),
        ab_steps=args.ab_steps,
        ab_rounds=args.ab_rounds,
    )
    if args.dry_run:
        print(json.dumps({"gpus": gpus, "available": available, "workloads": workloads, "dropped": dropped}))
        total = RAY_START_S if any(p.kind == "ray" for p, _ in runs) else 0.0
        for phase, n in runs:
            seconds = suite.phase_estimate(phase, n, workloads)
            for workload in [phase.workload] if phase.workload else workloads:
                if phase.kind in ("bare", "ray", "launch"):
                    suite.compiled(phase.kind, workload, n)
            total += seconds
            print(f"{phase.label(n)}\t~{seconds:.0f} s")
        print(
            f"total\t~{total:.0f} s of the suite's deadline (--deadline-s {args.deadline_s:.0f}, from --t0)"
        )
        return 0

    for key, value in NO_MULTICAST.items():
        if os.environ.get(key) != value:
            print(f"suite: setting {key}={value} (was {os.environ.get(key)!r})", flush=True)
            os.environ[key] = value
    # Ray 2.60's `ray start` turns token authentication on unless told otherwise; drivers here carry no token.
    os.environ["RAY_AUTH_MODE"] = "disabled"
    suite.out.mkdir(parents=True, exist_ok=True)
    sampler.start()
    suite.skipped.extend(dropped)
    for what in dropped:
        print(f"suite: not running {what}", flush=True)
    gpu_name = f"{len(sampler.names)}x {sampler.names[0]}" if sampler.names else "unknown"
    suite.record(
        {
            "impl": "machine",
            "gpu_name": gpu_name,
            "gpu_count": available,
            "cpu_count": os.cpu_count(),
            "gpus": gpus,
            "workloads": workloads,
            "phases": [p.label(n) for p, n in runs],
            "recovery_gpus": args.recovery_gpus,
            "warmup": WARMUP,
            "steps": STEPS,
            "diagnose_gpus": args.diagnose_gpus,
            "ab_variants": list(suite.ab_variants),
        }
    )
    print(f"suite: {gpu_name}; GPU counts {gpus}; workloads {workloads}; {suite.left():.0f}s", flush=True)
    # The GPT warm-up process (GPU 1) only helps when bare1 compiles ResNet-50 on GPU 0 at the same time, and
    # the cache is still cold (no bare phase on more GPUs before it).
    bare_counts = [n for p, n in runs if p.kind == "bare"]
    warm = (
        not SMOKE
        and (available or 0) >= 2
        and {"resnet50-compile", "gpt-compile"} <= set(workloads)
        and bare_counts[:1] == [1]
    )
    try:
        if any(p.kind == "ray" for p, _ in runs):
            suite.start_ray(0 if available is None else available)
        for phase, n in runs:
            selected = [phase.workload] if phase.workload else workloads
            if phase.kind == "bare" and n == 1 and warm:
                suite.start_warmer()
                # Compiled ResNet-50 first: it compiles cold while the warmer compiles GPT on GPU 1.
                suite.bare(1, sorted(selected, key=lambda w: w != "resnet50-compile"))
                suite.wait_warmer()
                continue
            suite.wait_warmer()
            if phase.kind == "allreduce":
                if not SMOKE:  # NCCL only
                    suite.allreduce(n)
            elif phase.kind == "bare":
                suite.bare(n, selected)
            elif phase.kind == "ladder":
                suite.ladder(n)
            elif phase.kind == "ray" and phase.w8:
                suite.trainer("ray", n, "resnet50-compile-w8")
            elif phase.kind in ("ray", "launch"):
                for workload in selected:
                    recovery = phase.kind == "ray" and workload == "resnet50" and n == suite.recovery_gpus
                    suite.trainer(phase.kind, n, workload, recovery=recovery)
            elif phase.kind == "ckpt":
                suite.ckpt(n)
    finally:
        suite.stop_ray()
        sampler.stop()
        finish(suite, sampler, gpu_name)
    return 0


def finish(suite: Suite, sampler: GpuSampler, gpu_name: str) -> None:
    """The call's files, at most 8 (the device tool returns no more): log.txt (run_all.sh), results.jsonl,
    table.md, summary.json, profile.md, profile.json, logs.tar.gz (every run's log, its config, nvml.csv),
    traces.tar.gz (rank 0's traces and every rank's process facts)."""
    out = suite.out
    profile = suite.finish_trace_summary()
    table = build_table(suite.results, suite.skipped, gpu_name)
    (out / "table.md").write_text(table + ("\n\n" + profile if profile else "") + "\n")
    summary = summarize(suite.results)
    summary["skipped"] = suite.skipped
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    with (suite.logs / "nvml.csv").open("w") as f:
        for t, gpu, used, util in sampler.samples:
            f.write(f"{t:.2f},{gpu},{used:.2f},{util:.0f}\n")
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
        tar.add(suite.logs, arcname="logs")
    shutil.rmtree(suite.logs)
    if suite.traces.is_dir():
        with tarfile.open(out / "traces.tar.gz", "w:gz") as tar:
            for path in sorted(suite.traces.rglob("*")):
                if path.is_file() and (path.name.startswith("rank0.") or path.name.endswith(".env.json")):
                    tar.add(path, arcname=str(path.relative_to(out)))
        shutil.rmtree(suite.traces)
    # The profile first, the table last: the device tool's reply shows the end of the output.
    print(("\n" + profile if profile else "") + "\n\n" + table, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
