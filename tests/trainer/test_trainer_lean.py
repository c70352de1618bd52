"""``LeanTorchTrainer`` (trainop_trainer/lean_trainer.py): Ray Train's TorchTrainer without the Ray Data
callback that starts a ``DatasetManager`` actor per worker group, when the run has no datasets, and with a
fixed-size scaling policy that registers no resource requests with Ray Data's ``AutoscalingCoordinator``.

No Ray runtime: the callbacks and the scaling policy are what the trainer hands its controller. That no
``DatasetManager`` actor starts and no controller requests resources in a real run is checked in
test_trainer_ray.py (the first test's controller and worker groups)."""

from __future__ import annotations

import asyncio
from typing import Any

from ray.train import ScalingConfig
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
from ray.train.v2._internal.execution.scaling_policy import create_scaling_policy
from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy
from ray.train.v2._internal.execution.scaling_policy.scaling_policy import ResizeDecision

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


def test_the_fixed_size_policy_decides_as_rays_and_never_talks_to_the_autoscaling_coordinator() -> None:
    scaling = ScalingConfig(num_workers=2, resources_per_worker={"CPU": 2})
    ray_policy = create_scaling_policy(scaling)
    assert type(ray_policy) is FixedScalingPolicy  # what fit() builds for a fixed size
    policy = lean_trainer.fixed_size(ray_policy)
    assert isinstance(policy, FixedScalingPolicy) and type(policy) is not FixedScalingPolicy
    assert policy.scaling_config is scaling

    # Ray's policy would create the coordinator's client here (and its actor on first use): ours does not.
    policy.after_controller_start(object())
    decision = policy.make_decision_for_non_running_worker_group()
    assert isinstance(decision, ResizeDecision)
    assert (decision.num_workers, decision.resources_per_worker) == (2, {"CPU": 2})
    asyncio.run(policy.before_controller_shutdown())
    policy.before_controller_abort()
    assert policy._coordinator_client is None


def test_an_elastic_scaling_policy_is_rays_own() -> None:
    elastic = create_scaling_policy(ScalingConfig(num_workers=(1, 2)))
    assert type(elastic) is not FixedScalingPolicy
    assert lean_trainer.fixed_size(elastic) is elastic
