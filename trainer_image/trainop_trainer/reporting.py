"""Progress reports: one report window, shared by the built-in loop and user entrypoints.

- ``ReportWindow``: this rank's arithmetic between two reports — the loss summed on the device (read only at
  report time, so the hot loop never synchronises with the GPU), the samples and steps done, the wall time —
  and what a report says about it: local mean loss, global samples per second (local samples x world
  size / seconds), ETA. A report with no new steps (the final one) repeats the previous throughput and
  loss.
- ``ProgressReports``: publishes a closed window, collectively (every rank, same step): the loss averaged over
  ranks through the control channel, the Prometheus metrics, rank 0's status record, and — when the step
  schedule says so — ``ray.train.report`` (a barrier across ranks; every rank passes the same flag); rank 0
  also hands each report to the runtime's hook (tracking backends, ``status.cost``). It sums the wall time
  between optimizer steps (``training_seconds``, the training share of ``status.cost``).

It must not decide when to report (``step_schedule`` does) nor know about models or data.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from trainop_trainer import distributed, metrics, switches
from trainop_trainer.status import StatusReporter

log = logging.getLogger(__name__)

ReportFn = Callable[[dict[str, Any]], None]


@dataclasses.dataclass(frozen=True)
class WindowStats:
    step: int
    local_loss: float | None
    samples_per_second: float | None
    eta_seconds: float | None
    # The steps (from, to] the loss and rate are of when they are not this report's own window: the previous
    # window (lagged reports), or this one and the one staged before it (the last report of a lagged run).
    covers: tuple[int, int] | None = None


class ReportWindow:
    """One rank's accumulators between two reports."""

    def __init__(self, *, world_size: int, device: torch.device) -> None:
        self.world_size = world_size
        self._loss_sum = torch.zeros((), device=device, dtype=torch.float32)
        self._loss_count = 0
        self._samples = 0
        self._start = time.perf_counter()
        self._start_step = 0
        self._last_samples_per_second: float | None = None
        self.last_loss: float | None = None  # the last published (rank-averaged) loss
        # Lagged windows (CUDA, switches report_sync=lagged): the start event of this window and the
        # previous window staged for the next report.
        self._start_event: Any = None
        self._staged: _Staged | None = None

    def _lagged(self) -> bool:
        return self._loss_sum.is_cuda and switches.report_sync() == "lagged"

    def restart(self, step: int, *, start_event: Any = None) -> None:
        """Begin a window at ``step`` now (training starts or resumes there); lagged windows start at
        ``start_event`` when one is given (the previous window's end), else at an event recorded now."""
        self._loss_sum.zero_()
        self._loss_count = 0
        self._samples = 0
        self._start = time.perf_counter()
        self._start_step = step
        self._staged = None
        if start_event is None and self._lagged():
            start_event = _timing_event()
        self._start_event = start_event

    def add_loss(self, loss: torch.Tensor | float) -> None:
        """One loss value (a micro-batch's or a step's); device tensors stay on the device."""
        if isinstance(loss, torch.Tensor):
            self._loss_sum.add_(loss.detach().float())
        else:
            self._loss_sum.add_(float(loss))
        self._loss_count += 1

    def add_samples(self, samples: int) -> None:
        """Samples this rank consumed (the window's throughput is local samples x world size)."""
        self._samples += samples

    @property
    def pending(self) -> bool:
        """Losses or samples not reported yet."""
        return self._loss_count > 0 or self._samples > 0

    def close(self, *, step: int, total_steps: int | None, final: bool = False) -> WindowStats:
        """The window's report, and a new window from now (the report's own cost counts against it).

        On the CPU, and on CUDA with ``switches`` ``report_sync=device``, and for the last report of a run:
        the loss is read first, which waits for the device to finish the window's steps, so the window's
        time is the device's, not how far ahead of it the host happened to be. On CUDA by default
        (``report_sync=lagged``) nothing waits: the report gives the previous window's loss and rate
        (``_close_lagged``); the last report of a run waits, and times its window between CUDA events like
        the others (its host clock started while the host was ahead of the device: wall time would count
        that lead against the window). The last report is the one at ``total_steps`` or one marked
        ``final`` (the run stops there: a preemption's checkpoint); it also covers the window staged at
        the lagged report before it, which would otherwise never be reported (``covers`` says so)."""
        final = final or (total_steps is not None and step >= total_steps)
        if self._lagged() and not final:
            return self._close_lagged(step=step, total_steps=total_steps)
        covers = self._fold_staged(step)
        end_event = None if self._start_event is None else _timing_event()
        local_loss = self.last_loss
        if self._loss_count:
            local_loss = float(self._loss_sum.item()) / self._loss_count
        now = time.perf_counter()
        elapsed = max(now - self._start, 1e-9)
        if end_event is not None:
            end_event.synchronize()
            elapsed = max(self._start_event.elapsed_time(end_event) / 1e3, 1e-9)
        steps = step - self._start_step
        if self._samples:
            self._last_samples_per_second = self._samples * self.world_size / elapsed
        stats = WindowStats(
            step=step,
            local_loss=local_loss,
            samples_per_second=self._last_samples_per_second,
            eta_seconds=_eta(step, total_steps, elapsed, steps),
            covers=covers,
        )
        self.restart(step)
        self._start = now
        return stats

    def _fold_staged(self, step: int) -> tuple[int, int] | None:
        """Make the window staged at the previous lagged report part of this one (its loss sum, samples,
        first step and start event): the steps it covers, or None when nothing was staged."""
        staged, self._staged = self._staged, None
        if staged is None:
            return None
        staged.end.synchronize()  # the copy of its loss sum to host memory ran before this event
        if staged.loss_sum is not None and staged.count:
            self._loss_sum.add_(float(staged.loss_sum))
            self._loss_count += staged.count
        self._samples += staged.samples
        self._start_step = staged.first_step
        if staged.start is not None:
            self._start_event = staged.start
        return (staged.first_step, step)

    def _close_lagged(self, *, step: int, total_steps: int | None) -> WindowStats:
        """Stage this window (its loss sum copied to pinned memory and an event recorded after its steps, on
        the training stream: no wait) and report the previous one, staged a report ago and long done on the
        GPU: its loss, and its rate over the device time between its two events. The first report of a run
        has no previous window: it repeats the last known values (none at the very start)."""
        host = None
        if self._loss_count:
            host = torch.empty((), dtype=torch.float32, pin_memory=True)
            host.copy_(self._loss_sum, non_blocking=True)
        end = _timing_event()
        staged = _Staged(
            loss_sum=host,
            count=self._loss_count,
            samples=self._samples,
            first_step=self._start_step,
            steps=step - self._start_step,
            start=self._start_event,
            end=end,
        )
        previous = self._staged
        self.restart(step, start_event=end)  # the next window starts where this one ends
        self._staged = staged
        local_loss, eta, covers = self.last_loss, None, None
        if previous is not None:
            covers = (previous.first_step, previous.first_step + previous.steps)
            previous.end.synchronize()
            if previous.loss_sum is not None and previous.count:
                local_loss = float(previous.loss_sum) / previous.count
            if previous.start is not None:
                seconds = max(previous.start.elapsed_time(previous.end) / 1e3, 1e-9)
                if previous.samples:
                    self._last_samples_per_second = previous.samples * self.world_size / seconds
                eta = _eta(step, total_steps, seconds, previous.steps)
        return WindowStats(
            step=step,
            local_loss=local_loss,
            samples_per_second=self._last_samples_per_second,
            eta_seconds=eta,
            covers=covers,
        )


