"""An unmodified Ray Train V2 function under trainop (``spec.workload.rayTrain``), on real Ray.

The function is ``examples/ray_train/trainop_ray_example/digits.py``: Ray's FashionMNIST tutorial loop on
scikit-learn's bundled digits, written only against Ray Train's API. trainop supplies the TorchTrainer,
storage, restarts and attempts, and maps the function's reports and checkpoints onto the status through
Ray Train's callback interface. A worker is killed for real (SIGKILL to its PID, registered by trainop's
wrapper for the preStop hook); nothing is mocked.
"""

from __future__ import annotations

import os
import pathlib
import signal
import threading
from typing import Any

import pytest
import trainer_support

from trainop.api import trainer_config
from trainop_trainer import ray_train

pytestmark = pytest.mark.ray

EXAMPLES_RAY = trainer_support.REPO / "examples" / "ray_train"


def function_config(
    storage: pathlib.Path, name: str, *, epochs: int, max_worker_failures: int, attempt: int = 1
) -> trainer_config.TrainerConfig:
    spec: dict[str, Any] = {
        "workload": {
            "rayTrain": "trainop_ray_example.digits:train_loop_per_worker",
            "config": {"lr": 0.05, "epochs": epochs, "batch_size": 32},
        },
        "hyperparameters": {"epochs": epochs},
        "precision": "fp32",
        "workers": {"replicas": 2, "gpusPerWorker": 0, "cpusPerWorker": 1},
        "checkpoint": {"intervalSteps": 1, "keepLast": 2},
        "failurePolicy": {"maxWorkerFailures": max_worker_failures},
        "network": {"profile": "tcp", "probe": False},
        "reporting": {"metricsPort": trainer_support.free_port_block()},
    }
    return trainer_config.TrainerConfig.model_validate(
        {"jobName": name, "runName": name, "storagePath": str(storage), "attempt": attempt, "spec": spec},
        by_alias=True,
    )


class KillAfterFirstCheckpoint(threading.Thread):
    """SIGKILLs rank 1 once the function has reported its first checkpoint (read from trainop's events)."""

    def __init__(self, config: trainer_config.TrainerConfig, pid_dir: pathlib.Path) -> None:
        super().__init__(daemon=True)
        self.config, self.pid_dir = config, pid_dir
        self.killed_after_epoch: int | None = None
        self._done = threading.Event()

    def run(self) -> None:
        events = trainer_support.run_dir(self.config) / "trainop" / "events.jsonl"
        pid_file = self.pid_dir / f"{self.config.run_name}-rank1.pid"
        while not self._done.wait(0.1):
            try:
                reports = [e for e in trainer_support.events(self.config) if e["event"] == "report"]
            except (OSError, ValueError):
                continue
            if events.exists() and any(r["checkpoint"] for r in reports) and pid_file.exists():
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
                self.killed_after_epoch = reports[-1]["epoch"]
                return

    def stop(self) -> None:
        self._done.set()
        self.join()


def test_an_unmodified_ray_train_function_gets_status_and_resumes_after_a_kill_and_in_a_new_attempt(
    ray_cluster: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_dir = tmp_path / "pids"
    pythonpath = os.pathsep.join(p for p in (str(EXAMPLES_RAY), os.environ.get("PYTHONPATH")) if p)
    monkeypatch.setenv("PYTHONPATH", pythonpath)  # forwarded to the workers
    monkeypatch.setenv("TRAINOP_PID_DIR", str(pid_dir))  # forwarded too: where the wrapper registers PIDs
    monkeypatch.syspath_prepend(str(EXAMPLES_RAY))
    config = function_config(tmp_path / "storage", "ray-digits", epochs=12, max_worker_failures=1)

    killer = KillAfterFirstCheckpoint(config, pid_dir)
    killer.start()
    first = ray_train.run(config)
    killer.stop()

    assert first.outcome == "completed", first
    assert killer.killed_after_epoch is not None, "the worker was never killed"
    events = trainer_support.events(config)
    starts = [e for e in events if e["event"] == "start"]
    assert len(starts) == 2 and len({e["launch"] for e in starts}) == 1  # Ray Train restarted the group
    assert [e["event"] for e in events].count("resume") == 1
    epochs = [e["epoch"] for e in events if e["event"] == "report"]
    restart = next(i for i, e in enumerate(events) if e["event"] == "start" and i > 0)
    after_restart = [e["epoch"] for e in events[restart:] if e["event"] == "report"]
    # Resumed from a checkpoint, not from scratch: epoch 0 is never reported again.
    assert after_restart[0] > 0 and 0 not in after_restart, epochs
    assert set(epochs) == set(range(12)) and epochs[-1] == 11

    status = trainer_support.status(config)
    assert status["progress"]["epoch"] == 11 and status["progress"]["workerRestarts"] == 1
    assert status["evaluation"]["metrics"]["accuracy"] > 0.8, status[
        "evaluation"
    ]  # the tutorial's test split
    checkpoint = pathlib.Path(status["checkpoint"]["path"])
    assert (checkpoint / "checkpoint.pt").is_file() and checkpoint.parent == trainer_support.run_dir(config)
    assert status["cost"]["allocatedSeconds"] >= status["cost"]["trainingSeconds"] > 0

    # A new attempt (a new TorchTrainer, same run name and storage) with two more epochs: Ray Train hands the
    # function attempt 1's last checkpoint, so it trains epochs 12 and 13 only.
    second = ray_train.run(
        function_config(tmp_path / "storage", "ray-digits", epochs=14, max_worker_failures=1, attempt=2)
    )
    assert second.outcome == "completed", second
    events = trainer_support.events(config)
    last_launch = [e for e in events if e["event"] == "start"][-1]["launch"]
    assert [e["epoch"] for e in events if e["event"] == "report" and e["launch"] == last_launch] == [12, 13]
    assert trainer_support.status(config)["progress"]["epoch"] == 13
