"""Runtime switches: the few hot-path choices a benchmark compares side by side in one run (issue #21).

Each switch has a default (what the trainer does), alternatives a benchmark may set, and is read where it
is used, at every use (one dict lookup), so that ``bench_hooks``' A/B blocks can flip it between two steps
on every rank at once:

- ``input`` (``workloads.ImageToDevice``): how a uint8 image batch becomes the model's input on the GPU.
  ``fused`` (default): one kernel on the copy stream, ``images * (1/std) + (-mean/std)`` computed in float32
  and written once in the model's memory format and the autocast dtype (a quarter of ``lean``'s memory
  traffic; equal to ``(x - mean) / std`` up to float32 rounding). ``lean``: two kernels on the copy stream,
  the subtraction writing the float result straight in the model's memory format and the division writing the
  autocast dtype (bf16/fp16) when the job uses one, so the first convolution casts nothing. ``f32``: the path
  before issue #21 — a layout copy, a float conversion, an in-place subtraction and division, float32 out (the
  first convolution casts it on the training stream). ``lean`` and ``f32`` compute ``(x - mean) / std`` in
  float32, so their values are the same. On the CPU all three give ``lean``'s float32 values.
- ``prefetch`` (``data.DeviceBatches``): when the next batch's copy and normalisation may run on the copy
  stream. ``eager`` (default): at once. ``after``: once the training stream has done the work queued before
  it (the previous step, its backward and DDP's all-reduce), so that it overlaps the current step's forward
  and never the all-reduce. ``after`` was the hypothesis for the 2-GPU gap (issue #21) and measured 1.6 %
  slower than ``eager`` in the same processes (2x H200, 2026-11-27, docs/benchmarks-gpu.md). ``repeat`` is a
  diagnostic, not an equal computation: the loader is still read, but the step trains on the previous
  device batch again (no copy, no normalisation), so an A/B block shows what the input path costs the GPU.
- ``normalise`` (``data.DeviceBatches``, CUDA image batches): where ``input``'s normalisation kernel runs.
  ``step`` (default): the copy stream does only the batch's host-to-device copy; the kernel runs on the
  training stream when the step takes the batch, in line with the step's own kernels. ``copy``: on the copy
  stream right after the copy (the trainer before 2026-11-30). Measured on 2x H200 (round 18,
  docs/benchmarks-gpu.md): once a process has run the normalisation on the copy stream behind a copy, every
  later ResNet-50 step takes ~1.4 ms (2.5 %) more GPU time, even steps with no input path at all; a process
  that never does trains at bare DDP's speed (the trainer 100.3 % of bare DDP, eager, 2 GPUs).
- ``report_sync`` (``reporting.ReportWindow``, CUDA only): how a report window reads its numbers.
  ``lagged`` (default): nothing waits for the GPU; the window's loss sum is copied to pinned memory behind an
  event and a report gives the previous window's loss and rate (the rate over the device time between the
  window's two events); the last report of a run waits and gives its own. ``device``: ``.item()`` on the
  window's loss, which waits for the GPU; the host then starts the next steps with an empty queue. Measured
  (2x H200, 2026-11-27, docs/benchmarks-gpu.md): ``lagged`` 1.07 % faster in the same processes.
- ``control_every`` (``step_schedule.StepSchedule``): exchange the control flags every N steps (default 1,
  every step). With N > 1 every rank exchanges at the steps divisible by N, so they still agree; a clock or a
  signal is acted on up to 2N steps later instead of one.

- ``bucket_view`` (``parallelize.apply``, read once, when DDP wraps the model: a process-level choice).
  ``on`` (default): DDP's ``gradient_as_bucket_view`` (gradients are views into the all-reduce buckets, no
  copy into them). ``off``: DDP's own default, as in bench/gpu/bare_ddp.py.
- ``ddp_stats`` (``parallelize.time_ddp_start_only``, read once, when DDP wraps the model: a process-level
  choice). ``start`` (default): DDP times only its first 10 iterations for its runtime statistics
  (``DistributedDataParallel._get_ddp_logging_data``). ``sampled``: DDP's own default, which also times every
  100th iteration; the forward after it then waits for the previous iteration's CUDA events, so every 100
  steps the host loses its lead over the GPU and the GPU waits for the next launches (the dips every 100
  steps of issue #21, 2x H200, 2026-11-29, docs/benchmarks-gpu.md round 17). bench/gpu/bare_ddp.py keeps
  DDP's default unless ``BARE_DDP_STATS=start``.
- ``restarts`` (``ray_train.run``, read once, in the driver: a process-level choice). ``controller``
  (default): trainop's failure policy decides in-attempt restarts inside Ray Train's controller, which starts
  only a new worker group (``restart_policy``). ``driver``: the loop before 2026-11-27, every restart a new
  ``fit()`` (a new controller), for the side-by-side recovery benchmark (bench/gpu/i17_recovery.sh).
- ``failed_group`` (``restart_policy.PolicyTorchTrainer``, read once, in the driver: a process-level choice;
  controller restarts only). ``kill`` (default): a failed worker group's workers are killed at once
  (``restart_policy.FailedGroupStopper``). ``graceful``: Ray Train's own shutdown (up to 5 s for each
  worker's shutdown hooks, then a kill), for the side-by-side recovery benchmark.
- ``gc`` (``trainer.Collector``, read once when training starts). ``auto`` (default): Python's own
  garbage collector, which runs whenever allocations cross its thresholds, on each rank at its own moment;
  a collection holds the GIL, and a rank that pauses in it holds every other rank at the next all-reduce.
  ``synced``: what torchtitan does (its ``GarbageCollection``): one full collection and ``gc.freeze()``
  when training starts, automatic collection off, and a young-generation collection (``gc.collect(1)``)
  on every rank at the same steps (every ``trainer.GC_EVERY_STEPS``); the collector is put back as it was
  when training ends. The hypothesis for the compiled ResNet-50 gap on 4 GPUs (issue #21), measured by
  bench/gpu/i21_gc.sh.
- ``batch_memory`` (``data.make_loader``, read when a loader is made: a process-level choice; CUDA loaders
  with worker processes only). ``slots`` (default): each loader worker writes its batches into a few
  shared-memory slots it keeps (``data.SlotBatches``) and the main process keeps them mapped, so a batch
  costs the main process one copy into pinned memory. ``fresh``: the DataLoader's own way, a new
  shared-memory segment per batch that the main process maps, pins and unmaps; unmapping and freeing a
  38 MB batch holds the GIL for milliseconds in the DataLoader's pin-memory thread, time the training
  thread cannot launch kernels in (py-spy on 2x H200, 2026-11-28, docs/benchmarks-gpu.md).
- ``niceness`` (``ray_train.worker_env``, read once, in the driver: a process-level choice). ``training``
  (default): the Ray Train workers run at niceness 0 (``RAY_worker_niceness=0`` in their runtime env), as a
  process started by torchrun does. ``ray``: Ray's own default for worker processes, niceness 15 (Ray lowers
  its workers' priority so that its raylet and GCS stay responsive), which the training threads, the
  DataLoader's workers and its pin-memory thread then inherit: on a busy node any process at niceness 0
  (Ray's own, a node agent's) takes a shared core from them first. An explicit ``RAY_worker_niceness`` in the
  driver's environment is kept either way.
``TRAINOP_SWITCHES`` sets them for a process (``input=f32,control_every=4``; Ray workers get it from the
driver, see ``ray_train``). A job never needs to: the defaults are the trainer's choice. It must not hold
anything but these values.
"""

