"""Benchmark hooks of the built-in train loop: off unless the environment asks for them (issue #21).

``BenchHooks.after_step(step)`` runs after every optimizer step on every rank and does, when asked:

- **a trace window**: ``TRAINOP_TRACE_STEPS=START:COUNT`` and ``TRAINOP_TRACE_DIR=DIR``. After step START
  every rank records the next COUNT steps under ``torch.profiler`` (CPU ops, and on GPUs the kernels,
  copies and NCCL kernels of every stream), each step inside a ``trainop.step#N`` range, and writes
  ``DIR/rank<r>.trace.json.gz`` (a Chrome trace: Perfetto opens it) and ``DIR/rank<r>.env.json`` (what the
  process ran with: ``process_facts``). ``bench/gpu/trace_summary.py`` turns the traces into a step-time
  breakdown. While the window records, ``section(name)`` marks parts of the loop (``trainop.data``,
  ``trainop.control``, ...); otherwise it is a shared no-op context (the hot loop pays one call).
- **A/B blocks**: ``TRAINOP_AB_BLOCKS=START:STEPS:VARIANT,VARIANT,...``. From step START, consecutive
  blocks of STEPS steps, each under one variant of ``switches`` (``input=f32+control_every=4``; ``default``
  is the defaults), in the order given. Every rank switches at the same steps; each block is bounded by a
  device synchronisation, and rank 0 logs ``ab block <variant> steps A-B: <ms> ms/step, <rate>
  samples/s``. After the last block the switches are back to their defaults.
- **a sync hunt**: ``TRAINOP_SYNC_DEBUG_STEPS=START:COUNT``. After step START, for COUNT steps, every rank
  runs with ``torch.cuda.set_sync_debug_mode("warn")`` and logs the Python stack of each distinct operation
  that made the host wait for the GPU (``sync point on rank R at step N``), so that a per-step or per-report
  synchronisation names its caller.
- **a step timeline**: ``TRAINOP_TIMELINE_STEPS=START:COUNT`` and ``TRAINOP_TIMELINE_DIR=DIR``. After step
  START (one device synchronisation there) every rank writes one line per step for the next COUNT steps to
  ``DIR/rank<r>.timeline.jsonl``: the wall clock, the host's time for the step and for each marked part of
  the loop (``section``), Python's garbage-collection pauses, the training thread's CPU time and context
  switches (voluntary and involuntary), the process's CPU time, the scheduler's account of the threads that
  launch and feed the step (the training thread, the autograd engine's, the pin-memory thread: time run,
  time waited for a CPU, time slices, the CPU last run on and its steal time), the steal time of every CPU
  (a virtual machine's CPU time taken by its hypervisor, ``/proc/stat``), and on GPUs the device's time for
  the step and the host's lead over the device (how long after the host finished queuing the step the device
  finished it: near 0 means the device waited for this rank's host). No profiler runs, so a sag over
  hundreds of steps can be read step by step and rank by rank; ``bench/gpu/timeline_summary.py`` finds the
  slow steps and what grew in them.

It must not change what a step computes (variants choose between equal computations; the one exception is
the ``prefetch=repeat`` diagnostic, which says so in ``switches``) nor decide what the step schedule decides.
The traces are for benchmarks: a job's on-demand profiling is the trainer's own feature, not this.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import gzip
import json
import logging
import os
import pathlib
import resource
import shutil
import threading
import time
import traceback
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from trainop_trainer import config as config_module
from trainop_trainer import distributed, switches

log = logging.getLogger(__name__)

TRACE_STEPS_ENV = config_module.TRACE_STEPS_ENV
TRACE_DIR_ENV = config_module.TRACE_DIR_ENV
AB_BLOCKS_ENV = config_module.AB_BLOCKS_ENV
SYNC_DEBUG_STEPS_ENV = config_module.SYNC_DEBUG_STEPS_ENV
TIMELINE_STEPS_ENV = config_module.TIMELINE_STEPS_ENV
TIMELINE_DIR_ENV = config_module.TIMELINE_DIR_ENV
# Variables that shape a training process's speed, written next to each trace.
_FACT_PREFIXES = ("NCCL_", "TORCH_NCCL_", "OMP_", "MKL_", "CUDA_", "PYTORCH_", "TORCHINDUCTOR_", "RAY_TRAIN_")

_recording = False
_timeline: Timeline | None = None  # while a step timeline records
_NO_SECTION = contextlib.nullcontext()


def section(name: str) -> contextlib.AbstractContextManager[Any]:
    """``trainop.<name>`` in the trace while a window records; its time in the step timeline while that
    records; a no-op otherwise."""
    if _recording:
        return torch.profiler.record_function("trainop." + name)
    if _timeline is not None:
        return _timeline.timer(name)
    return _NO_SECTION


def _task_names() -> Iterator[tuple[int, str]]:
    """(thread id, thread name) of each thread of this process, from ``/proc/self/task`` (none without it)."""
    task = pathlib.Path("/proc/self/task")
    for entry in task.iterdir() if task.is_dir() else []:
        try:
            yield int(entry.name), (entry / "comm").read_text().strip()
        except OSError:  # the thread has ended
            continue


def process_facts(device: torch.device) -> dict[str, Any]:
    """What a process trains with, beyond its code: threads, CPUs, devices, the variables that matter."""
    names: dict[str, int] = {}
    for _, name in _task_names():
        names[name] = names.get(name, 0) + 1
    facts: dict[str, Any] = {
        "pid": os.getpid(),
        "device": str(device),
        "cpu_count": os.cpu_count(),
        "cpus_allowed": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "threads": dict(sorted(names.items())),
        "gc_tracked_objects": len(gc.get_objects()),
        "gc_thresholds": list(gc.get_threshold()),
        "switches": switches.describe(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(_FACT_PREFIXES)},
    }
    if device.type == "cuda":
        facts["gpu"] = torch.cuda.get_device_name(device)
        try:  # a tuple in recent PyTorch, an int in older ones: a fact, never a failure
            version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
            facts["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except Exception as exc:
            facts["nccl"] = f"unknown ({exc})"
    return facts


class GcTimer:
    """Python's garbage collections (every generation) while installed: count, total and longest pause. A
    collection holds the GIL, so it stalls the training thread whichever thread triggered it."""

    def __init__(self) -> None:
        self._started: float | None = None
        self.reset()

    def reset(self) -> None:
        self.count = 0
        self.total_s = 0.0
        self.longest_s = 0.0
        self.by_generation = [0, 0, 0]

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            pause = time.perf_counter() - self._started
            self._started = None
            self.count += 1
            self.total_s += pause
            self.longest_s = max(self.longest_s, pause)
            self.by_generation[min(2, int(info.get("generation", 0)))] += 1

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def remove(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def describe(self) -> str:
        return (
            f"gc {self.count} collections (gen0/1/2 {'/'.join(map(str, self.by_generation))}), "
            f"{1e3 * self.total_s:.1f} ms, longest {1e3 * self.longest_s:.1f} ms"
        )


class _SectionClock:
    """One part of the loop while a timeline records: its time is added to the step's total for its name.
    One object per name, reused every step (the loop's parts do not nest)."""

    __slots__ = ("_name", "_started", "_totals")

    def __init__(self, name: str, totals: dict[str, float]) -> None:
        self._name = name
        self._totals = totals
        self._started = 0.0

    def __enter__(self) -> None:
        self._started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self._totals[self._name] = self._totals.get(self._name, 0.0) + time.perf_counter() - self._started


class _ThreadClock:
    """A thread's scheduler statistics from ``/proc/self/task/<tid>``: nanoseconds run on a CPU, nanoseconds
    waited on a run queue (ready but not running: another thread or process had the CPU), time slices, and
    the CPU it last ran on. Two ``pread`` of open files, a few microseconds."""

    def __init__(self, tid: int) -> None:
        self._schedstat = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
        self._stat = os.open(f"/proc/self/task/{tid}/stat", os.O_RDONLY)

    def read(self) -> tuple[int, int, int, int]:
        run, wait, slices = (int(v) for v in os.pread(self._schedstat, 128, 0).split()[:3])
        cpu = int(os.pread(self._stat, 1024, 0).rsplit(b")", 1)[1].split()[36])  # field 39: processor
        return run, wait, slices, cpu

    def close(self) -> None:
        os.close(self._schedstat)
        os.close(self._stat)


class _StealClock:
    """Steal time from ``/proc/stat``: how long a virtual machine's CPUs were ready to run while the
    hypervisor ran something else (ticks of ``SC_CLK_TCK``, 10 ms each). The guest's own scheduler cannot
    see it; it shows as a thread's instructions taking longer. Per CPU and over all of them."""

    def __init__(self) -> None:
        self._fd = os.open("/proc/stat", os.O_RDONLY)
        self._tick_ms = 1e3 / os.sysconf("SC_CLK_TCK")

    def read(self) -> dict[str, int]:
        """Steal ticks by ``/proc/stat`` line: ``cpu`` (every CPU), ``cpu0``, ``cpu1``, ..."""
        steal = {}
        for line in os.pread(self._fd, 1 << 16, 0).split(b"\n"):
            if line.startswith(b"cpu"):
                fields = line.split()
                steal[fields[0].decode()] = int(fields[8]) if len(fields) > 8 else 0
        return steal

    def ms(self, ticks: int) -> float:
        return ticks * self._tick_ms

    def close(self) -> None:
        os.close(self._fd)


def _steal_clock() -> _StealClock | None:
    try:
        return _StealClock()
    except OSError:  # no procfs
        return None


def _thread_clocks(device: torch.device) -> dict[str, _ThreadClock]:
    """The threads that launch a step's work and feed it: the training thread, the autograd engine's thread
    of this device (the backward pass launches from it) and the DataLoader's pin-memory thread."""
    wanted = {"pt_data_pin": "pin"}
    if device.type == "cuda":
        wanted[f"pt_autograd_{device.index or 0}"] = "autograd"
    tids = {"main": threading.get_native_id()}
    for tid, thread in _task_names():
        name = wanted.get(thread)
        if name is not None and name not in tids:
            tids[name] = tid
    clocks = {}
    for name, tid in tids.items():
        try:
            clocks[name] = _ThreadClock(tid)
        except OSError:  # no procfs, or the thread has ended
            continue
    return clocks


def _thread_usage() -> tuple[float, int, int]:
    """The calling thread's CPU seconds and its voluntary and involuntary context switches.

    The CPU time comes from the thread's CPU clock, which makes the kernel bring a running thread's run time
    up to date first. Without that, the run time that ``getrusage`` and ``/proc/.../schedstat`` report lags
    until the next scheduler tick or switch (up to 3.2 ms over a 20 ms window, measured on the 2-core dev
    box), so a step's ``run_ms`` could exceed its ``host_ms``. Called before the schedstat counters are
    read, it keeps them exact for this thread too."""
    cpu = time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID)
    usage = resource.getrusage(getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF))
    return cpu, usage.ru_nvcsw, usage.ru_nivcsw


