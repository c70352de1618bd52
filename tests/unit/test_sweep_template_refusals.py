"""The TuningSweep model refuses, with one sentence naming the field and the fix, templates and search
spaces its trials could never run: a Ray Train function, and parameters the trials cannot vary."""

from __future__ import annotations

import pathlib
from typing import Any

import pydantic
import pytest
import yaml

from trainop.api import tuningsweep

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
    ["workers.replicas", "workers.tolerations.key", "workers.cpusPerWorker", "checkpoint.storage.size"],
)
def test_parameters_the_trials_cannot_vary_are_refused_naming_the_key(path: str) -> None:
    space = {path: {"type": "choice", "values": [1, 2]}}
    assert refusal(body(search_space=space)) == (
        f"spec.searchSpace.{path} cannot vary between trials: every trial runs on the sweep's own worker "
        "pods and claim, sized from spec.template.workers and spec.template.checkpoint.storage; set it in "
        "spec.template instead"
    )
    assert path not in tuningsweep.TEMPLATE_PARAMETER_PATHS


def test_no_parameter_path_reaches_into_a_list() -> None:
    assert not [p for p in tuningsweep.TEMPLATE_PARAMETER_PATHS if p.startswith("workers.")]
    assert "hyperparameters.learningRate" in tuningsweep.TEMPLATE_PARAMETER_PATHS
    rules = [r["rule"] for r in crd_rules()]
    assert (
        '!self.searchSpace.exists(k, k.startsWith("workers.") || k.startsWith("checkpoint.storage."))'
        in rules
    )
