"""A grid sweep whose first attempt spends its failure budget, and the second attempt that resumes it.

The grid is ``hyperparameters.maxSteps`` [20, 60] x ``nccl.NCCL_ALGO`` [Ring, Tree], one trial at a time,
``maxFailedTrials: 1``, ``maxWorkerFailures: 0``. The trainer's failure injection (kill one worker once per
run, right after the checkpoint at step 40; what ``TRAINOP_INJECT_FAILURE_AT_STEP`` does) fails both
60-step trials in attempt 1 and never touches the 20-step ones. Attempt 2 is a new driver run with the same
experiment name and storage path, as the operator's next RayJob would be.

Why it is deterministic: one trial at a time, in grid order (20, 60, 20, 60 steps), so the budget is spent
by the fourth trial's failure, when every other trial has ended. With two at a time (until 2026-11-29) which
trials ran when the budget was spent depended on the machine's load. A trial still running then is counted
pending and resumed by attempt 2 (``test_sweep_restart_running_trial.py`` pins that down without timing);
the ``earlyStopped`` trial that CI of cb21fd4 saw here came, most likely, from pytest-timeout ending
attempt 2: docs/sweep.md, "Restart and resume".

Both attempts run once for the module (they are the expensive part); each test checks one behaviour.
"""

from __future__ import annotations

import itertools
import pathlib

import pytest

from tests.sweep import sweep_support
from trainop.api import trainer_config
from trainop_trainer.sweep import driver

pytestmark = [pytest.mark.ray, pytest.mark.slow]

NAME = "grid-restart"
MAX_STEPS = [20, 60]
ALGOS = ["Ring", "Tree"]
INJECT_AT = 40


def config(storage: pathlib.Path, attempt: int) -> trainer_config.SweepConfig:
    template = sweep_support.mlp_template(max_steps=60)
    template["failurePolicy"] = {"maxWorkerFailures": 0}
    spec = {
        "template": template,
        "searchSpace": {
            "hyperparameters.maxSteps": {"type": "grid", "values": MAX_STEPS},
            "nccl.NCCL_ALGO": {"type": "grid", "values": ALGOS},
        },
        "objective": {"metric": "loss", "mode": "min"},
        "algorithm": "grid",
        "scheduler": {"type": "none"},
        "numTrials": 4,
        "maxConcurrentTrials": 1,
        "maxFailedTrials": 1,
    }
    return trainer_config.SweepConfig.model_validate(
        {
            "sweepName": NAME,
            "experimentName": NAME,
            "storagePath": str(storage),
            "attempt": attempt,
            "spec": spec,
        },
        by_alias=True,
    )


@pytest.fixture(scope="module")
def two_attempts(sweep_ray: None, tmp_path_factory: pytest.TempPathFactory) -> sweep_support.TwoAttempts:
    storage = tmp_path_factory.mktemp("grid-restart")
    experiment_dir = storage / NAME
    first = driver.run(config(storage, 1), status_interval_s=0.5, inject_failure_at_step=INJECT_AT)
    first_rows = sweep_support.read_json(experiment_dir / "trials.json")["trials"]
    second = driver.run(config(storage, 2), status_interval_s=0.5, inject_failure_at_step=INJECT_AT)
    rows = sweep_support.read_json(experiment_dir / "trials.json")["trials"]
    return sweep_support.TwoAttempts(experiment_dir, first, first_rows, second, rows)


def test_more_failed_trials_than_max_failed_trials_fails_the_attempt_with_a_clear_reason(
    two_attempts: sweep_support.TwoAttempts,
) -> None:
    first = two_attempts.first
    assert (first.outcome, first.exit_code, first.restored) == ("failed", 1, False)
    assert first.reason is not None
    assert first.reason.startswith(
        "2 trials failed, more than spec.maxFailedTrials (1); first failure: trial "
    )
    assert "WorkerGroupError" in first.reason  # the injected worker death, as Ray Train reported it
    assert first.status["trials"]["failed"] == 2
    failed = [row for row in two_attempts.first_rows if row["state"] == "failed"]
    assert sorted(row["parameters"]["hyperparameters.maxSteps"] for row in failed) == [60, 60]
    assert all(row["error"].startswith("WorkerGroupError: ") for row in failed)


def test_a_new_attempt_keeps_finished_trials_and_resumes_the_others_from_their_checkpoints(
    two_attempts: sweep_support.TwoAttempts,
) -> None:
    second = two_attempts.second
    assert (second.outcome, second.restored, second.reason) == ("succeeded", True, None)
    assert second.status["trials"] == {
        "total": 4,
        "pending": 0,
        "running": 0,
        "succeeded": 4,
        "failed": 0,
        "earlyStopped": 0,
    }
    finished_first = {row["id"] for row in two_attempts.first_rows if row["state"] == "succeeded"}
    assert finished_first, "attempt 1 finished no trial"
    for trial_id in finished_first:  # not run again: one worker-group start, no resume
        assert [e["event"] for e in sweep_support.events(two_attempts.run_dir(trial_id))] == ["start"]
    for row in two_attempts.first_rows:
        if row["state"] == "failed":  # run again, from the checkpoint written just before the kill
            resumes = [
                e for e in sweep_support.events(two_attempts.run_dir(row["id"])) if e["event"] == "resume"
            ]
            assert [e["step"] for e in resumes] == [INJECT_AT]


def test_grid_search_runs_every_grid_point_exactly_once(two_attempts: sweep_support.TwoAttempts) -> None:
    trials = sweep_support.tune_trials(two_attempts.experiment_dir)
    points = sorted((t.config["hyperparameters.maxSteps"], t.config["nccl.NCCL_ALGO"]) for t in trials)
    assert points == sorted(itertools.product(MAX_STEPS, ALGOS))
    assert all(t.status == "TERMINATED" for t in trials)


def test_sampled_parameters_and_nccl_variables_land_in_each_trials_trainer_config(
    two_attempts: sweep_support.TwoAttempts,
) -> None:
    for trial in sweep_support.tune_trials(two_attempts.experiment_dir):
        written = trainer_config.TrainerConfig.model_validate_json(
            (two_attempts.run_dir(trial.trial_id) / "trainer.json").read_text(), by_alias=True, by_name=False
        )
        assert written.run_name == f"{NAME}-{trial.trial_id}"
        assert written.spec.hyperparameters.max_steps == trial.config["hyperparameters.maxSteps"]
        assert written.spec.network.nccl_env == {"NCCL_ALGO": trial.config["nccl.NCCL_ALGO"]}
        assert written.status_target is None  # the sweep's status belongs to its driver
        last = sweep_support.reported(two_attempts.experiment_dir, trial.trial_id)[-1]
        assert last["step"] == trial.config["hyperparameters.maxSteps"]
