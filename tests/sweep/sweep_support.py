"""Helpers of the sweep tests: small CPU sweep specs and readers of what a sweep leaves on disk."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainop_trainer.sweep import driver


def mlp_template(*, max_steps: int, hidden_dim: int = 32, interval_steps: int = 10) -> dict[str, Any]:
    """A TrainingJobSpec (wire form) for a tiny CPU run: the MLP on synthetic data, one gloo worker."""
    return {
        "workload": {
            "model": "mlp",
            "config": {"inputDim": 16, "hiddenDim": hidden_dim},
            "dataset": {"kind": "synthetic", "numSamples": 4096, "numClasses": 10, "numWorkers": 0},
        },
        "hyperparameters": {"maxSteps": max_steps, "batchSizePerWorker": 64, "learningRate": 0.05},
        "precision": "fp32",
        "workers": {"replicas": 1, "gpusPerWorker": 0, "cpusPerWorker": 1},
        "checkpoint": {"intervalSteps": interval_steps, "keepLast": 2},
        "network": {"profile": "tcp", "probe": False},
        "reporting": {"everySteps": 10, "everySeconds": 0.5},
    }


def read_json(path: pathlib.Path) -> Any:
    return json.loads(path.read_text())


def events(run_dir: pathlib.Path) -> list[dict[str, Any]]:
    """The trainer's events of one trial run (``start`` per worker-group start, ``resume`` with its step)."""
    lines = (run_dir / "trainop" / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def tune_trials(experiment_dir: pathlib.Path) -> list[Any]:
    """Tune's own record of the experiment's trials, in creation order (public ExperimentAnalysis)."""
    from ray.tune import ExperimentAnalysis

    return list(ExperimentAnalysis(str(experiment_dir)).trials)


def reported(experiment_dir: pathlib.Path, trial_id: str) -> list[dict[str, Any]]:
    """Every result Tune recorded for a trial (its result.json lines)."""
    lines = (experiment_dir / trial_id / "result.json").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@dataclasses.dataclass(frozen=True)
class TwoAttempts:
    """Two driver runs of one experiment (a restart test's module fixture) and its trials after each."""

    experiment_dir: pathlib.Path
    first: driver.SweepResult
    first_rows: list[dict[str, Any]]  # trials.json right after attempt 1
    second: driver.SweepResult
    rows: list[dict[str, Any]]  # trials.json after attempt 2

    def run_dir(self, trial_id: str) -> pathlib.Path:
        return self.experiment_dir / "trials" / f"{self.experiment_dir.name}-{trial_id}"

    def resumed_at(self, trial_id: str) -> list[int]:
        """The steps the trial's runs resumed at."""
        return [e["step"] for e in events(self.run_dir(trial_id)) if e["event"] == "resume"]
