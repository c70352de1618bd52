"""The objective's checks without Ray: eval_<metric> is an objective with template.evaluation, and the API
model refuses it without (the CRD's CEL twin says the same, tests/data/invalid)."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from trainop.api import tuningsweep
from trainop_trainer.sweep import space


def sweep_spec(*, evaluation: dict[str, Any] | None, metric: str) -> tuningsweep.TuningSweepSpec:
    template: dict[str, Any] = {"workload": {"model": "mlp"}, "hyperparameters": {"maxSteps": 10}}
    if evaluation is not None:
        template["evaluation"] = evaluation
    body = {
        "template": template,
        "searchSpace": {"hyperparameters.learningRate": {"type": "uniform", "lower": 0.01, "upper": 0.1}},
        "objective": {"metric": metric, "mode": "max"},
    }
    return tuningsweep.TuningSweepSpec.model_validate(body, by_alias=True)


@pytest.mark.parametrize("metric", ["eval_accuracy", "eval_loss", "eval_top5Accuracy", "eval_perplexity"])
def test_an_evaluation_metric_is_an_objective_when_the_template_evaluates(metric: str) -> None:
    space.validate(sweep_spec(evaluation={"everySteps": 5}, metric=metric))


def test_an_evaluation_metric_without_evaluation_says_to_set_it() -> None:
    with pytest.raises(pydantic.ValidationError) as raised:
        sweep_spec(evaluation=None, metric="eval_accuracy")
    assert [e["msg"].removeprefix("Value error, ") for e in raised.value.errors()] == [
        "spec.objective.metric 'eval_accuracy' is reported only when spec.template.evaluation is set: "
        "set it, or use one of loss, samples_per_second, step, epoch"
    ]


def test_an_unknown_metric_is_refused_naming_the_evaluation_metrics_too() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"use one of loss, .*eval_accuracy"):
        sweep_spec(evaluation={"everySteps": 5}, metric="accuracy")
