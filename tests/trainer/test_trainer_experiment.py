"""The experiment around a run, end to end: evaluation on status, the best checkpoint through retention,
MLflow and TensorBoard, a real learning check.

Real parts only: a real MLflow tracking server (``mlflow server``, SQLite backend; assertions on what the
server stores, read with MLflow's client), real torch.distributed (gloo, 2 ranks under torchrun or Ray
Train), real Ray, TensorBoard's own event reader, scikit-learn's bundled digits (nothing downloaded).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import threading
from typing import Any

import pytest
import trainer_support

from tests.mlflow_server import MlflowServer
from trainop.api import trainer_config
from trainop_trainer import checkpoint_store, ray_train

# The stated bar of the learning check: an MLP on 80 % of the digits, evaluated on the held-out 20 %.
DIGITS_VALIDATION_ACCURACY = 0.93


def digits_config(
    storage: pathlib.Path,
    name: str,
    *,
    mlflow_uri: str,
    max_steps: int,
    evaluate_every: int,
    checkpoint_every: int,
    keep_last: int,
    keep_best: dict[str, str] | None = None,
    max_worker_failures: int = 2,
) -> trainer_config.TrainerConfig:
    config = trainer_support.mlp_config(
        storage,
        name,
        max_steps=max_steps,
        interval_steps=checkpoint_every,
        every_steps=25,
        batch_size=32,
        max_worker_failures=max_worker_failures,
        workload={
            "model": "mlp",
            "config": {"hiddenDim": 128},
            "dataset": {"kind": "digits", "numWorkers": 0},
        },
    )
    data = config.model_dump(mode="json", by_alias=True)
    spec = data["spec"]
    spec["hyperparameters"]["learningRate"] = 0.1
    spec["evaluation"] = {"everySteps": evaluate_every, "holdoutFraction": 0.2}
    spec["checkpoint"]["keepLast"] = keep_last
    spec["checkpoint"]["keepBest"] = keep_best
    spec["tracking"] = {"tensorboard": True, "mlflow": {"trackingUri": mlflow_uri, "experiment": name}}
    return trainer_config.TrainerConfig.model_validate(data, by_alias=True)


def run_under_torchrun(config: trainer_config.TrainerConfig) -> subprocess.CompletedProcess[str]:
    path = trainer_support.write_config(config, pathlib.Path(config.storage_path) / "trainer.json")
    return trainer_support.run_torchrun(path)


def tensorboard_scalars(log_dir: pathlib.Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of a scalar, read with TensorBoard's own event reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


@pytest.mark.slow
def test_a_small_classifier_learns_the_bundled_digits_to_the_stated_validation_accuracy(
    mlflow_server: MlflowServer, tmp_path: pathlib.Path
) -> None:
    config = digits_config(
        tmp_path,
        "digits-learns",
        mlflow_uri=mlflow_server.uri,
        max_steps=300,
        evaluate_every=50,
        checkpoint_every=100,
        keep_last=3,
    )
    done = run_under_torchrun(config)
    assert done.returncode == 0, done.stdout + done.stderr

    status = trainer_support.status(config)
    evaluation = status["evaluation"]
    assert evaluation["step"] == 300 and evaluation["samples"] == 359  # 20 % of 1,797, every sample once
    assert evaluation["metrics"]["accuracy"] >= DIGITS_VALIDATION_ACCURACY, evaluation
    assert evaluation["metrics"]["top5Accuracy"] >= evaluation["metrics"]["accuracy"]

    client = mlflow_server.client()
    run = client.get_run(status["tracking"]["mlflowRunId"])
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "eval/accuracy")
    assert [m.step for m in history] == [50, 100, 150, 200, 250, 300]
    assert history[-1].value == pytest.approx(evaluation["metrics"]["accuracy"], abs=1e-6)
    assert history[-1].value >= DIGITS_VALIDATION_ACCURACY
    assert run.data.params["workload.dataset.kind"] == "digits"
    assert run.data.params["hyperparameters.learningRate"] == "0.1"
    assert run.data.tags["trainop.job"] == "digits-learns" and run.data.tags["trainop.attempt"] == "1"
    final = run.data.tags["trainop.checkpoint.final"]
    assert final == str(trainer_support.run_dir(config) / "checkpoints" / "step_300")
    assert "checkpoints/final.json" in [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")]

    board = tensorboard_scalars(pathlib.Path(status["tracking"]["tensorboardLogDir"]), "eval/accuracy")
    assert [step for step, _ in board] == [50, 100, 150, 200, 250, 300]
    assert board[-1][1] == pytest.approx(history[-1].value, rel=1e-6)


class StatusWatcher:
    """Collects the evaluation steps status.json shows while a run goes on (what `kubectl get -w` sees)."""

    def __init__(self, config: trainer_config.TrainerConfig) -> None:
        self.config = config
        self.seen: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            step = (trainer_support.status(self.config).get("evaluation") or {}).get("step")
            if step is not None and (not self.seen or self.seen[-1] != step):
                self.seen.append(step)

    def __enter__(self) -> StatusWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.ray
def test_evaluation_moves_the_best_checkpoint_survives_retention_and_a_new_attempt_continues_the_mlflow_run(
    ray_cluster: str, mlflow_server: MlflowServer, tmp_path: pathlib.Path
) -> None:
    # Ranked by the *lowest* accuracy, the best checkpoint is the oldest evaluated one: exactly the one
    # keepLast: 1 would delete first.
    config = digits_config(
        tmp_path,
        "digits-resume",
        mlflow_uri=mlflow_server.uri,
        max_steps=200,
        evaluate_every=40,
        checkpoint_every=40,
        keep_last=1,
        keep_best={"metric": "accuracy", "mode": "min"},
        max_worker_failures=0,
    )
    with StatusWatcher(config) as watcher:
        first = ray_train.run(config, inject_failure_at_step=100)  # a worker dies: attempt 1 fails
        assert first.outcome == "failed", first
        second = ray_train.run(config.model_copy(update={"attempt": 2}))
    assert (second.outcome, second.step) == ("completed", 200), second

    assert watcher.seen == sorted(watcher.seen) and {40, 80, 200} <= set(watcher.seen), watcher.seen
    status = trainer_support.status(config)
    best = status["checkpoint"]["best"]
    assert (best["step"], best["metric"]) == (40, "accuracy")
    store = checkpoint_store.CheckpointStore(trainer_support.run_dir(config) / "checkpoints")
    assert store.committed_steps() == [200, 40]  # keepLast 1, and the best

    client = mlflow_server.client()
    runs = client.search_runs(
        [client.get_experiment_by_name("digits-resume").experiment_id],
        filter_string="tags.`trainop.run` = 'digits-resume'",
    )
    assert [r.info.run_id for r in runs] == [status["tracking"]["mlflowRunId"]]  # one run, both attempts
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.tags["trainop.attempt"] == "2"
    assert sorted({m.value for m in client.get_metric_history(run.info.run_id, "trainop.attempt")}) == [
        1.0,
        2.0,
    ]
    accuracy = client.get_metric_history(run.info.run_id, "eval/accuracy")
    assert {40, 80, 120, 160, 200} <= {m.step for m in accuracy}
    assert min(m.value for m in accuracy if m.step == 40) == pytest.approx(best["value"], abs=1e-6)
    assert run.data.tags["trainop.checkpoint.best.step"] == "40"


def test_a_user_entrypoints_evaluate_hook_feeds_status_and_ranks_its_checkpoints(
    tmp_path: pathlib.Path,
) -> None:
    config = trainer_support.mlp_config(
        tmp_path,
        "user-evaluates",
        max_steps=200,
        interval_steps=100,
        every_steps=50,
        workload={"entrypoint": "trainop_example.regression:train", "config": {"slope": 3.0, "bias": -1.0}},
    )
    data = config.model_dump(mode="json", by_alias=True)
    data["spec"]["evaluation"] = {"everySteps": 50}
    data["spec"]["checkpoint"]["keepLast"] = 1
    data["spec"]["checkpoint"]["keepBest"] = {"metric": "loss", "mode": "min"}
    data["spec"]["tracking"] = {"tensorboard": True}
    config = trainer_config.TrainerConfig.model_validate(data, by_alias=True)
    path = trainer_support.write_config(config, tmp_path / "trainer.json")
    done = trainer_support.run_torchrun(
        path,
        PYTHONPATH=os.pathsep.join(
            p for p in (str(trainer_support.EXAMPLES_USER), os.environ.get("PYTHONPATH")) if p
        ),
    )
    assert done.returncode == 0, done.stdout + done.stderr

    status = trainer_support.status(config)
    losses = tensorboard_scalars(trainer_support.run_dir(config) / "tensorboard", "eval/loss")
    assert [step for step, _ in losses] == [50, 100, 150, 200]  # the hook ran at every evaluation step
    assert losses[-1][1] < losses[0][1] / 10  # the fit converged on the held-out points
    assert status["evaluation"]["step"] == 200
    assert status["evaluation"]["metrics"]["loss"] == pytest.approx(losses[-1][1], rel=1e-5)
    best_step = min(losses, key=lambda point: point[1])[0]
    assert status["checkpoint"]["best"]["step"] == best_step
    # Every evaluated step was checkpointed (keepBest); keepLast 1 kept the newest, and the best.
    kept = checkpoint_store.CheckpointStore(trainer_support.run_dir(config) / "checkpoints").committed_steps()
    assert kept == sorted({200, best_step}, reverse=True)