class Timeline:
    """The step timeline of one rank (``TRAINOP_TIMELINE_STEPS``): one row per step, kept in memory (COUNT
    rows) and written when the window ends or training does."""

    def __init__(
        self, *, ctx: distributed.WorkerContext, start: int, count: int, directory: pathlib.Path
    ) -> None:
        self._ctx = ctx
        self._start = start
        self._count = count
        self._dir = directory
        self._cuda = ctx.device.type == "cuda"
        self._totals: dict[str, float] = {}
        self._clocks: dict[str, _SectionClock] = {}
        self._gc = GcTimer()
        self._rows: list[dict[str, Any]] = []
        self._events: list[Any] = []  # on GPUs: one per mark, on the training stream
        self._host_marks: list[float] = []
        self._last: tuple[float, float, float, int, int] | None = None  # host, process CPU, thread usage
        self._threads: dict[str, _ThreadClock] = {}
        self._thread_last: dict[str, tuple[int, int, int, int]] = {}
        self._steal: _StealClock | None = None
        self._steal_last: dict[str, int] = {}
        self.done = False

    def timer(self, name: str) -> _SectionClock:
        clock = self._clocks.get(name)
        if clock is None:
            clock = self._clocks[name] = _SectionClock(name, self._totals)
        return clock

    def _event(self) -> Any:
        if not self._cuda:
            return None
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(self._ctx.device))
        return event

    def _mark(
        self,
        now: float,
        usage: tuple[float, int, int],
        threads: dict[str, tuple[int, int, int, int]],
        steal: dict[str, int],
    ) -> None:
        """The start of the next step: the counters read at the end of this one."""
        self._events.append(self._event())
        self._host_marks.append(now)
        self._last = (now, time.process_time(), *usage)
        self._thread_last = threads
        self._steal_last = steal
        self._totals.clear()
        self._gc.reset()

    def _read_threads(self) -> dict[str, tuple[int, int, int, int]]:
        """Each followed thread's counters; a thread that has ended (a DataLoader's pin-memory thread at an
        epoch's end) is followed no more."""
        counters = {}
        for name, clock in list(self._threads.items()):
            try:
                counters[name] = clock.read()
            except OSError:
                clock.close()
                del self._threads[name]
        return counters

    def _read_steal(self) -> dict[str, int]:
        return self._steal.read() if self._steal is not None else {}

    def after_step(self, step: int) -> None:
        global _timeline
        if self.done:
            return
        if self._last is None:
            if step != self._start:
                return
            if self._cuda:
                torch.cuda.synchronize(self._ctx.device)  # the lead is measured from an empty queue
            self._gc.install()
            self._threads = _thread_clocks(self._ctx.device)
            self._steal = _steal_clock()
            self._mark(time.perf_counter(), _thread_usage(), self._read_threads(), self._read_steal())
            _timeline = self
            return
        host, process_cpu, thread_cpu, voluntary, involuntary = self._last
        now = time.perf_counter()
        usage = _thread_usage()
        cpu, voluntary_now, involuntary_now = usage
        counters = self._read_threads()  # right after the thread's CPU clock, as at the first mark
        steal = self._read_steal()
        threads = {}
        for name, (run, wait, slices, on_cpu) in counters.items():
            run0, wait0, slices0, _ = self._thread_last[name]
            threads[name] = {
                "run_ms": round((run - run0) / 1e6, 4),
                "wait_ms": round((wait - wait0) / 1e6, 4),
                "slices": slices - slices0,
                "cpu": on_cpu,
            }
            if self._steal is not None:  # on the CPU the thread last ran on
                line = f"cpu{on_cpu}"
                threads[name]["steal_ms"] = self._steal.ms(steal.get(line, 0) - self._steal_last.get(line, 0))
        self._rows.append(
            {
                "step": step,
                "wall": time.time(),
                "host_ms": round(1e3 * (now - host), 4),
                "sections_ms": {k: round(1e3 * v, 4) for k, v in self._totals.items()},
                "gc_ms": round(1e3 * self._gc.total_s, 4),
                "gc_count": self._gc.count,
                "thread_cpu_ms": round(1e3 * (cpu - thread_cpu), 4),
                "process_cpu_ms": round(1e3 * (time.process_time() - process_cpu), 4),
                "voluntary_switches": voluntary_now - voluntary,
                "involuntary_switches": involuntary_now - involuntary,
                "threads": threads,
                "steal_ms": self._steal.ms(steal.get("cpu", 0) - self._steal_last.get("cpu", 0))
                if self._steal is not None
                else None,
            }
        )
        self._mark(now, usage, counters, steal)
        if step >= self._start + self._count:
            self.close()

    def close(self) -> None:
        """Stop recording; the rows so far are written (a benchmark's timeline never ends a run)."""
        global _timeline
        if self.done:
            return
        self.done = True
        if _timeline is self:
            _timeline = None
        self._gc.remove()
        for clock in self._threads.values():
            clock.close()
        if self._steal is not None:
            self._steal.close()
        if self._last is None:
            return
        try:
            self._write()
        except Exception as exc:
            log.warning("step timeline of rank %d not written: %s", self._ctx.rank, exc)

    def _write(self) -> None:
        if self._cuda:
            torch.cuda.synchronize(self._ctx.device)
            first = self._events[0]
            device_s = [first.elapsed_time(event) / 1e3 for event in self._events]
            for index, row in enumerate(self._rows, start=1):
                row["device_ms"] = round(1e3 * (device_s[index] - device_s[index - 1]), 4)
                # When the device finished the step, less when the host finished queuing it.
                row["lead_ms"] = round(
                    1e3 * (device_s[index] - (self._host_marks[index] - self._host_marks[0])), 4
                )
        self._dir.mkdir(parents=True, exist_ok=True)
        path = self._dir / f"rank{self._ctx.rank}.timeline.jsonl"
        head = {
            "rank": self._ctx.rank,
            "world_size": self._ctx.world_size,
            "start": self._start,
            "steps": len(self._rows),
            "facts": process_facts(self._ctx.device),
        }
        with path.open("w") as f:
            f.write(json.dumps(head) + "\n")
            for row in self._rows:
                f.write(json.dumps(row) + "\n")
        if self._ctx.is_rank0:
            log.info("step timeline of %d steps written to %s", len(self._rows), self._dir)


