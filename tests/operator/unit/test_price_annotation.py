"""A malformed price is reported, not swallowed: the job's trainop.dev/price-per-gpu-hour annotation as a
Warning Event when an attempt starts (its config falls back to the chart's price), the operator's
TRAINOP_PRICE_PER_GPU_HOUR as a log line."""

from __future__ import annotations

import copy
import datetime
import json
import logging
import pathlib
import re
from typing import Any

import operator_factories as factories
import pytest

from trainop.api import experiment, trainer_config, trainingjob
from trainop.controller import acceptance, observe, state_machine

NOW = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.UTC)

JOB: dict[str, Any] = factories.job()


def _job(price: str | None) -> dict[str, Any]:
    body = copy.deepcopy(JOB)
    if price is not None:
        body["metadata"]["annotations"] = {experiment.PRICE_ANNOTATION: price}
    return body


def _decide(body: dict[str, Any], *ray_jobs: observe.RayJobObservation) -> state_machine.Transition:
    verdict = acceptance.evaluate(body)
    return state_machine.next_status(
        verdict,
        verdict.kind.operator_status.from_stored(body.get("status")),
        state_machine.Observed(
            now=NOW,
            generation=1,
            ray_jobs={r.name: r for r in ray_jobs},
            claim=observe.ClaimObservation(
                "mlp-ckpt", observe.ClaimPhase.BOUND, volume="pv-1", access_modes=("ReadWriteMany",)
            ),
        ),
    )


@pytest.mark.parametrize("raw", ["$2.50", "2,50", "cheap", "-1", "nan", "inf", ""])
def test_a_malformed_price_annotation_is_one_sentence_naming_it_and_the_fix(raw: str) -> None:
    problem = trainer_config.price_annotation_problem({experiment.PRICE_ANNOTATION: raw})
    assert problem is not None
    assert experiment.PRICE_ANNOTATION in problem and repr(raw) in problem
    assert "non-negative number such as 2.50" in problem
    assert problem.count(". ") == 0 and problem.endswith(".")


@pytest.mark.parametrize("annotations", [{}, {experiment.PRICE_ANNOTATION: "2.50"}, {"other": "$"}])
def test_a_price_or_no_annotation_is_no_problem(annotations: dict[str, str]) -> None:
    assert trainer_config.price_annotation_problem(annotations) is None


def test_starting_an_attempt_with_a_malformed_price_posts_a_warning_once_per_attempt() -> None:
    created = _decide(_job("$2.50"))
    assert created.create_ray_job is True
    warnings = [e for e in created.events if e.reason == state_machine.INVALID_PRICE]
    assert len(warnings) == 1 and warnings[0].type == "Warning"
    assert experiment.PRICE_ANNOTATION in warnings[0].message and "'$2.50'" in warnings[0].message
    # The RayJob exists: nothing new to say.
    again = _decide(
        {**_job("$2.50"), "status": created.status.to_wire()},
        observe.ray_job({"metadata": {"name": "mlp-a1"}}),
    )
    assert again.create_ray_job is False
    assert [e for e in again.events if e.reason == state_machine.INVALID_PRICE] == []


def test_a_valid_price_annotation_posts_no_warning() -> None:
    created = _decide(_job("2.50"))
    assert created.create_ray_job is True
    assert [e for e in created.events if e.reason == state_machine.INVALID_PRICE] == []


def _model(price: str | None) -> trainingjob.TrainingJob:
    return trainingjob.TrainingJob.model_validate(_job(price))


def test_a_malformed_environment_price_is_logged_and_no_price_is_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(trainer_config.PRICE_ENV, "$3")
    with caplog.at_level(logging.WARNING, logger="trainop.api.trainer_config"):
        pricing = trainer_config.pricing_for(_model(None))
    assert pricing.price_per_gpu_hour is None
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1
    assert trainer_config.PRICE_ENV in lines[0] and "cost.pricePerGpuHour" in lines[0]


def test_a_malformed_annotation_still_falls_back_to_the_charts_price(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(trainer_config.PRICE_ENV, "3.0")
    assert trainer_config.pricing_for(_model("$2.50")).price_per_gpu_hour == 3.0
    assert trainer_config.pricing_for(_model("2.5")).price_per_gpu_hour == 2.5


SCHEMA = pathlib.Path(__file__).resolve().parents[3] / "charts" / "trainop" / "values.schema.json"


def test_the_charts_schema_refuses_a_price_that_is_not_a_number() -> None:
    price = json.loads(SCHEMA.read_text())["properties"]["cost"]["properties"]["pricePerGpuHour"]
    assert price["minimum"] == 0  # a number (JSON Schema applies minimum to numbers only)
    pattern = re.compile(price["pattern"])  # a string (pattern applies to strings only)
    for ok in ("", "2.50", "3", "0"):
        assert pattern.search(ok), ok
    for bad in ("$2.50", "2,50", "-1", "cheap", "2.5 USD"):
        assert not pattern.search(bad), bad
    # What the schema lets through, the operator reads as a price.
    for ok in ("2.50", "3", "0"):
        assert trainer_config.price_annotation_problem({experiment.PRICE_ANNOTATION: ok}) is None
