"""``objective.goal`` ends a sweep as soon as a trial reports a value at or beyond it.

Two grid points run one after the other; the first (learning rate 0.1) brings the loss of the MLP from
about 2.3 below 2.0 long before its 2000 steps end, so the sweep ends there and the second point is never
tried.
"""

from __future__ import annotations

import pathlib

import pytest

from tests.sweep import sweep_support
from trainop.api import trainer_config
from trainop_trainer.sweep import driver

pytestmark = [pytest.mark.ray, pytest.mark.slow]

GOAL = 2.0
MAX_STEPS = 2000


def test_reaching_the_goal_ends_the_sweep_and_the_waiting_trials_never_start(
    sweep_ray: None, tmp_path: pathlib.Path
) -> None:
    spec = {
        "template": sweep_support.mlp_template(max_steps=MAX_STEPS, hidden_dim=256, interval_steps=100),
        "searchSpace": {"hyperparameters.learningRate": {"type": "grid", "values": [0.1, 0.05]}},
        "objective": {"metric": "loss", "mode": "min", "goal": GOAL},
        "algorithm": "grid",
        "scheduler": {"type": "none"},
        "numTrials": 2,
        "maxConcurrentTrials": 1,
    }
    config = trainer_config.SweepConfig.model_validate(
        {"sweepName": "goal", "experimentName": "goal", "storagePath": str(tmp_path), "spec": spec},
        by_alias=True,
    )

    result = driver.run(config, status_interval_s=0.5)

    assert (result.outcome, result.reason) == ("succeeded", None)
    trials = sweep_support.tune_trials(tmp_path / "goal")
    assert [t.config["hyperparameters.learningRate"] for t in trials] == [0.1]  # 0.05 never became a trial
    reports = sweep_support.reported(tmp_path / "goal", trials[0].trial_id)
    assert reports[-1]["loss"] <= GOAL
    assert all(r["loss"] > GOAL for r in reports[:-1])  # it stopped at the first report that reached it
    assert reports[-1]["step"] < MAX_STEPS
    assert result.status["trials"]["total"] == 1
    best = result.status["bestTrial"]
    assert (best["id"], best["value"]) == (trials[0].trial_id, reports[-1]["loss"])