@dataclasses.dataclass(frozen=True)
class _Staged:
    """A closed window whose numbers are still on the GPU (``report_sync=lagged``)."""

    loss_sum: torch.Tensor | None  # pinned host memory, written by a copy behind ``end``
    count: int
    samples: int
    first_step: int
    steps: int
    start: Any  # torch.cuda.Event (timing) or None
    end: Any


def _timing_event() -> Any:
    event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    event.record()
    return event


def _eta(step: int, total_steps: int | None, seconds: float, steps: int) -> float | None:
    if total_steps is None:
        return None
    if steps > 0:
        return max(0, total_steps - step) * seconds / steps
    return 0.0 if step >= total_steps else None


class ProgressReports:
    """Publishes report windows: metrics on every rank, status on rank 0, Ray Train reports when asked."""

    def __init__(
        self,
        *,
        ctx: distributed.WorkerContext,
        control: distributed.ControlChannel,
        worker_metrics: metrics.WorkerMetrics,
        status: StatusReporter | None,
        report_fn: ReportFn | None,
        worker_restarts: int,
        last_checkpoint_step: Callable[[], int | None],
        on_report: Callable[[int, Mapping[str, float]], None] | None = None,
    ) -> None:
        self.window = ReportWindow(world_size=ctx.world_size, device=ctx.device)
        self._ctx = ctx
        self._control = control
        self._metrics = worker_metrics
        self._status = status
        self._report_fn = report_fn
        self._worker_restarts = worker_restarts
        self._last_checkpoint_step = last_checkpoint_step
        self._on_report = on_report
        # Wall time between consecutive optimizer steps since this worker group started (status.cost).
        self.training_seconds = 0.0
        self._ray_reported_step: int | None = None
        self._last_step_time = time.perf_counter()
        self.last_step = 0
        self.batch_size_per_worker: int | None = None  # for status, when the loop knows it
        self._published_step: int | None = None  # the step of the last report logs and status saw

    def start(self, step: int) -> None:
        """Training (re)starts at ``step``: a fresh window and step timer."""
        self.window.restart(step)
        self._last_step_time = time.perf_counter()
        self.last_step = step

    def step_finished(self, step: int, *, samples: int | None = None) -> None:
        """After every optimizer step: the step-time histogram (host wall time, no device sync) and the
        samples this rank consumed."""
        now = time.perf_counter()
        self._metrics.step_seconds.observe(now - self._last_step_time)
        self.training_seconds += now - self._last_step_time
        self._last_step_time = now
        self.last_step = step
        if samples:
            self.window.add_samples(samples)

    def needs_final_report(self, step: int) -> bool:
        """True when the end of training has something Ray Train or the status has not seen yet."""
        return self.window.pending or self._ray_reported_step != step

    @property
    def last_loss(self) -> float | None:
        return self.window.last_loss

    def report(
        self,
        *,
        step: int,
        total_steps: int | None,
        epoch: int,
        to_ray: bool,
        extra: Mapping[str, float] | None = None,
        learning_rate: float | None = None,
        ray_extra: Mapping[str, float] | None = None,
        final: bool = False,
    ) -> None:
        """Collective (every rank, same step): close the window and publish it (``final``: the run stops
        at this step, so nothing of the window may be left for a later report). ``extra`` goes everywhere
        (a user's own metrics); ``ray_extra`` only to Ray Train (the last evaluation, for Tune).

        A report at the step of the previous one with nothing new in its window (the run's last step, reported
        by the loop and then again so that Ray Train gets it) only reports to Ray: the log, the status and the
        tracking hook saw that step already."""
        fresh = self.window.pending or step != self._published_step or extra is not None
        self._published_step = step
        stats = self.window.close(step=step, total_steps=total_steps, final=final)
        loss = None if stats.local_loss is None else self._control.all_reduce_mean(stats.local_loss)
        if loss is not None:
            self.window.last_loss = loss
            self._metrics.loss.set(loss)
        self._metrics.step.set(step)
        sps = stats.samples_per_second
        if sps is not None:
            self._metrics.samples_per_second.set(sps)
        if self._ctx.is_rank0 and fresh:
            log.info(
                "step %d/%s epoch %d loss %s %s samples/s%s",
                step,
                total_steps if total_steps is not None else "?",
                epoch,
                "-" if loss is None else f"{loss:.4f}",
                "-" if sps is None else f"{sps:.1f}",
                "" if stats.covers is None else f" (window of steps {stats.covers[0]}-{stats.covers[1]})",
            )
        if self._status is not None and fresh:
            self._status.progress(
                step=step,
                total_steps=total_steps,
                epoch=epoch,
                loss=None if loss is None else round(loss, 6),
                samples_per_second=None if sps is None else round(sps, 2),
                eta_seconds=None if stats.eta_seconds is None else round(stats.eta_seconds, 1),
                worker_restarts=self._worker_restarts,
                batch_size_per_worker=self.batch_size_per_worker,
                learning_rate=learning_rate,
            )
        if self._on_report is not None and fresh:
            values_for_tracking: dict[str, float] = {"epoch": float(epoch)}
            if loss is not None:
                values_for_tracking["loss"] = loss
            if sps is not None:
                values_for_tracking["samples_per_second"] = sps
            if learning_rate is not None:
                values_for_tracking["learning_rate"] = learning_rate
            values_for_tracking.update(extra or {})
            try:
                self._on_report(step, values_for_tracking)
            except Exception:
                log.exception("report hook failed (training goes on)")
        if self._report_fn is not None and to_ray:
            values: dict[str, Any] = {"step": step, "epoch": epoch}
            if loss is not None:
                values["loss"] = loss
            if sps is not None:
                values["samples_per_second"] = sps
            checkpoint_step = self._last_checkpoint_step()
            if checkpoint_step is not None:
                values["checkpoint_step"] = checkpoint_step
            values.update(extra or {})
            values.update(ray_extra or {})
            self._report_fn(values)
        if to_ray:
            self._ray_reported_step = step
