"""Where a sweep keeps its files, all under ``<storagePath>/<experimentName>/`` (the checkpoint volume):

    <experiment>/                      Ray Tune's experiment directory (experiment state, searcher state,
                                       one directory per trial named by its trial id)
    <experiment>/status.json           the driver's status records as the CR carries them (always written)
    <experiment>/trials.json           one row per trial: local mode's table
    <experiment>/trials/<sweep>-<id>/  the packaged trainer's run of that trial: checkpoints/, status.json,
                                       trainop/events.jsonl (see docs/trainer.md)

A trial's run name ``<sweep>-<trial id>`` is stable for the trial's whole life: when a restored experiment
runs a trial again, its TorchTrainer finds the same run directory and resumes from its checkpoints.
Pure: no Ray, no I/O.
"""

from __future__ import annotations

import dataclasses
import pathlib

from trainop.api import trainer_config

TRIALS_DIR = "trials"


def trial_run_name(sweep_name: str, trial_id: str) -> str:
    return f"{sweep_name}-{trial_id}"


@dataclasses.dataclass(frozen=True)
class SweepPaths:
    storage_path: pathlib.Path
    experiment_name: str

    @classmethod
    def for_config(cls, config: trainer_config.SweepConfig) -> SweepPaths:
        return cls(
            storage_path=pathlib.Path(config.storage_path).resolve(), experiment_name=config.experiment_name
        )

    @property
    def experiment_dir(self) -> pathlib.Path:
        return self.storage_path / self.experiment_name

    @property
    def status_file(self) -> pathlib.Path:
        return self.experiment_dir / "status.json"

    @property
    def trials_file(self) -> pathlib.Path:
        return self.experiment_dir / "trials.json"

    @property
    def trials_root(self) -> pathlib.Path:
        """The storage path of every trial's TorchTrainer run."""
        return self.experiment_dir / TRIALS_DIR

    def run_dir(self, sweep_name: str, trial_id: str) -> pathlib.Path:
        return self.trials_root / trial_run_name(sweep_name, trial_id)
