"""The search space without a Ray runtime: parameters into a trial's spec, what the driver refuses, and the
search algorithms the driver builds (Tune's own generators, driven by hand)."""

from __future__ import annotations

import itertools
from typing import Any

import pydantic
import pytest

from trainop.api import tuningsweep
from trainop_trainer.sweep import driver, space, trial


def sweep_spec(**overrides: Any) -> tuningsweep.TuningSweepSpec:
    body: dict[str, Any] = {
        "template": {
            "workload": {"model": "mlp"},
            "hyperparameters": {"maxSteps": 10, "schedule": {"kind": "cosine"}},
            "checkpoint": {"intervalSteps": 5, "intervalMinutes": None},
            "network": {"ncclEnv": {"NCCL_DEBUG": "WARN"}},
        },
        "searchSpace": {"hyperparameters.learningRate": {"type": "loguniform", "lower": 1e-4, "upper": 1.0}},
        "seed": 3,
        "numTrials": 6,
    }
    body.update(overrides)
    return tuningsweep.TuningSweepSpec.model_validate(body, by_alias=True)


def test_sampled_values_land_on_the_dotted_fields_and_nccl_keys_in_nccl_env() -> None:
    template = sweep_spec().template
    trial = space.spec_for_trial(
        template,
        {
            "hyperparameters.learningRate": 0.02,
            "hyperparameters.schedule.warmupSteps": 3,
            "workload.dataset.numSamples": 512,
            "nccl.NCCL_ALGO": "Tree",
            "nccl.NCCL_BUFFSIZE": 4194304,
        },
    )
    assert trial.hyperparameters.learning_rate == 0.02
    assert trial.hyperparameters.schedule.warmup_steps == 3
    assert trial.workload.dataset.num_samples == 512
    assert trial.network.nccl_env == {"NCCL_DEBUG": "WARN", "NCCL_ALGO": "Tree", "NCCL_BUFFSIZE": "4194304"}
    # Everything else is the template's, explicit nulls included (not replaced by defaults).
    assert trial.checkpoint.interval_minutes is None and trial.checkpoint.interval_steps == 5
    assert trial.hyperparameters.max_steps == 10
    assert template.hyperparameters.learning_rate == 0.1  # the template itself is untouched


def test_a_sampled_value_the_template_refuses_names_the_field_and_the_values() -> None:
    with pytest.raises(space.SearchSpaceError) as caught:
        space.spec_for_trial(sweep_spec().template, {"hyperparameters.momentum": 1.5})
    message = str(caught.value)
    assert "hyperparameters.momentum=1.5" in message
    assert "spec.template.hyperparameters.momentum invalid" in message


@pytest.mark.parametrize("metric", ["accuracy", "Loss", "val_loss"])
def test_an_objective_metric_the_trainer_does_not_report_is_refused_naming_the_field(metric: str) -> None:
    """By the API model, so trainop validate and kubectl apply (its CEL twin) say it, not the sweep's
    driver once its RayJob runs."""
    with pytest.raises(pydantic.ValidationError) as caught:
        sweep_spec(objective={"metric": metric})
    assert [e["msg"].removeprefix("Value error, ") for e in caught.value.errors()] == [
        f"spec.objective.metric {metric!r} is not reported by the built-in trainer: use one of "
        "loss, samples_per_second, step, epoch (and with spec.template.evaluation eval_loss, eval_accuracy, "
        "eval_top5Accuracy, eval_perplexity), or report it from a workload.entrypoint"
    ]


@pytest.mark.parametrize("metric", list(space.TRAINER_METRICS))
def test_every_metric_the_trainer_reports_is_a_valid_objective(metric: str) -> None:
    space.validate(sweep_spec(objective={"metric": metric}))


def test_a_user_entrypoint_may_optimise_its_own_metric() -> None:
    spec = sweep_spec(
        template={"workload": {"entrypoint": "mypkg.train:main"}, "hyperparameters": {"maxSteps": 10}},
        objective={"metric": "accuracy", "mode": "max"},
    )
    space.validate(spec)


def test_randint_with_a_fractional_bound_is_refused_by_the_api_model_before_the_driver_runs() -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        sweep_spec(
            searchSpace={"hyperparameters.batchSizePerWorker": {"type": "randint", "lower": 8, "upper": 16.5}}
        )
    assert [e["msg"].removeprefix("Value error, ") for e in caught.value.errors()] == [
        tuningsweep.RANDINT_NEEDS_WHOLE_BOUNDS
    ]


def generated(spec: tuningsweep.TuningSweepSpec) -> list[dict[str, Any]]:
    """The configs the driver's (non-Optuna) search algorithm generates for ``spec``, in order."""
    from ray.tune.experiment import Experiment

    def trainable(config: dict[str, Any]) -> None:
        return None

    algorithm = driver.search_algorithm(spec)
    experiment = Experiment(
        "space", trainable, config=space.param_space(spec), num_samples=driver.num_samples(spec)
    )
    algorithm.add_configurations([experiment])
    configs = []
    while (trial := algorithm.next_trial()) is not None:
        configs.append(space.parameters_of(trial.config, spec))
        algorithm.on_trial_complete(trial.trial_id)
    return configs


def test_random_search_with_a_seed_generates_the_same_trials_again_and_another_seed_does_not() -> None:
    spec = sweep_spec(
        searchSpace={
            "hyperparameters.learningRate": {"type": "loguniform", "lower": 1e-4, "upper": 1.0},
            "hyperparameters.batchSizePerWorker": {"type": "randint", "lower": 8, "upper": 12},
        }
    )
    first = generated(spec)
    assert len(first) == 6
    assert all(1e-4 <= c["hyperparameters.learningRate"] < 1.0 for c in first)
    assert all(c["hyperparameters.batchSizePerWorker"] in (8, 9, 10, 11) for c in first)  # upper excluded
    assert generated(spec) == first
    assert generated(spec.model_copy(update={"seed": 4})) != first


def test_grid_search_generates_each_point_of_the_grid_once() -> None:
    values = {"hyperparameters.learningRate": [0.1, 0.01, 0.001], "nccl.NCCL_PROTO": ["Simple", "LL128"]}
    spec = sweep_spec(
        algorithm="grid",
        numTrials=6,
        searchSpace={name: {"type": "grid", "values": v} for name, v in values.items()},
    )
    points = [(c["hyperparameters.learningRate"], c["nccl.NCCL_PROTO"]) for c in generated(spec)]
    assert sorted(points) == sorted(itertools.product(*values.values()))


@pytest.mark.parametrize(
    ("cluster", "asked"),
    [
        ({"CPU": 8.0, "memory": 8e9}, {"cpu": 0, "gpu": 0, "memory": trial.TRIAL_DRIVER_MEMORY_BYTES}),
        (
            {"CPU": 8.0, "memory": 8e9, "trainop_trial_driver": 4.0},
            {"cpu": 0, "gpu": 0, "trainop_trial_driver": 1},
        ),
    ],
)
def test_a_trial_driver_asks_ray_for_no_cpu_and_no_gpu(
    cluster: dict[str, float], asked: dict[str, float]
) -> None:
    assert trial.driver_resources(cluster) == asked
