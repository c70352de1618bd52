"""The step schedule: at which step every rank reports, checkpoints, stops or yields to a preemption.

Some decisions are a function of the step count (``checkpoint.intervalSteps``, ``reporting.everySteps``):
every rank knows them without talking. The others are not: rank 0's clocks (``checkpoint.intervalMinutes``,
``reporting.everySeconds``, the pace of ``ray.train.report``), a SIGTERM seen by any one rank, a stop request
the driver left on the volume, a profile or communication report a user asked for (rank 0's
``requests.RequestWatcher``). ``StepSchedule.poll(step)`` merges both kinds into one ``Decision`` that every
rank receives at the same step, through ``distributed.ControlChannel`` (one tiny asynchronous MAX
all-reduce per step, read one step later; every N steps with ``switches`` ``control_every=N``, which a
benchmark may set). Training loops act on the ``Decision`` and nothing else; they never read clocks or
signal flags themselves.

It must not checkpoint, report or stop anything itself: it only decides when.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from trainop.api import trainingjob
from trainop_trainer import config as config_module
from trainop_trainer import distributed, preempt, storage, switches

log = logging.getLogger(__name__)

# Ray reports at most this often (``ray.train.report`` is a barrier: config.py says why); the driver checks
# the variable before it starts and forwards it to its workers (``ray_train._FORWARDED_ENV``).
RAY_REPORT_MIN_INTERVAL_ENV = config_module.RAY_REPORT_MIN_INTERVAL_ENV
DEFAULT_RAY_REPORT_MIN_INTERVAL_S = config_module.DEFAULT_RAY_REPORT_MIN_INTERVAL_S
# How often rank 0 looks for the driver's stop file (a stat per step would cost more than the step on CPU).
STOP_FILE_CHECK_INTERVAL_S = 1.0


class Outcome(enum.StrEnum):
    COMPLETED = "completed"  # reached the last step
    STOPPED = "stopped"  # a stop request (the driver got SIGTERM): checkpointed, returning normally
    PREEMPTED = "preempted"  # some worker got SIGTERM: checkpointed; that worker exits 0


@dataclasses.dataclass(frozen=True)
class Decision:
    """What every rank does after the step it was polled for (identical on every rank)."""

    stop: bool
    preempt: bool
    checkpoint: bool
    report: bool
    ray_report: bool = False
    profile_steps: int = 0  # open a profiler window of this many steps now
    communication_report: bool = False  # run the communication report now

    @property
    def outcome(self) -> Outcome:
        """How training ends if it ends at this step."""
        if not self.stop:
            return Outcome.COMPLETED
        return Outcome.PREEMPTED if self.preempt else Outcome.STOPPED


class RequestSource(Protocol):
    def post(self) -> tuple[int, bool]:
        """Rank 0, once per step: (profile steps, communication report) to ask every rank for now."""
        ...


NOTHING = Decision(stop=False, preempt=False, checkpoint=False, report=False)


def ray_report_interval(spec: trainingjob.TrainingJobSpec) -> float:
    """Seconds between two ``ray.train.report`` calls: the report interval, at least the floor above."""
    return max(spec.reporting.every_seconds, config_module.ray_report_min_interval_from_env())


class StepSchedule:
    """Owns the cross-rank agreement; one per worker, polled once per optimizer step on every rank."""

    def __init__(
        self,
        *,
        spec: trainingjob.TrainingJobSpec,
        control: distributed.ControlChannel,
        is_rank0: bool,
        stop_file: storage.RunDir,
        ray_report_interval_s: float | None,
        requests: RequestSource | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # ``clock``: rank 0's clocks read it (seconds, monotonic); a test steps a clock of its own.
        self._clock = clock
        self._requests = requests
        self._checkpoint_steps = spec.checkpoint.interval_steps
        self._checkpoint_seconds = (
            None if spec.checkpoint.interval_minutes is None else spec.checkpoint.interval_minutes * 60
        )
        self._report_steps = spec.reporting.every_steps
        self._report_seconds = spec.reporting.every_seconds
        self._ray_report_seconds = ray_report_interval_s
        self._control = control
        self._is_rank0 = is_rank0
        self._stop_file = stop_file
        self._last_stop_file_check = 0.0
        self._stop_file_seen = False
        self._closed = threading.Event()
        self._stop_watch: threading.Thread | None = None
        if is_rank0 and isinstance(stop_file, storage.StoragePath):
            # In a bucket a look is an HTTP request, too slow for the training thread: a thread looks.
            self._stop_watch = threading.Thread(target=self._watch_stop_file, name="stop-file", daemon=True)
            self._stop_watch.start()
        self.reset_clocks()

    def _watch_stop_file(self) -> None:
        while not self._closed.wait(STOP_FILE_CHECK_INTERVAL_S):
            try:
                if self._stop_file.exists():
                    self._stop_file_seen = True
                    return
            except OSError as exc:
                log.warning("looking for the stop request %s failed (%s)", self._stop_file, exc)

    def close(self) -> None:
        self._closed.set()

    def reset_clocks(self) -> None:
        """Start the report and checkpoint clocks now (when the loop starts, after restoring)."""
        now = self._clock()
        self._last_report = now
        self._last_ray_report = now
        self._last_checkpoint = now

    def poll(self, step: int) -> Decision:
        """Call once per optimizer step on every rank, after the step; returns what every rank does now.

        Clock-based and signal-based flags posted at one step are acted on at the next poll (the exchange
        overlaps a whole step); step-count-based ones act at once."""
        now = self._clock()
        stop_file = due_checkpoint = due_report = due_ray_report = False
        # Every rank exchanges at the same steps: every step, or those divisible by control_every.
        exchange = step % switches.control_every() == 0
        profile_steps, communication = 0, False
        if self._is_rank0 and exchange:
            if self._requests is not None:
                profile_steps, communication = self._requests.post()
            # On S3 a thread watches the stop file (a HEAD request costs more than a step); on the volume
            # the check is a stat, made here at most every STOP_FILE_CHECK_INTERVAL_S.
            if self._stop_watch is None and now - self._last_stop_file_check >= STOP_FILE_CHECK_INTERVAL_S:
                self._last_stop_file_check = now
                self._stop_file_seen = self._stop_file.exists()
            stop_file = self._stop_file_seen
            # Each clock restarts when it asks: the answer arrives one step later on every rank.
            if (
                self._checkpoint_seconds is not None
                and now - self._last_checkpoint >= self._checkpoint_seconds
            ):
                due_checkpoint = True
                self._last_checkpoint = now
            if now - self._last_report >= self._report_seconds:
                due_report = True
                self._last_report = now
            if (
                self._ray_report_seconds is not None
                and now - self._last_ray_report >= self._ray_report_seconds
            ):
                due_ray_report = True
                self._last_ray_report = now
        agreed = (
            self._control.exchange(
                stop=stop_file,
                preempt=preempt.requested(),
                checkpoint=due_checkpoint,
                report=due_report,
                ray_report=due_ray_report,
                profile_steps=profile_steps,
                communication_report=communication,
            )
            if exchange
            else distributed.Agreed()
        )
        stopping = agreed.stop or agreed.preempt
        by_steps = self._checkpoint_steps is not None and step % self._checkpoint_steps == 0
        decision = Decision(
            stop=stopping,
            preempt=agreed.preempt,
            checkpoint=agreed.checkpoint or by_steps or stopping,
            report=agreed.report or agreed.ray_report or step % self._report_steps == 0 or stopping,
            ray_report=agreed.ray_report or stopping,
            profile_steps=0 if stopping else agreed.profile_steps,
            communication_report=agreed.communication_report and not stopping,
        )
        # A step-count report or checkpoint restarts the time clock too, so the two do not pile up.
        if decision.report:
            self._last_report = now
        if decision.checkpoint:
            self._last_checkpoint = now
        return decision
