"""The TuningSweep model refuses, with one sentence naming the field and the fix, templates and search
spaces its trials could never run: a Ray Train function, and parameters the trials cannot vary."""

from __future__ import annotations

import pathlib
from typing import Any

import pydantic
import pytest
import yaml

from trainop.api import trainingjob, tuningsweep

ROOT = pathlib.Path(__file__).resolve().parents[2]


def body(
    template: dict[str, Any] | None = None, search_space: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "template": template or {"workload": {"model": "mlp"}, "hyperparameters": {"maxSteps": 10}},
        "searchSpace": search_space
        or {"hyperparameters.learningRate": {"type": "uniform", "lower": 0.01, "upper": 0.1}},
    }


def refusal(spec: dict[str, Any]) -> str:
    with pytest.raises(pydantic.ValidationError) as raised:
        tuningsweep.TuningSweepSpec.model_validate(spec, by_alias=True)
    errors = raised.value.errors()
    assert len(errors) == 1, errors
    return str(errors[0]["msg"]).removeprefix("Value error, ")


def crd_rules() -> list[dict[str, Any]]:
    crd = yaml.safe_load((ROOT / "crds" / "trainop.dev_tuningsweeps.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return list(spec["x-kubernetes-validations"])


def test_a_template_with_a_ray_train_function_is_refused_with_the_fix() -> None:
    template = {"workload": {"rayTrain": "my_pkg.train:loop"}, "hyperparameters": {"maxSteps": 10}}
    message = refusal(body(template=template))
    assert message == tuningsweep.SWEEP_HAS_NO_RAY_TRAIN_FUNCTION
    assert message.startswith("spec.template.workload.rayTrain is not supported by TuningSweep")
    assert "use a TrainingJob for a Ray Train function" in message
    assert {"rule": "!has(self.template.workload.rayTrain)", "message": message} in crd_rules()


@pytest.mark.parametrize(
    "path",
    [
        "workers.replicas",
        "workers.tolerations.key",
        "workers.cpusPerWorker",
        "checkpoint.storage.size",
        # The pods' data mount and metrics ports (rayjob.pod_template reads the template).
        "data.existingClaim",
        "data.subPath",
        "data.s3.credentialsSecret",
        "reporting.metricsPort",
        # The sweep's restarts (kinds.lifecycle), and its tracking run, whose child runs the trials are.
        "failurePolicy.maxRestarts",
        "failurePolicy.budgets.oomKilled",
        "failurePolicy.backoffSeconds",
        "tracking.mlflow.experiment",
        "tracking.mlflow.trackingUriSecret.name",
    ],
)
def test_parameters_the_trials_cannot_vary_are_refused_naming_the_key(path: str) -> None:
    space = {path: {"type": "choice", "values": [1, 2]}}
    assert refusal(body(search_space=space)) == (
        f"spec.searchSpace.{path} cannot vary between trials: every trial shares the sweep's Ray pods, "
        "claim, restarts and tracking run, made once from spec.template; set it in spec.template instead"
    )
    assert path not in tuningsweep.TEMPLATE_PARAMETER_PATHS


@pytest.mark.parametrize(
    "path",
    [
        "hyperparameters.learningRate",
        "workload.model",
        "data.s3.prefix",
        "failurePolicy.maxWorkerFailures",
        "network.probeMegabytes",
        "evaluation.everySteps",
    ],
)
def test_parameters_a_trial_applies_itself_stay_allowed(path: str) -> None:
    assert path in tuningsweep.TEMPLATE_PARAMETER_PATHS
    assert not tuningsweep.is_fixed_for_trials(path)


@pytest.mark.parametrize("path", ["image", "rayVersion", "suspend", "ttlSecondsAfterFinished"])
def test_top_level_fields_are_no_parameter(path: str) -> None:
    """The pods' image and Ray, the sweep's lifecycle: every trial shares them, and the key pattern refuses
    a key without a dot."""
    assert "String should match pattern" in refusal(
        body(search_space={path: {"type": "choice", "values": [1]}})
    )
    assert path not in tuningsweep.TEMPLATE_PARAMETER_PATHS


def test_every_fixed_field_is_a_field_of_the_template() -> None:
    """A misspelt entry would refuse nothing and leave the real field open."""
    paths = set(tuningsweep._scalar_fields(trainingjob.TrainingJobSpec))
    assert set(tuningsweep.FIXED_TEMPLATE_FIELDS) <= paths
    for prefix in tuningsweep.FIXED_TEMPLATE_SECTIONS:
        assert any(path.startswith(prefix) for path in paths), prefix


def test_no_parameter_path_reaches_into_a_list() -> None:
    assert not [p for p in tuningsweep.TEMPLATE_PARAMETER_PATHS if p.startswith("workers.")]
    assert "hyperparameters.learningRate" in tuningsweep.TEMPLATE_PARAMETER_PATHS
    rules = [r["rule"] for r in crd_rules()]
    fixed = [r for r in rules if r.startswith('!self.searchSpace.exists(k, k.startsWith("workers.")')]
    assert len(fixed) == 1, rules
    for prefix in tuningsweep.FIXED_TEMPLATE_SECTIONS:
        assert f'k.startsWith("{prefix}")' in fixed[0]
    for field in tuningsweep.FIXED_TEMPLATE_FIELDS:
        assert f'"{field}"' in fixed[0]


# ------------------------------------------------------- values a searchSpace entry draws fit their field
@pytest.mark.parametrize(
    ("path", "distribution", "said"),
    [
        (
            "hyperparameters.maxSteps",
            {"type": "choice", "values": [100, "200"]},
            "hyperparameters.maxSteps (choice) can draw '200', which spec.template.hyperparameters.maxSteps "
            "refuses (must be a valid integer): draw only values the field takes",
        ),
        (
            "hyperparameters.optimizer",
            {"type": "grid", "values": ["adam", "lamb"]},
            "hyperparameters.optimizer (grid) can draw 'lamb', which spec.template.hyperparameters.optimizer "
            "refuses (must be 'sgd', 'adamw' or 'adam'): draw only values the field takes",
        ),
        (
            "hyperparameters.maxSteps",
            {"type": "randint", "lower": 0, "upper": 10},
            "hyperparameters.maxSteps (randint) can draw 0, which spec.template.hyperparameters.maxSteps "
            "refuses (must be greater than or equal to 1): draw only values the field takes",
        ),
        (
            "hyperparameters.gradientAccumulationSteps",
            {"type": "uniform", "lower": 1, "upper": 8},
            "hyperparameters.gradientAccumulationSteps (uniform) can draw 1.0, but "
            "spec.template.hyperparameters.gradientAccumulationSteps takes integers: use randint or choice",
        ),
        (
            "network.probe",
            {"type": "randint", "lower": 0, "upper": 2},
            "network.probe (randint) can draw 0, which spec.template.network.probe refuses "
            "(must be a valid boolean): draw only values the field takes",
        ),
    ],
    ids=[
        "choice-string-for-integer",
        "grid-unknown-enum",
        "randint-below-minimum",
        "uniform-on-integer",
        "randint-on-boolean",
    ],
)
def test_a_value_the_trials_template_would_refuse_is_refused_by_the_sweep(
    path: str, distribution: dict[str, Any], said: str
) -> None:
    """Caught by `trainop validate` and the operator's acceptance, not by the trial that draws it."""
    assert refusal(body(search_space={path: distribution})) == said


def test_a_uniform_reaching_past_the_fields_maximum_is_refused() -> None:
    message = refusal(
        body(
            search_space={"hyperparameters.learningRate": {"type": "loguniform", "lower": 1e-4, "upper": 11}}
        )
    )
    assert (
        "which spec.template.hyperparameters.learningRate refuses (must be less than or equal to 10)"
        in message
    )


@pytest.mark.parametrize(
    ("path", "distribution"),
    [
        ("hyperparameters.learningRate", {"type": "choice", "values": [0.1, 1]}),  # an integer is a number
        ("hyperparameters.momentum", {"type": "uniform", "lower": 0.5, "upper": 1.0}),  # 1.0 is never drawn
        ("hyperparameters.batchSizePerWorker", {"type": "choice", "values": [16, "auto"]}),
        ("hyperparameters.maxSteps", {"type": "randint", "lower": 1, "upper": 100}),
        ("nccl.NCCL_ALGO", {"type": "choice", "values": ["Ring", 3]}),  # written as strings
    ],
)
def test_values_the_field_takes_are_admitted(path: str, distribution: dict[str, Any]) -> None:
    tuningsweep.TuningSweepSpec.model_validate(body(search_space={path: distribution}), by_alias=True)


def test_randint_with_a_fractional_bound_is_refused_with_its_crd_twin() -> None:
    assert (
        refusal(
            body(search_space={"hyperparameters.maxSteps": {"type": "randint", "lower": 1, "upper": 9.5}})
        )
        == tuningsweep.RANDINT_NEEDS_WHOLE_BOUNDS
    )
    crd = yaml.safe_load((ROOT / "crds" / "trainop.dev_tuningsweeps.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = spec["properties"]["searchSpace"]["additionalProperties"]["x-kubernetes-validations"]
    assert tuningsweep.RANDINT_NEEDS_WHOLE_BOUNDS in [r["message"] for r in rules]