def _window(env: str) -> tuple[int, int] | None:
    """``START:COUNT`` from ``env`` (None when unset); one sentence when malformed."""
    text = os.environ.get(env, "").strip()
    if not text:
        return None
    start, _, count = text.partition(":")
    if not (start.isdigit() and count.isdigit() and int(count) > 0):
        raise ValueError(f"{env}={text!r}: expected START:COUNT, e.g. 140:10")
    return int(start), int(count)


class SyncHunt:
    """While started: CUDA's sync debug mode on; each distinct Python stack that synchronised, logged once."""

    def __init__(self, *, rank: int, step: int) -> None:
        self.rank = rank
        self.step = step
        self._seen: set[str] = set()
        self._previous: Any = None
        self._saved: warnings.catch_warnings[None] | None = None

    def start(self) -> None:
        self._saved = warnings.catch_warnings()  # filters and showwarning come back on stop
        self._saved.__enter__()
        self._previous = warnings.showwarning
        warnings.showwarning = self._show
        warnings.simplefilter("always", UserWarning)
        torch.cuda.set_sync_debug_mode("warn")

    def stop(self) -> None:
        """Sync debug mode off; the warnings machinery as it was before ``start``."""
        torch.cuda.set_sync_debug_mode("default")
        if self._saved is not None:
            self._saved.__exit__(None, None, None)
            self._saved = None
        self._previous = None
        log.info("sync hunt on rank %d: %d distinct synchronising stacks", self.rank, len(self._seen))

    def _show(self, message: Any, category: Any, filename: str, lineno: int, *rest: Any, **kw: Any) -> None:
        if "synchroniz" not in str(message):
            if self._previous is not None:
                self._previous(message, category, filename, lineno, *rest, **kw)
            return
        stack = "".join(traceback.format_stack(limit=14)[:-1])
        if stack in self._seen:
            return
        self._seen.add(stack)
        log.warning("sync point on rank %d at step %d: %s\n%s", self.rank, self.step, message, stack)


