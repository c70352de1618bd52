"""Profiling on demand: a torch profiler window on every rank, and a one-off communication report.

A user annotates a running job (``trainop.dev/profile=20``, ``trainop.dev/communication-report=1``;
``requests.RequestWatcher`` on rank 0 notices, the step schedule hands the request to every rank at the
same step). ``Profiler.after_step(step, decision)`` — called by both loops after each step — then:

- **profile**: starts ``torch.profiler.profile`` (CPU activities, and CUDA on GPUs, where NCCL's kernels
  appear as ``ncclDevKernel_*``) on every rank, records the next N optimizer steps (``profiler.step()``
  marks each), stops, and writes one Chrome trace per rank to
  ``<run>/profiles/<start>-<end>/rank<r>.trace.json`` on the checkpoint volume (open it in Perfetto or
  chrome://tracing; TensorBoard's profiler plugin reads the same files). The ranks agree that every file
  was written (one MAX all-reduce), then rank 0 sets ``status.profile`` (Recording, then Completed or
  Failed with the path) and emits an Event on the job.
- **communication report**: ``communication_report`` times all-reduce, all-gather and broadcast on the
  training process group at several sizes and gives nccl-tests' bus bandwidth for each
  (``<run>/profiles/communication-<step>.json`` and ``status.communication``). The same measurement runs
  standalone under torchrun: ``python -m trainop_trainer.profiling --sizes 1M,16M``.

A window still open when training ends is closed with the steps it has. It must not decide when to profile
(``step_schedule`` and ``requests`` do) nor touch the training state.
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from trainop.api import experiment
from trainop_trainer import distributed, requests, run_record
from trainop_trainer.status import StatusReporter
from trainop_trainer.step_schedule import Decision

log = logging.getLogger(__name__)

CPU_SIZES = (64 << 10, 1 << 20, 8 << 20)
GPU_SIZES = (1 << 20, 16 << 20, 128 << 20, 256 << 20)
OPS = ("all_reduce", "all_gather", "broadcast")
EventFn = Callable[[str, str, str], None]  # (reason, message, type)


# ------------------------------------------------------------------------------- communication report
def bus_bandwidth(op: str, *, size: int, seconds: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth in GB/s for ``size`` bytes (the whole buffer) moved in ``seconds``."""
    algbw = size / seconds / 1e9
    n = world_size
    if op == "all_reduce":
        return algbw * 2 * (n - 1) / n
    if op == "all_gather":
        return algbw * (n - 1) / n
    return algbw  # broadcast


