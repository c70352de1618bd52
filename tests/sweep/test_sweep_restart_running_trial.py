"""A trial still running when an attempt ends is unfinished, not early-stopped: the next attempt resumes it.

Two ways an attempt ends with a trial running, each a module fixture of two attempts (the expensive part;
each test checks one behaviour). The trials are the gated entrypoints of ``gated_entrypoint``: 8 steps, a
checkpoint every 4; ``hold_after_checkpoint`` holds after its step-4 checkpoint until the test releases it,
so it is surely running, with a checkpoint, when the attempt ends, whatever the machine's load (no sleep
decides an order). Attempt 2 is a new driver run with the same experiment, as the operator's next RayJob
(or local mode run again) would be, after the release.

- Failure budget: a grid over ``workload.entrypoint`` of ``fail_once`` and ``hold_after_checkpoint``, two at
  a time, ``maxFailedTrials: 0``; ``fail_once`` raises once the other trial holds, which spends the budget.
- Ctrl+C: one ``hold_after_checkpoint`` trial; once it holds, the test sends the driver (this process) the
  SIGINT of a user's Ctrl+C in local mode. Tune ends the run, checkpoints its state with the trial still
  running and stops the trial's actor. Until 2026-11-29 the sweep's book then read the stopped trial as
  early-stopped (the failure budget had its own path), as it did when an error (pytest-timeout's, in CI)
  ended the Tune loop: docs/sweep.md, "Restart and resume".
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.sweep import sweep_support
from trainop.api import trainer_config
from trainop_trainer.sweep import driver

pytestmark = [pytest.mark.ray, pytest.mark.slow]

MAX_STEPS = 8
CHECKPOINT_EVERY = 4
FAIL = "tests.sweep.gated_entrypoint:fail_once"
HOLD = "tests.sweep.gated_entrypoint:hold_after_checkpoint"
NO_TRIALS = {"total": 0, "pending": 0, "running": 0, "succeeded": 0, "failed": 0, "earlyStopped": 0}


def config(
    name: str, storage: pathlib.Path, gate: pathlib.Path, attempt: int, **sweep: Any
) -> trainer_config.SweepConfig:
    template = {
        "workload": {
            "entrypoint": HOLD,
            "config": {"gateDir": str(gate), "trialsRoot": str(storage / name / "trials")},
        },
        "hyperparameters": {"maxSteps": MAX_STEPS, "learningRate": 0.05},
        "precision": "fp32",
        "workers": {"replicas": 1, "gpusPerWorker": 0, "cpusPerWorker": 1},
        "checkpoint": {"intervalSteps": CHECKPOINT_EVERY, "keepLast": 2},
        "network": {"profile": "tcp", "probe": False},
        "reporting": {"everySteps": 1, "everySeconds": 0.5},
        "failurePolicy": {"maxWorkerFailures": 0},
    }
    spec = {
        "template": template,
        "objective": {"metric": "loss", "mode": "min"},
        "algorithm": "grid",
        "scheduler": {"type": "none"},
        **sweep,
    }
    return trainer_config.SweepConfig.model_validate(
        {
            "sweepName": name,
            "experimentName": name,
            "storagePath": str(storage),
            "attempt": attempt,
            "spec": spec,
        },
        by_alias=True,
    )


def row(rows: list[dict[str, Any]], entrypoint: str) -> dict[str, Any]:
    (found,) = [r for r in rows if r["parameters"].get("workload.entrypoint", HOLD) == entrypoint]
    return found


def two_attempts(
    name: str,
    tmp_path_factory: pytest.TempPathFactory,
    during_first: Callable[[pathlib.Path], contextlib.AbstractContextManager[Any]],
    **sweep: Any,
) -> sweep_support.TwoAttempts:
    storage = tmp_path_factory.mktemp(name)
    gate = tmp_path_factory.mktemp(f"{name}-gate")
    experiment_dir = storage / name
    with during_first(gate):
        first = driver.run(config(name, storage, gate, 1, **sweep), status_interval_s=0.5)
    first_rows = sweep_support.read_json(experiment_dir / "trials.json")["trials"]
    (gate / "release").touch()
    second = driver.run(config(name, storage, gate, 2, **sweep), status_interval_s=0.5)
    rows = sweep_support.read_json(experiment_dir / "trials.json")["trials"]
    return sweep_support.TwoAttempts(experiment_dir, first, first_rows, second, rows)


@contextlib.contextmanager
def ctrl_c_once_holding(gate: pathlib.Path) -> Iterator[None]:
    """SIGINT to this process (the driver) from a thread once the trial holds: a user's Ctrl+C."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.1):
            if (gate / "holding").exists():
                os.kill(os.getpid(), signal.SIGINT)
                return

    thread = threading.Thread(target=watch, name="ctrl-c", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@pytest.fixture(scope="module")
def budget_spent(sweep_ray: None, tmp_path_factory: pytest.TempPathFactory) -> sweep_support.TwoAttempts:
    return two_attempts(
        "budget-running",
        tmp_path_factory,
        lambda gate: contextlib.nullcontext(),
        searchSpace={"workload.entrypoint": {"type": "grid", "values": [FAIL, HOLD]}},
        numTrials=2,
        maxConcurrentTrials=2,
        maxFailedTrials=0,
    )


@pytest.fixture(scope="module")
def ctrl_c(sweep_ray: None, tmp_path_factory: pytest.TempPathFactory) -> sweep_support.TwoAttempts:
    return two_attempts(
        "ctrl-c-running",
        tmp_path_factory,
        ctrl_c_once_holding,
        searchSpace={"hyperparameters.learningRate": {"type": "grid", "values": [0.05]}},
        numTrials=1,
        maxConcurrentTrials=1,
    )


def test_a_trial_running_when_the_failure_budget_is_spent_counts_pending_not_early_stopped(
    budget_spent: sweep_support.TwoAttempts,
) -> None:
    first = budget_spent.first
    assert (first.outcome, first.restored) == ("failed", False)
    assert first.status["trials"] == {**NO_TRIALS, "total": 2, "pending": 1, "failed": 1}
    assert row(budget_spent.first_rows, FAIL)["state"] == "failed"
    assert row(budget_spent.first_rows, HOLD)["state"] == "pending"


def test_after_the_failure_budget_the_next_attempt_resumes_the_running_trial_from_its_checkpoint(
    budget_spent: sweep_support.TwoAttempts,
) -> None:
    second = budget_spent.second
    assert (second.outcome, second.restored, second.reason) == ("succeeded", True, None)
    assert second.status["trials"] == {**NO_TRIALS, "total": 2, "succeeded": 2}
    held = row(budget_spent.rows, HOLD)
    assert (held["state"], held["step"]) == ("succeeded", MAX_STEPS)
    assert budget_spent.resumed_at(held["id"]) == [CHECKPOINT_EVERY]
    assert [t.status for t in sweep_support.tune_trials(budget_spent.experiment_dir)] == ["TERMINATED"] * 2


def test_a_trial_running_when_ctrl_c_ends_the_attempt_counts_pending_not_early_stopped(
    ctrl_c: sweep_support.TwoAttempts,
) -> None:
    first = ctrl_c.first
    assert (first.outcome, first.exit_code) == ("interrupted", 130), first
    assert first.reason and "1 started trial(s) unfinished" in first.reason, first.reason
    assert first.status["trials"] == {**NO_TRIALS, "total": 1, "pending": 1}
    assert [row["state"] for row in ctrl_c.first_rows] == ["pending"]


def test_after_ctrl_c_the_next_attempt_resumes_the_running_trial_from_its_checkpoint(
    ctrl_c: sweep_support.TwoAttempts,
) -> None:
    second = ctrl_c.second
    assert (second.outcome, second.restored, second.reason) == ("succeeded", True, None)
    assert second.status["trials"] == {**NO_TRIALS, "total": 1, "succeeded": 1}
    (row,) = ctrl_c.rows
    assert (row["state"], row["step"]) == ("succeeded", MAX_STEPS)
    assert ctrl_c.resumed_at(row["id"]) == [CHECKPOINT_EVERY]
