"""``LeanTorchTrainer`` (trainop_trainer/lean_trainer.py): Ray Train's TorchTrainer without the Ray Data
callback that starts a ``DatasetManager`` actor per worker group, when the run has no datasets.

No Ray runtime: the callbacks are what the trainer hands its controller. That no ``DatasetManager`` actor
starts in a real run is checked in test_trainer_ray.py (the first test's worker groups)."""

from __future__ import annotations

from typing import Any

from ray.train import ScalingConfig
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback

from trainop_trainer import lean_trainer, restart_policy


def _loop(config: dict[str, Any]) -> None:
    del config


def _callback_types(trainer: Any) -> list[type]:
    return [type(callback) for callback in trainer._create_default_callbacks()]


def test_this_ray_train_has_the_hook_the_lean_trainer_needs() -> None:
    # A Ray upgrade that renames the hook or the callback would make the trainer Ray's as is, silently.
    assert lean_trainer.lean()


def test_without_datasets_the_datasets_callback_is_left_out_and_every_other_default_stays() -> None:
    scaling = ScalingConfig(num_workers=2)
    lean = _callback_types(lean_trainer.LeanTorchTrainer(_loop, scaling_config=scaling))
    with_data = _callback_types(
        lean_trainer.LeanTorchTrainer(_loop, scaling_config=scaling, datasets={"train": lambda: None})
    )
    assert DatasetsCallback not in lean
    assert DatasetsCallback in with_data  # a run with datasets gets Ray's trainer unchanged
    assert lean == [kind for kind in with_data if kind is not DatasetsCallback]


def test_the_failure_policy_trainer_is_lean_too() -> None:
    assert issubclass(restart_policy.PolicyTorchTrainer, lean_trainer.LeanTorchTrainer)
