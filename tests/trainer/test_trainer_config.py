"""From the job spec to Ray Train's worker layout, run paths, and the local machine's plan."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from trainop.api import trainer_config, trainingjob
from trainop_trainer import config, local


def spec(**workers: Any) -> trainingjob.TrainingJobSpec:
    return trainingjob.TrainingJobSpec.model_validate(
        {
            "workload": {"model": "mlp"},
            "hyperparameters": {"maxSteps": 10},
            "workers": workers,
            "precision": "fp32",
        },
        by_alias=True,
    )


@pytest.mark.parametrize(
    ("workers", "expected"),
    [
        (
            {"replicas": 2, "gpusPerWorker": 8, "cpusPerWorker": 32},
            config.Scaling(num_workers=16, use_gpu=True, resources_per_worker={"CPU": 4.0, "GPU": 1.0}),
        ),
        (
            {"replicas": 1, "gpusPerWorker": 1, "cpusPerWorker": 4},
            config.Scaling(num_workers=1, use_gpu=True, resources_per_worker={"CPU": 4.0, "GPU": 1.0}),
        ),
        (
            {"replicas": 3, "gpusPerWorker": 0, "cpusPerWorker": 2},
            config.Scaling(num_workers=3, use_gpu=False, resources_per_worker={"CPU": 2.0}),
        ),
    ],
)
def test_one_ray_train_worker_per_gpu_or_per_replica_on_cpu(
    workers: dict[str, Any], expected: config.Scaling
) -> None:
    scaling = config.scaling_for(spec(**workers))
    assert scaling == expected
    assert scaling.backend == ("nccl" if expected.use_gpu else "gloo")


def test_run_files_live_in_the_ray_train_run_directory_on_the_volume() -> None:
    cfg = trainer_config.TrainerConfig(
        job_name="j", run_name="j", storage_path="/checkpoints", spec=spec(replicas=1, gpusPerWorker=0)
    )
    paths = config.paths_for(cfg)
    assert paths.checkpoints == pathlib.Path("/checkpoints/j/checkpoints")
    assert paths.status_file == pathlib.Path("/checkpoints/j/status.json")


def test_launch_settings_round_trip_through_ray_train_loop_config() -> None:
    cfg = trainer_config.TrainerConfig(
        job_name="j", run_name="j", storage_path="/s", attempt=3, spec=spec(replicas=2, gpusPerWorker=1)
    )
    launch = config.LaunchSettings(config_json=config.dumps(cfg), launch_id="abc", inject_failure_at_step=7)
    again = config.LaunchSettings.from_dict(launch.to_dict())
    assert again == launch
    assert again.config == cfg


def test_inject_failure_step_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(config.INJECT_FAILURE_ENV, raising=False)
    assert config.inject_failure_from_env() is None
    monkeypatch.setenv(config.INJECT_FAILURE_ENV, "40")
    assert config.inject_failure_from_env() == 40
    monkeypatch.setenv(config.INJECT_FAILURE_ENV, "0")
    with pytest.raises(ValueError, match="step number >= 1"):
        config.inject_failure_from_env()


def test_local_plan_on_a_cpu_machine_caps_workers_to_cores_and_says_so() -> None:
    plan = local.plan_local(spec(replicas=4, gpusPerWorker=0), workers=None, cpu_count=2, gpu_count=0)
    assert (plan.num_workers, plan.num_gpus) == (2, 0)
    assert plan.spec.workers.replicas == 2 and plan.spec.workers.cpus_per_worker == 1
    assert plan.logical_cpus >= plan.num_workers + 4
    assert any("4 workers" in note and "using 2" in note for note in plan.notes)


def test_local_plan_moves_a_gpu_job_to_cpu_when_there_is_no_gpu() -> None:
    gpu_spec = spec(replicas=1, gpusPerWorker=2).model_copy(update={"precision": trainingjob.Precision.FP16})
    plan = local.plan_local(gpu_spec, workers=None, cpu_count=8, gpu_count=0)
    assert plan.spec.workers.gpus_per_worker == 0
    assert plan.spec.precision == trainingjob.Precision.BF16
    assert config.scaling_for(plan.spec).num_workers == 2
    assert any("no" in note and "GPU" in note for note in plan.notes)


def test_local_plan_uses_at_most_the_local_gpus_one_worker_each() -> None:
    plan = local.plan_local(spec(replicas=2, gpusPerWorker=8), workers=None, cpu_count=16, gpu_count=4)
    assert (plan.num_workers, plan.num_gpus) == (4, 4)
    assert config.scaling_for(plan.spec) == config.Scaling(4, True, {"CPU": 1.0, "GPU": 1.0})


def test_local_plan_honours_an_explicit_worker_count() -> None:
    plan = local.plan_local(spec(replicas=4, gpusPerWorker=0), workers=1, cpu_count=8, gpu_count=0)
    assert plan.num_workers == 1
