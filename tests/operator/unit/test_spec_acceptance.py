"""Which spec runs (``acceptance.evaluate``): re-validation, the applied-spec record, immutable fields."""

from __future__ import annotations

from typing import Any

import operator_factories as factories
import pytest

from trainop.api import trainingjob, tuningsweep
from trainop.controller import acceptance, kinds


def stored(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` after the operator recorded its spec as accepted."""
    verdict = acceptance.evaluate(body)
    assert verdict.applied_spec is not None
    body = {
        **body,
        "metadata": {
            **body["metadata"],
            "annotations": {kinds.ANNOTATION_APPLIED_SPEC: verdict.applied_spec},
        },
    }
    return body


def edited(body: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    return {**body, "spec": factories.merge(body["spec"], spec)}


def test_a_valid_spec_seen_first_is_accepted_and_recorded() -> None:
    verdict = acceptance.evaluate(factories.job())
    assert verdict.resource is not None and verdict.resource.metadata.name == "mlp"
    assert (verdict.errors, verdict.refused) == ((), ())
    assert verdict.applied_spec == acceptance.serialise(verdict.resource.spec.to_wire())


def test_an_unchanged_spec_is_not_recorded_again() -> None:
    assert acceptance.evaluate(stored(factories.job())).applied_spec is None


@pytest.mark.parametrize(
    "change",
    [
        {"hyperparameters": {"learningRate": 0.2}},
        {"image": "registry.example/trainer:2"},
        {"workers": {"cpusPerWorker": 3}},
        {"failurePolicy": {"maxRestarts": 7}},
        {"suspend": True},
    ],
)
def test_mutable_changes_are_accepted_and_recorded(change: dict[str, Any]) -> None:
    body = edited(stored(factories.job()), change)
    verdict = acceptance.evaluate(body)
    assert verdict.refused == ()
    assert verdict.resource is not None and verdict.resource.spec == kinds.parse(body).spec
    assert verdict.applied_spec == acceptance.serialise(kinds.parse(body).spec.to_wire())


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"workload": {"model": "resnet18"}}, "spec.workload.model"),
        ({"workload": {"model": None, "entrypoint": "pkg.mod:train"}}, "spec.workload.model"),
        ({"workers": {"replicas": 8}}, "spec.workers.replicas"),
        ({"workers": {"gpusPerWorker": 1}}, "spec.workers.gpusPerWorker"),
        ({"checkpoint": {"storage": {"size": "2Gi"}}}, "spec.checkpoint.storage"),
        ({"checkpoint": {"storage": {"existingClaim": "other"}}}, "spec.checkpoint.storage"),
    ],
)
def test_changing_an_immutable_field_is_refused_and_the_accepted_spec_keeps_running(
    change: dict[str, Any], path: str
) -> None:
    before = stored(factories.job())
    verdict = acceptance.evaluate(edited(before, change))
    assert path in [c.path for c in verdict.refused]
    assert verdict.applied_spec is None
    assert verdict.resource is not None
    assert verdict.resource.spec == acceptance.evaluate(before).resource.spec  # type: ignore[union-attr]


def test_the_refusal_names_old_and_new_values() -> None:
    verdict = acceptance.evaluate(edited(stored(factories.job()), {"workers": {"replicas": 8}}))
    assert [str(c) for c in verdict.refused] == ["spec.workers.replicas cannot change from 2 to 8"]


def test_the_refusal_ends_when_the_change_is_reverted() -> None:
    before = stored(factories.job())
    reverted = edited(edited(before, {"workers": {"replicas": 8}}), {"workers": {"replicas": 2}})
    assert acceptance.evaluate(reverted).refused == ()


@pytest.mark.parametrize(
    "path",
    [*(("template", *p) for p in trainingjob.IMMUTABLE_FIELDS if p[-1] != "entrypoint")],
)
def test_a_sweeps_template_has_the_same_immutable_fields(path: tuple[str, ...]) -> None:
    assert path in tuningsweep.IMMUTABLE_FIELDS


def test_changing_a_sweeps_search_space_is_refused() -> None:
    before = stored(factories.sweep())
    change = {
        "searchSpace": {"hyperparameters.learningRate": {"type": "uniform", "lower": 0.1, "upper": 0.2}}
    }
    assert [c.path for c in acceptance.evaluate(edited(before, change)).refused] == ["spec.searchSpace"]


def test_an_invalid_spec_never_accepted_leaves_nothing_to_run_and_names_the_field() -> None:
    verdict = acceptance.evaluate(factories.job(spec={"precision": "fp16"}))
    assert verdict.resource is None
    assert [e.path for e in verdict.errors] == ["spec"]
    assert "fp16 needs GPUs" in verdict.errors[0].message


def test_an_invalid_edit_keeps_the_accepted_spec() -> None:
    before = stored(factories.job())
    verdict = acceptance.evaluate(edited(before, {"precision": "fp16"}))
    assert verdict.errors and verdict.keeps_previous_spec
    assert verdict.resource is not None and verdict.resource.spec.precision == trainingjob.Precision.FP32


def test_an_unreadable_record_is_ignored_and_the_current_spec_accepted() -> None:
    body = factories.job(annotations={kinds.ANNOTATION_APPLIED_SPEC: "{not json"})
    verdict = acceptance.evaluate(body)
    assert verdict.resource is not None and verdict.refused == () and verdict.applied_spec is not None
