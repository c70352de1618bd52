"""The driver's books, fed the events Tune sends: states as status.trials counts them and the best trial."""

from __future__ import annotations

import math

import pytest

from trainop.api import tuningsweep
from trainop_trainer.sweep import book

MIN, MAX = tuningsweep.Mode.MIN, tuningsweep.Mode.MAX


def started(trials: book.TrialBook, trial_id: str, lr: float = 0.1) -> None:
    trials.observe(trial_id, status=book.TUNE_PENDING, parameters={"hyperparameters.learningRate": lr})
    trials.started(trial_id)


def terminated(trials: book.TrialBook, trial_id: str) -> None:
    trials.observe(trial_id, status=book.TUNE_TERMINATED, parameters={})


def test_a_trial_whose_training_returned_succeeded() -> None:
    trials = book.TrialBook(metric="loss", mode=MIN, max_t=100)
    started(trials, "a")
    trials.result("a", {"step": 60, "loss": 1.0})
    trials.completed("a")
    terminated(trials, "a")
    assert trials.counts() == tuningsweep.TrialCounts(total=1, succeeded=1)


@pytest.mark.parametrize(("step", "state"), [(30, "earlyStopped"), (99, "earlyStopped"), (100, "succeeded")])
def test_a_trial_the_scheduler_stopped_succeeded_only_at_max_t(step: int, state: str) -> None:
    trials = book.TrialBook(metric="loss", mode=MIN, max_t=100)
    started(trials, "a")
    trials.result("a", {"step": step, "loss": 1.0, "done": True})  # Tune marks the deciding result done
    trials.completed("a")
    terminated(trials, "a")
    assert [row["state"] for row in trials.rows()] == [state]


def test_trials_ended_by_the_sweep_count_early_stopped_and_those_never_started_not_at_all() -> None:
    trials = book.TrialBook(metric="loss", mode=MIN, max_t=None)
    started(trials, "running")
    trials.result("running", {"step": 5, "loss": 2.0})
    trials.observe("never", status=book.TUNE_PENDING, parameters={})
    for trial_id in ("running", "never"):  # the goal was reached: Tune stops everything, no callbacks
        terminated(trials, trial_id)
    assert trials.counts() == tuningsweep.TrialCounts(total=1, early_stopped=1)


def test_counts_follow_tune_statuses_and_always_add_up() -> None:
    trials = book.TrialBook(metric="loss", mode=MIN, max_t=None)
    for trial_id in "abcd":
        trials.observe(trial_id, status=book.TUNE_PENDING, parameters={})
    started(trials, "a")
    started(trials, "b")
    trials.errored("b", "ValueError: boom")
    counts = trials.counts()
    assert counts == tuningsweep.TrialCounts(total=4, pending=2, running=1, failed=1)
    assert (
        counts.total
        == counts.pending + counts.running + counts.succeeded + counts.failed + counts.early_stopped
    )


def test_an_interrupted_attempt_counts_its_running_trials_pending_and_a_rerun_clears_the_failure() -> None:
    trials = book.TrialBook(metric="loss", mode=MIN, max_t=None)
    started(trials, "a")
    started(trials, "b")
    trials.errored("b", "ValueError: boom")
    trials.requeue_unfinished()
    assert trials.counts() == tuningsweep.TrialCounts(total=2, pending=1, failed=1)
    trials.observe("b", status=book.TUNE_PENDING, parameters={})  # restored with resume_errored
    trials.started("b")
    assert trials.failed() == [] and trials.records["b"].error is None


@pytest.mark.parametrize(("mode", "winner"), [(MIN, "low"), (MAX, "high")])
def test_best_trial_is_the_best_value_ever_reported_by_a_trial_that_did_not_fail(
    mode: tuningsweep.Mode, winner: str
) -> None:
    trials = book.TrialBook(metric="loss", mode=mode, max_t=None)
    for trial_id, values in {
        "low": [3.0, 0.5, 0.9],  # its best is not its last value
        "high": [4.0, 8.0],
        "diverged": [math.nan, math.inf],
        "broken": [0.1, 9.0],
    }.items():
        started(trials, trial_id)
        for step, value in enumerate(values):
            trials.result(trial_id, {"step": step, "loss": value})
    trials.errored("broken", "RuntimeError: boom")
    best = trials.best()
    assert best is not None and best.id == winner
    assert best.best_value == {"low": 0.5, "high": 8.0}[winner]


def test_ties_go_to_the_earlier_trial() -> None:
    trials = book.TrialBook(metric="loss", mode=MIN, max_t=None)
    for trial_id in ("first", "second"):
        started(trials, trial_id)
        trials.result(trial_id, {"step": 1, "loss": 0.25})
    best = trials.best()
    assert best is not None and best.id == "first"


def test_state_saved_with_the_experiment_restores_the_same_books() -> None:
    trials = book.TrialBook(metric="loss", mode=MIN, max_t=10)
    started(trials, "a", lr=0.3)
    trials.result("a", {"step": 4, "loss": 1.5})
    restored = book.TrialBook(metric="loss", mode=MIN, max_t=10)
    restored.load_state(trials.to_state())
    assert restored.rows() == trials.rows() and restored.counts() == trials.counts()


@pytest.mark.parametrize(
    ("value", "goal", "mode", "reached"),
    [
        (0.2, 0.25, MIN, True),
        (0.25, 0.25, MIN, True),
        (0.3, 0.25, MIN, False),
        (900.0, 1000.0, MAX, False),
        (1000.0, 1000.0, MAX, True),
        (math.nan, 0.25, MIN, False),
        (None, 0.25, MIN, False),
        (0.1, None, MIN, False),
    ],
)
def test_goal_is_reached_at_or_beyond_the_goal_in_the_objectives_direction(
    value: float | None, goal: float | None, mode: tuningsweep.Mode, reached: bool
) -> None:
    assert book.reaches_goal(value, goal=goal, mode=mode) is reached
