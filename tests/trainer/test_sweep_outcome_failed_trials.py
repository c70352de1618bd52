"""The sweep driver's outcome and published best trial, without Ray: the monitor's books and sinks and
``driver._result`` fed what Tune would hand them (a failed best trial, a best trial without a checkpoint,
a restored stopper's failure budget)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

from trainop.api import tuningsweep
from trainop_trainer.sweep import book, driver, layout, monitor

LR = "hyperparameters.learningRate"


def sweep_spec(**overrides: Any) -> tuningsweep.TuningSweepSpec:
    body: dict[str, Any] = {
        "template": {"workload": {"model": "mlp"}, "hyperparameters": {"maxSteps": 10}},
        "searchSpace": {LR: {"type": "uniform", "lower": 0.01, "upper": 0.1}},
        "numTrials": 2,
    }
    body.update(overrides)
    return tuningsweep.TuningSweepSpec.model_validate(body, by_alias=True)


class RecordingSink:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def publish(self, records: dict[str, Any]) -> None:
        self.records.append(json.loads(json.dumps(records)))

    def close(self, timeout_s: float) -> None:
        pass


def sweep(tmp_path: pathlib.Path, spec: tuningsweep.TuningSweepSpec) -> monitor.SweepMonitor:
    paths = layout.SweepPaths(storage_path=tmp_path, experiment_name="exp")
    trials = book.TrialBook(metric="loss", mode=tuningsweep.Mode.MIN, max_t=None)
    publisher = monitor.StatusPublisher(paths=paths, sweep_name="lr", target=None)
    return monitor.SweepMonitor(
        book=trials, publisher=publisher, spec=spec, key=str(paths.experiment_dir), min_interval_s=0
    )


def start(sweep_monitor: monitor.SweepMonitor, trial_id: str, loss: float) -> None:
    sweep_monitor.book.observe(trial_id, status=book.TUNE_PENDING, parameters={LR: 0.05})
    sweep_monitor.book.started(trial_id)
    sweep_monitor.book.result(trial_id, {"step": 3, "loss": loss})


@dataclasses.dataclass
class TuneResult:  # what driver._result reads of Tune's ResultGrid entries
    error: Exception | None
    path: str


def test_a_sweep_whose_only_trial_failed_fails_naming_the_trial_error(tmp_path: pathlib.Path) -> None:
    spec = sweep_spec(maxFailedTrials=2)
    sweep_monitor = sweep(tmp_path, spec)
    start(sweep_monitor, "t1", loss=1.0)
    sweep_monitor._maybe_publish(force=True)  # the best so far: t1, still running
    sweep_monitor.book.errored("t1", "ValueError: boom")
    sweep_monitor.on_experiment_end([])

    status = json.loads(sweep_monitor.publisher.paths.status_file.read_text())
    assert status["bestTrial"] is None  # a failed trial is never the best: the stale one is cleared
    result = driver._result(
        spec, sweep_monitor.publisher.paths, [TuneResult(RuntimeError("boom"), "/x/t1")], restored=False
    )
    assert result.outcome == "failed"
    assert result.reason is not None and "trial t1: ValueError: boom" in result.reason


def test_the_best_trial_moves_off_a_failed_one_to_the_next_best(tmp_path: pathlib.Path) -> None:
    spec = sweep_spec()
    sweep_monitor = sweep(tmp_path, spec)
    start(sweep_monitor, "t1", loss=1.0)
    start(sweep_monitor, "t2", loss=2.0)
    sweep_monitor._maybe_publish(force=True)
    sweep_monitor.book.errored("t1", "ValueError: boom")
    sweep_monitor.book.completed("t2")
    sweep_monitor.book.observe("t2", status=book.TUNE_TERMINATED, parameters={})
    sweep_monitor.on_experiment_end([])

    status = json.loads(sweep_monitor.publisher.paths.status_file.read_text())
    assert status["bestTrial"]["id"] == "t2"
    result = driver._result(
        spec, sweep_monitor.publisher.paths, [TuneResult(RuntimeError("boom"), "/x/t1")], restored=False
    )
    assert result.outcome == "succeeded"


def test_a_new_best_trial_without_a_checkpoint_clears_the_previous_ones(tmp_path: pathlib.Path) -> None:
    sweep_monitor = sweep(tmp_path, sweep_spec())
    sink = RecordingSink()
    sweep_monitor.publisher._sinks = [sink]  # what the KubernetesSink would merge-patch
    run_dir = sweep_monitor.publisher.paths.run_dir("lr", "t1")
    run_dir.mkdir(parents=True)
    (run_dir / "status.json").write_text(json.dumps({"checkpoint": {"path": "/ckpt/t1"}}))
    start(sweep_monitor, "t1", loss=1.0)
    sweep_monitor._maybe_publish(force=True)
    start(sweep_monitor, "t2", loss=0.5)  # better, no checkpoint yet
    sweep_monitor._maybe_publish(force=True)

    assert sink.records[0]["bestTrial"]["checkpoint"] == "/ckpt/t1"
    assert sink.records[1]["bestTrial"]["id"] == "t2"
    assert "checkpoint" in sink.records[1]["bestTrial"] and sink.records[1]["bestTrial"]["checkpoint"] is None
    assert tuningsweep.BestTrial(id="t", metric="loss", value=1.0).to_wire()["checkpoint"] is None


def test_the_failure_budget_is_the_restored_stoppers_not_the_changed_specs(tmp_path: pathlib.Path) -> None:
    # Attempt 1 was created with maxFailedTrials 0; the spec now says 5, which a restored stopper ignores.
    spec = sweep_spec(maxFailedTrials=5)
    sweep_monitor = sweep(tmp_path, spec)
    start(sweep_monitor, "t1", loss=1.0)
    start(sweep_monitor, "t2", loss=2.0)
    sweep_monitor.book.errored("t1", "ValueError: boom")
    key = sweep_monitor.key
    sweep_monitor.setup()
    stopper = monitor.SweepStopper(
        key=key, metric="loss", mode=tuningsweep.Mode.MIN, goal=None, max_failed_trials=0
    )
    assert stopper.stop_all()  # the budget is spent (off the main thread's Tune handler: stop_all)
    sweep_monitor.on_experiment_end([])  # t2 unfinished: pending

    limit = monitor.pop_failure_budget(key, spec.max_failed_trials)
    result = driver._result(
        spec,
        sweep_monitor.publisher.paths,
        [TuneResult(RuntimeError("boom"), "/x/t1")],
        restored=True,
        max_failed_trials=limit,
    )
    assert (result.outcome, result.exit_code) == ("failed", 1)
    assert result.reason is not None and "more than spec.maxFailedTrials (0)" in result.reason


def test_trials_that_all_failed_before_reporting_name_the_first_error(tmp_path: pathlib.Path) -> None:
    spec = sweep_spec(maxFailedTrials=3)
    sweep_monitor = sweep(tmp_path, spec)
    for trial_id in ("t1", "t2"):
        sweep_monitor.book.observe(trial_id, status=book.TUNE_PENDING, parameters={LR: 0.05})
        sweep_monitor.book.started(trial_id)
        sweep_monitor.book.errored(trial_id, f"SearchSpaceError: bad {trial_id}")
    sweep_monitor.on_experiment_end([])
    grid = [TuneResult(RuntimeError("x"), "/x/t1"), TuneResult(RuntimeError("x"), "/x/t2")]
    result = driver._result(spec, sweep_monitor.publisher.paths, grid, restored=False)
    assert result.outcome == "failed"
    assert result.reason is not None and "trial t1: SearchSpaceError: bad t1" in result.reason
