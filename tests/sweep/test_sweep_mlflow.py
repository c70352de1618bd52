"""A sweep in MLflow: one parent run for the sweep, one child run per trial, on a real tracking server.

Two grid trials (learning rates 0.02 and 0.05) of the small MLP, run by the real sweep driver on Ray Tune
and Ray Train; the template asks for MLflow. Assertions read what the server stores (``mlflow server``,
SQLite backend).
"""

from __future__ import annotations

import pathlib

import pytest

from tests.mlflow_server import MlflowServer
from tests.sweep import sweep_support
from trainop.api import trainer_config
from trainop_trainer.sweep import driver

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_a_sweep_is_one_parent_run_with_one_child_run_per_trial(
    sweep_ray: None, mlflow_server: MlflowServer, tmp_path: pathlib.Path
) -> None:
    template = sweep_support.mlp_template(max_steps=20)
    template["tracking"] = {"mlflow": {"trackingUri": mlflow_server.uri, "experiment": "sweep-lr"}}
    config = trainer_config.SweepConfig.model_validate(
        {
            "sweepName": "lr",
            "experimentName": "lr",
            "storagePath": str(tmp_path),
            "attempt": 1,
            "spec": {
                "template": template,
                "searchSpace": {"hyperparameters.learningRate": {"type": "grid", "values": [0.02, 0.05]}},
                "objective": {"metric": "loss", "mode": "min"},
                "algorithm": "grid",
                "scheduler": {"type": "none"},
                "numTrials": 2,
                "maxConcurrentTrials": 2,
            },
        },
        by_alias=True,
    )

    result = driver.run(config, status_interval_s=0.5)

    assert result.outcome == "succeeded", result
    client = mlflow_server.client()
    experiment = client.get_experiment_by_name("sweep-lr").experiment_id
    (parent,) = client.search_runs([experiment], filter_string="tags.`trainop.sweep` = 'lr'")
    assert parent.data.params["searchSpace.hyperparameters.learningRate.values"] == "[0.02, 0.05]"
    children = client.search_runs(
        [experiment], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    assert len(children) == 2 and len({c.data.tags["trainop.run"] for c in children}) == 2
    assert sorted(c.data.params["hyperparameters.learningRate"] for c in children) == ["0.02", "0.05"]
    for child in children:
        assert child.info.status == "FINISHED"
        assert [m.step for m in client.get_metric_history(child.info.run_id, "loss")][-1] == 20