@dataclasses.dataclass(frozen=True)
class AbPlan:
    start: int
    steps: int
    variants: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> AbPlan:
        try:
            start, steps, names = text.split(":", 2)
            plan = cls(int(start), int(steps), tuple(v.strip() for v in names.split(",") if v.strip()))
        except ValueError:
            plan = cls(0, 0, ())
        if plan.start < 0 or plan.steps < 1 or not plan.variants:
            raise ValueError(
                f"{AB_BLOCKS_ENV}={text!r}: expected START:STEPS:VARIANT,VARIANT,... "
                "(e.g. 100:20:input=f32,default)"
            )
        for variant in plan.variants:
            if variant != "default":
                switches.parse(variant)  # a bad variant fails at start-up, not mid-run
        return plan

    def boundary(self, step: int) -> int | None:
        """The index of the block that starts after ``step`` (len(variants): the end), or None."""
        offset = step - self.start
        if offset < 0 or offset % self.steps:
            return None
        index = offset // self.steps
        return index if index <= len(self.variants) else None


class BenchHooks:
    def __init__(
        self,
        *,
        ctx: distributed.WorkerContext,
        samples_per_step: int,
        trace: tuple[int, int] | None = None,
        trace_dir: pathlib.Path | None = None,
        ab: AbPlan | None = None,
        sync_debug: tuple[int, int] | None = None,
        timeline: Timeline | None = None,
    ) -> None:
        self._ctx = ctx
        self._timeline = timeline
        self._sync_debug = sync_debug
        self._sync_hunt: SyncHunt | None = None
        self._samples_per_step = samples_per_step  # over every rank
        self._trace = trace
        self._trace_dir = trace_dir
        self._ab = ab
        self._profiler: Any = None
        self._step_range: Any = None
        self._traced = 0
        self._block: tuple[str, int, float] | None = None  # (variant, first step, start time)
        self._gc = GcTimer()

    @classmethod
    def from_env(cls, *, ctx: distributed.WorkerContext, samples_per_step: int) -> BenchHooks:
        trace: tuple[int, int] | None = None
        trace_dir: pathlib.Path | None = None
        trace = _window(TRACE_STEPS_ENV)
        if trace is not None:
            trace_dir = pathlib.Path(os.environ.get(TRACE_DIR_ENV) or "trainop-trace")
        ab_text = os.environ.get(AB_BLOCKS_ENV, "").strip()
        ab = AbPlan.parse(ab_text) if ab_text else None
        timeline_window = _window(TIMELINE_STEPS_ENV)
        timeline = None
        if timeline_window is not None:
            timeline = Timeline(
                ctx=ctx,
                start=timeline_window[0],
                count=timeline_window[1],
                directory=pathlib.Path(os.environ.get(TIMELINE_DIR_ENV) or "trainop-timeline"),
            )
        return cls(
            ctx=ctx,
            samples_per_step=samples_per_step,
            trace=trace,
            trace_dir=trace_dir,
            ab=ab,
            sync_debug=_window(SYNC_DEBUG_STEPS_ENV),
            timeline=timeline,
        )

    @property
    def enabled(self) -> bool:
        return (
            self._trace is not None
            or self._ab is not None
            or self._sync_debug is not None
            or self._timeline is not None
        )

    def after_step(self, step: int) -> None:
        if not self.enabled:
            return
        if self._timeline is not None:  # first: its step ends before the other hooks' work
            self._timeline.after_step(step)
        self._gc.install()
        if self._ab is not None:
            self._ab_step(step, self._ab)
        if self._trace is not None:
            self._trace_step(step, *self._trace)
        if self._sync_debug is not None and self._ctx.device.type == "cuda":
            start, count = self._sync_debug
            if step == start:
                self._sync_hunt = SyncHunt(rank=self._ctx.rank, step=step)
                self._sync_hunt.start()
            elif self._sync_hunt is not None:
                self._sync_hunt.step = step
                if step >= start + count:
                    self._sync_hunt.stop()
                    self._sync_hunt = None

    def close(self) -> None:
        """Training ended: an open window is written with the steps it has, switches are reset."""
        if self._timeline is not None:
            self._timeline.close()
        if self._sync_hunt is not None:
            self._sync_hunt.stop()
            self._sync_hunt = None
        if self._profiler is not None:
            self._stop_trace()
        if self._block is not None:
            self._block = None
            switches.reset()
        self._gc.remove()

    # ------------------------------------------------------------------------------------------ A/B
    def _sync(self) -> None:
        if self._ctx.device.type == "cuda":
            torch.cuda.synchronize(self._ctx.device)

    def _ab_step(self, step: int, plan: AbPlan) -> None:
        index = plan.boundary(step)
        if index is None:
            return
        self._sync()
        now = time.perf_counter()
        if self._block is not None:
            variant, first, started = self._block
            seconds = now - started
            steps = step - first
            if self._ctx.is_rank0 and steps > 0:
                log.info(
                    "ab block %s steps %d-%d: %.3f ms/step, %.1f samples/s; %s",
                    variant,
                    first,
                    step,
                    1e3 * seconds / steps,
                    self._samples_per_step * steps / seconds,
                    self._gc.describe(),
                )
        switches.reset()
        if index == len(plan.variants):
            self._block = None
            return
        variant = plan.variants[index]
        if variant != "default":
            switches.apply(switches.parse(variant))
        self._gc.reset()
        self._block = (variant, step, time.perf_counter())

    # ---------------------------------------------------------------------------------------- trace
    def _trace_step(self, step: int, start: int, count: int) -> None:
        global _recording
        if self._profiler is None:
            if step != start:
                return
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self._ctx.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profiler = torch.profiler.profile(activities=activities)
            self._profiler.start()
            _recording = True
            self._gc.reset()
        else:
            self._step_range.__exit__(None, None, None)
            self._step_range = None
            self._traced += 1
            if self._traced >= count:
                self._stop_trace()
                return
        self._step_range = torch.profiler.record_function(f"trainop.step#{step + 1}")
        self._step_range.__enter__()

    def _stop_trace(self) -> None:
        global _recording
        assert self._trace_dir is not None
        if self._step_range is not None:  # training ended inside the window
            self._step_range.__exit__(None, None, None)
            self._step_range = None
        self._sync()
        self._profiler.stop()
        _recording = False
        gc_in_window = {  # before writing the trace, which allocates plenty
            "collections": self._gc.count,
            "by_generation": list(self._gc.by_generation),
            "total_ms": 1e3 * self._gc.total_s,
            "longest_ms": 1e3 * self._gc.longest_s,
        }
        try:
            self._write_trace(gc_in_window)
        except Exception as exc:  # a benchmark's trace must never end the training run
            log.warning("trace of rank %d not written: %s", self._ctx.rank, exc)
        self._profiler = None
        self._trace = None

    def _write_trace(self, gc_in_window: dict[str, Any]) -> None:
        assert self._trace_dir is not None
        rank = self._ctx.rank
        self._trace_dir.mkdir(parents=True, exist_ok=True)
        raw = self._trace_dir / f"rank{rank}.trace.json"
        self._profiler.export_chrome_trace(str(raw))
        with raw.open("rb") as src, gzip.open(f"{raw}.gz", "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        facts = process_facts(self._ctx.device)
        facts.update(rank=rank, world_size=self._ctx.world_size, traced_steps=self._traced)
        facts["gc_in_window"] = gc_in_window
        (self._trace_dir / f"rank{rank}.env.json").write_text(json.dumps(facts, indent=1) + "\n")
        if self._ctx.is_rank0:
            log.info("trace of %d steps written to %s", self._traced, self._trace_dir)