def _time_op(op: str, size: int, *, ctx: distributed.WorkerContext, group: Any, iterations: int) -> float:
    n = ctx.world_size
    elements = max(n, size // 4)
    elements -= elements % n
    device = ctx.device
    if op == "all_gather":
        output = torch.empty(elements, dtype=torch.float32, device=device)
        part = torch.ones(elements // n, dtype=torch.float32, device=device)

        def run() -> None:
            dist.all_gather_into_tensor(output, part, group=group)
    else:
        tensor = torch.ones(elements, dtype=torch.float32, device=device)

        def run() -> None:
            if op == "all_reduce":
                dist.all_reduce(tensor, group=group)
            else:
                dist.broadcast(tensor, src=0, group=group)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    run()  # warm-up (connections, buffers)
    sync()
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iterations):
        run()
    sync()
    seconds = (time.perf_counter() - start) / iterations
    slowest = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    return float(slowest.item())


def communication_report(
    ctx: distributed.WorkerContext,
    *,
    sizes: Sequence[int] | None = None,
    ops: Sequence[str] = OPS,
    iterations: int = 5,
    group: Any = None,
) -> list[experiment.CollectiveResult]:
    """Collective: every op at every size, the slowest rank's mean time, as bus bandwidth."""
    if sizes is None:
        sizes = GPU_SIZES if ctx.device.type == "cuda" else CPU_SIZES
    results: list[experiment.CollectiveResult] = []
    if ctx.world_size < 2 or not dist.is_initialized():
        return results
    for op in ops:
        for size in sizes:
            seconds = _time_op(op, size, ctx=ctx, group=group, iterations=iterations)
            results.append(
                experiment.CollectiveResult(
                    op=op,
                    bytes=size,
                    seconds=round(seconds, 6),
                    bus_bandwidth_gb_per_second=round(
                        bus_bandwidth(op, size=size, seconds=seconds, world_size=ctx.world_size), 4
                    ),
                )
            )
    return results


# --------------------------------------------------------------------------------------- the profiler
class Profiler:
    """One per worker; acts on the step schedule's profile and communication decisions."""

    def __init__(
        self,
        *,
        ctx: distributed.WorkerContext,
        control: distributed.ControlChannel,
        profiles_dir: pathlib.Path,
        watcher: requests.RequestWatcher | None,
        status: StatusReporter | None,
        emit_event: EventFn | None = None,
    ) -> None:
        self.ctx = ctx
        self.control = control
        self.profiles_dir = profiles_dir
        self.watcher = watcher  # rank 0 only
        self.status = status
        self.emit_event = emit_event
        self._profile: Any = None
        self._start_step = 0
        self._end_step = 0
        self._dir: pathlib.Path | None = None

    @property
    def recording(self) -> bool:
        return self._profile is not None

    def after_step(self, step: int, decision: Decision) -> None:
        """Every rank, after every optimizer step (after reports and checkpoints)."""
        self._report_invalid()
        if self._profile is not None:
            self._profile.step()
            if step >= self._end_step:
                self._finish(step)
        if decision.communication_report:
            self._communication(step)
        if decision.profile_steps and self._profile is None:
            self._begin(step, decision.profile_steps)

    # ---------------------------------------------------------------------------------------- profile
    def _request_value(self, kind: str) -> str:
        request = self.watcher.claimed(kind) if self.watcher is not None else None
        return request.value if request is not None else ""

    def _publish_profile(
        self, state: experiment.ProfileState, *, steps: int, message: str, path: str | None
    ) -> None:
        if self.status is None:
            return
        self.status.record(
            "profile",
            experiment.ProfileStatus(
                request=self._request_value(requests.PROFILE),
                state=state,
                steps=steps,
                start_step=self._start_step or None,
                path=path,
                message=message,
                time=run_record.utc_now(),
            ),
        )

    def _report_invalid(self) -> None:
        if self.watcher is None or not self.watcher.invalid:
            return
        failed, self.watcher.invalid = self.watcher.invalid, []
        for request, message in failed:
            log.warning("%s", message)
            if self.status is not None:
                self.status.record(
                    "profile",
                    experiment.ProfileStatus(
                        request=request.value,
                        state=experiment.ProfileState.FAILED,
                        steps=0,
                        message=message,
                        time=run_record.utc_now(),
                    ),
                )
            self._event("ProfileFailed", message, "Warning")

    def _begin(self, step: int, steps: int) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU]
        if self.ctx.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._start_step, self._end_step = step + 1, step + steps
        self._dir = self.profiles_dir / f"step{self._start_step}-{self._end_step}"
        # A schedule makes the profiler mark each step (ProfilerStep#N) in the trace; one step longer than
        # the window so that it never closes on its own: _finish stops it after the last step.
        self._profile = profile(
            activities=activities,
            schedule=schedule(wait=0, warmup=0, active=steps + 1, repeat=1),
            record_shapes=False,
            with_stack=False,
        )
        self._profile.start()
        if self.ctx.is_rank0:
            log.info("profiling steps %d-%d on every rank", self._start_step, self._end_step)
            self._publish_profile(
                experiment.ProfileState.RECORDING,
                steps=steps,
                message=f"recording steps {self._start_step}-{self._end_step} on every rank",
                path=str(self._dir),
            )

    def _finish(self, step: int, *, collective: bool = True) -> None:
        profile, self._profile = self._profile, None
        assert self._dir is not None
        steps = step - self._start_step + 1
        error = ""
        try:
            profile.stop()
            self._dir.mkdir(parents=True, exist_ok=True)
            profile.export_chrome_trace(str(self._dir / f"rank{self.ctx.rank}.trace.json"))
        except Exception as exc:
            error = f"rank {self.ctx.rank}: {type(exc).__name__}: {exc}"
            log.warning("profile trace not written: %s", error)
        failed = self.control.all_reduce_max(1.0 if error else 0.0) if collective else (1.0 if error else 0.0)
        if not self.ctx.is_rank0:
            return
        if failed:
            message = f"profile of steps {self._start_step}-{step} failed: {error or 'on another rank'}"
            self._publish_profile(experiment.ProfileState.FAILED, steps=steps, message=message, path=None)
            self._event("ProfileFailed", message, "Warning")
        else:
            message = (
                f"profiled steps {self._start_step}-{step} on {self.ctx.world_size} ranks: Chrome traces "
                f"rank<r>.trace.json in {self._dir}"
            )
            log.info("%s", message)
            self._publish_profile(
                experiment.ProfileState.COMPLETED, steps=steps, message=message, path=str(self._dir)
            )
            self._event("Profiled", message, "Normal")
        if self.watcher is not None:
            self.watcher.done(requests.PROFILE)

    # ------------------------------------------------------------------------------------ communication
    def _communication(self, step: int) -> None:
        started = time.perf_counter()
        results = communication_report(self.ctx)
        if not self.ctx.is_rank0:
            return
        path = self.profiles_dir / f"communication-step{step}.json"
        record = experiment.CommunicationStatus(
            request=self._request_value(requests.COMMUNICATION),
            backend=self.ctx.backend,
            world_size=self.ctx.world_size,
            results=results,
            path=str(path),
            time=run_record.utc_now(),
        )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record.to_wire(), indent=2))
        except OSError as exc:
            log.warning("communication report not written to %s (%s)", path, exc)
        summary = ", ".join(
            f"{r.op} {r.bytes >> 10} KiB {r.bus_bandwidth_gb_per_second:.2f} GB/s" for r in results
        )
        message = (
            f"communication report at step {step} ({time.perf_counter() - started:.1f}s): "
            f"{summary or 'one rank, nothing to measure'}"
        )
        log.info("%s", message)
        if self.status is not None:
            self.status.record("communication", record)
        self._event("CommunicationReport", f"communication report in {path}", "Normal")
        if self.watcher is not None:
            self.watcher.done(requests.COMMUNICATION)

    def _event(self, reason: str, message: str, kind: str) -> None:
        if self.emit_event is not None and self.ctx.is_rank0:
            try:
                self.emit_event(reason, message, kind)
            except Exception as exc:
                log.warning("event %s not emitted (%s)", reason, exc)

    def close(self, step: int) -> None:
        """Training ended: a window still open is closed with the steps it has (no collective: ranks may
        be leaving at different points)."""
        if self._profile is not None:
            self._finish(max(step, self._start_step), collective=False)


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)


def main(argv: list[str] | None = None) -> int:
    """``torchrun --nproc-per-node N -m trainop_trainer.profiling [--sizes 1M,16M,256M]``: the communication
    report on its own, printed as a table and JSON (rank 0)."""
    parser = argparse.ArgumentParser(prog="python -m trainop_trainer.profiling")
    parser.add_argument("--sizes", default="", help="comma-separated buffer sizes, e.g. 64K,1M,256M")
    parser.add_argument("--iterations", type=int, default=10)
    args = parser.parse_args(argv)
    ctx = distributed.from_torchrun_env(use_gpu=torch.cuda.is_available())
    sizes = [_size(s) for s in args.sizes.split(",") if s.strip()] or None
    results = communication_report(ctx, sizes=sizes, iterations=args.iterations)
    if ctx.is_rank0:
        for r in results:
            print(
                f"{r.op:<11} {r.bytes:>12} B {r.seconds * 1e3:9.3f} ms "
                f"{r.bus_bandwidth_gb_per_second:8.3f} GB/s"
            )
        print(json.dumps([r.to_wire() for r in results]))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