from __future__ import annotations

import os

from trainop_trainer import config as config_module

ENV = config_module.SWITCHES_ENV
INPUT_MODES = ("fused", "lean", "f32")
PREFETCH_MODES = ("eager", "after", "repeat")
NORMALISE_MODES = ("step", "copy")
REPORT_SYNC_MODES = ("lagged", "device")
BUCKET_VIEW_MODES = ("on", "off")
DDP_STATS_MODES = ("start", "sampled")
RESTART_MODES = ("controller", "driver")
FAILED_GROUP_MODES = ("kill", "graceful")
GC_MODES = ("auto", "synced")
BATCH_MEMORY_MODES = ("slots", "fresh")
NICENESS_MODES = ("training", "ray")
DEFAULTS: dict[str, str | int] = {
    "input": "fused",
    "prefetch": "eager",
    "normalise": "step",
    "report_sync": "lagged",
    "control_every": 1,
    "bucket_view": "on",
    "ddp_stats": "start",
    "restarts": "controller",
    "failed_group": "kill",
    "gc": "auto",
    "batch_memory": "slots",
    "niceness": "training",
}

_CHOICES = {
    "input": INPUT_MODES,
    "prefetch": PREFETCH_MODES,
    "normalise": NORMALISE_MODES,
    "report_sync": REPORT_SYNC_MODES,
    "bucket_view": BUCKET_VIEW_MODES,
    "ddp_stats": DDP_STATS_MODES,
    "restarts": RESTART_MODES,
    "failed_group": FAILED_GROUP_MODES,
    "gc": GC_MODES,
    "batch_memory": BATCH_MEMORY_MODES,
    "niceness": NICENESS_MODES,
}

# The values in force (module state, read at every use).
values: dict[str, str | int] = dict(DEFAULTS)


def parse(text: str) -> dict[str, str | int]:
    """``input=f32,control_every=4`` (also ``+`` between pairs) -> typed values; one sentence on bad input."""
    parsed: dict[str, str | int] = {}
    for pair in text.replace("+", ",").split(","):
        if not pair.strip():
            continue
        key, sep, raw = pair.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or key not in DEFAULTS:
            raise ValueError(
                f"{ENV}: {pair.strip()!r} is not a switch; use {', '.join(f'{k}=...' for k in DEFAULTS)}"
            )
        if key in _CHOICES:
            if raw not in _CHOICES[key]:
                raise ValueError(f"{ENV}: {key}={raw!r}; choose one of {', '.join(_CHOICES[key])}")
            parsed[key] = raw
        else:
            if not raw.isdigit() or int(raw) < 1:
                raise ValueError(f"{ENV}: {key}={raw!r}; use a whole number of steps, 1 or more")
            parsed[key] = int(raw)
    return parsed


def apply(settings: dict[str, str | int]) -> None:
    """Set switches (the rest keep their value)."""
    values.update(settings)


def reset() -> None:
    """The defaults, then whatever ``TRAINOP_SWITCHES`` says."""
    values.clear()
    values.update(DEFAULTS)
    values.update(parse(os.environ.get(ENV, "")))


def describe() -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(values.items()))


def input_mode() -> str:
    return str(values["input"])


def prefetch_mode() -> str:
    return str(values["prefetch"])


def normalise_on_step() -> bool:
    return values["normalise"] == "step"


def report_sync() -> str:
    return str(values["report_sync"])


def bucket_view() -> bool:
    return values["bucket_view"] == "on"


def ddp_stats_sampled() -> bool:
    return values["ddp_stats"] == "sampled"


def restarts_in_controller() -> bool:
    return values["restarts"] == "controller"


def kill_failed_group() -> bool:
    return values["failed_group"] == "kill"


def gc_mode() -> str:
    return str(values["gc"])


def batch_slots() -> bool:
    return values["batch_memory"] == "slots"


def training_niceness() -> bool:
    return values["niceness"] == "training"


def control_every() -> int:
    return int(values["control_every"])


reset()
