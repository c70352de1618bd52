"""The sweep's bookkeeping: what each trial is doing, the counts by state and the best trial.

Pure (no Ray, no I/O): ``monitor.SweepMonitor`` feeds it Tune's events and publishes what it says, the
stopper reads its failure count, and its state travels in Tune's experiment checkpoint (``to_state`` /
``load_state``) so a restored sweep continues the same books.

States, as ``status.trials`` counts them:

- ``pending``: created, waiting for a slot (Tune PENDING or PAUSED);
- ``running``: its TorchTrainer run is under way (Tune RUNNING);
- ``succeeded``: its training ran to the end (the trial function returned), or the scheduler stopped it at
  ``scheduler.maxT`` (the whole budget ASHA gives a trial);
- ``earlyStopped``: stopped before that: ASHA cut it at a rung, or the goal ended the sweep while it ran
  (a trial running when an attempt ends any other way, the failure budget included, is ``pending``: the
  next attempt resumes it);
- ``failed``: its run raised (Tune ERROR).

Trials the sweep never started (pending when it ended) are not counted: ``total`` is the number of trials
that ran or wait to run, always the sum of the five states.

Best trial: among trials that have not failed, the one with the best value of ``objective.metric`` ever
reported (minimum or maximum by ``objective.mode``; ties go to the earlier trial). Running trials take
part, so the status shows the best so far; once the sweep is over every candidate has finished, so it is
the best value observed among completed (succeeded or early-stopped) trials. Non-finite values (a
diverged loss) never win.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

from trainop.api import tuningsweep


class TrialState(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    EARLY_STOPPED = "earlyStopped"


# Tune's trial statuses (ray.tune.experiment.Trial.*), as strings so this module needs no Ray.
TUNE_PENDING, TUNE_RUNNING, TUNE_PAUSED = "PENDING", "RUNNING", "PAUSED"
TUNE_TERMINATED, TUNE_ERROR = "TERMINATED", "ERROR"


@dataclasses.dataclass
class TrialRecord:
    id: str
    parameters: dict[str, Any]
    tune_status: str = TUNE_PENDING
    started: bool = False
    step: int | None = None
    value: float | None = None  # the objective's last reported value
    best_value: float | None = None  # the best reported value
    stopped_by_sweep: bool = False  # Tune stopped it (scheduler, goal) on one of its results
    returned: bool = False  # its trial function returned: training completed
    error: str | None = None


def reaches_goal(value: Any, *, goal: float | None, mode: tuningsweep.Mode) -> bool:
    """Whether a reported value reaches ``objective.goal`` (at or below it when minimising)."""
    if goal is None or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return value <= goal if mode == tuningsweep.Mode.MIN else value >= goal


class TrialBook:
    def __init__(self, *, metric: str, mode: tuningsweep.Mode, max_t: int | None) -> None:
        self.metric = metric
        self.mode = mode
        self.max_t = max_t
        self.records: dict[str, TrialRecord] = {}
        # Set when the stopper ends this attempt because the failure budget is spent (it asks once).
        self.interrupted = False

    # ------------------------------------------------------------------------------------ Tune events
    def _record(self, trial_id: str, parameters: dict[str, Any] | None = None) -> TrialRecord:
        record = self.records.get(trial_id)
        if record is None:
            record = self.records[trial_id] = TrialRecord(id=trial_id, parameters=dict(parameters or {}))
        elif parameters and not record.parameters:
            record.parameters = dict(parameters)
        return record

    def observe(self, trial_id: str, *, status: str, parameters: dict[str, Any]) -> None:
        """Tune's current status of a trial (called for every trial at every controller step)."""
        record = self._record(trial_id, parameters)
        record.tune_status = status
        if status == TUNE_RUNNING:
            record.started = True

    def started(self, trial_id: str) -> None:
        record = self._record(trial_id)
        record.started = True
        record.tune_status = TUNE_RUNNING
        # A trial Tune runs again (a restored experiment) starts over in these books.
        record.stopped_by_sweep = record.returned = False
        record.error = None

    def result(self, trial_id: str, result: dict[str, Any]) -> None:
        record = self._record(trial_id)
        record.started = True
        step = result.get("step")
        if isinstance(step, (int, float)):
            record.step = int(step)
        value = result.get(self.metric)
        if isinstance(value, (int, float)) and math.isfinite(value):
            record.value = float(value)
            if record.best_value is None or self._better(float(value), record.best_value):
                record.best_value = float(value)
        if result.get("done"):
            # Tune marks a result done when its scheduler or stopper decided to stop the trial on it
            # (a trial that returns by itself ends with a duplicate result that callbacks never see).
            record.stopped_by_sweep = True

    def completed(self, trial_id: str) -> None:
        record = self._record(trial_id)
        if not record.stopped_by_sweep:
            record.returned = True

    def errored(self, trial_id: str, message: str) -> None:
        record = self._record(trial_id)
        record.started = True
        record.tune_status = TUNE_ERROR
        record.error = message

    def requeue_unfinished(self) -> None:
        """At the end of an attempt, trials still running wait for the next one: count them as pending."""
        for record in self.records.values():
            if record.tune_status == TUNE_RUNNING:
                record.tune_status = TUNE_PENDING

    # ----------------------------------------------------------------------------------------- views
    def _better(self, a: float, b: float) -> bool:
        return a < b if self.mode == tuningsweep.Mode.MIN else a > b

    def state(self, record: TrialRecord) -> TrialState | None:
        """The record's state as status.trials counts it; None for a trial the sweep never started."""
        status = record.tune_status
        if status == TUNE_ERROR:
            return TrialState.FAILED
        if status == TUNE_RUNNING:
            return TrialState.RUNNING
        if status in (TUNE_PENDING, TUNE_PAUSED):
            return TrialState.PENDING
        if record.returned:
            return TrialState.SUCCEEDED
        if not record.started:
            return None
        if record.stopped_by_sweep and self.max_t is not None and (record.step or 0) >= self.max_t:
            return TrialState.SUCCEEDED
        return TrialState.EARLY_STOPPED

    def counts(self) -> tuningsweep.TrialCounts:
        tally = dict.fromkeys(TrialState, 0)
        for record in self.records.values():
            state = self.state(record)
            if state is not None:
                tally[state] += 1
        return tuningsweep.TrialCounts(
            total=sum(tally.values()),
            pending=tally[TrialState.PENDING],
            running=tally[TrialState.RUNNING],
            succeeded=tally[TrialState.SUCCEEDED],
            failed=tally[TrialState.FAILED],
            early_stopped=tally[TrialState.EARLY_STOPPED],
        )

    def failed(self) -> list[TrialRecord]:
        return [r for r in self.records.values() if r.tune_status == TUNE_ERROR]

    def best(self) -> TrialRecord | None:
        best: TrialRecord | None = None
        best_value = math.nan
        for record in self.records.values():
            if record.tune_status == TUNE_ERROR or record.best_value is None:
                continue
            if best is None or self._better(record.best_value, best_value):
                best, best_value = record, record.best_value
        return best

    def rows(self) -> list[dict[str, Any]]:
        """One row per counted trial, in creation order: local mode's table."""
        rows = []
        for record in self.records.values():
            state = self.state(record)
            if state is None:
                continue
            rows.append(
                {
                    "id": record.id,
                    "parameters": record.parameters,
                    "state": state.value,
                    "step": record.step,
                    "value": record.value,
                    "best": record.best_value,
                    "error": record.error,
                }
            )
        return rows

    # ----------------------------------------------------------------------------------- persistence
    def to_state(self) -> dict[str, Any]:
        return {"records": [dataclasses.asdict(r) for r in self.records.values()]}

    def load_state(self, state: dict[str, Any]) -> None:
        """Replace the records in place (the stopper holds this same object)."""
        self.records = {r["id"]: TrialRecord(**r) for r in state.get("records", [])}
