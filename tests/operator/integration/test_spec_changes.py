"""Spec edits the operator must refuse (immutable fields) and specs only the models can reject."""

from __future__ import annotations

import json
import time
from typing import Any

import operator_factories as factories
import pytest
from cluster_api import Api, wait_for

pytestmark = pytest.mark.controlplane


def body_of(api: Api, namespace: str) -> dict[str, Any]:
    body = api.get(api.job(namespace, "mlp"))
    assert body is not None
    return body


def condition(body: dict[str, Any], type_: str) -> dict[str, Any]:
    return {c["type"]: c for c in (body.get("status") or {}).get("conditions", [])}.get(type_, {})


def worker_replicas(api: Api, namespace: str, name: str) -> int:
    ray_job = api.get(api.ray_jobs(namespace, name))
    assert ray_job is not None
    return int(ray_job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"])


def test_changing_an_immutable_field_is_refused_and_the_next_attempt_still_runs_the_old_spec(
    operator: Any, api: Api, apply: Any, kuberay: Any, namespace: str, control_plane: Any
) -> None:
    apply(factories.manifest("mlp", namespace))
    wait_for(lambda: api.get(api.ray_jobs(namespace, "mlp-a1")), lambda r: r is not None, what="RayJob a1")
    kuberay.run(namespace, "mlp-a1")

    apply(
        factories.manifest(
            "mlp", namespace, spec={"workers": {"replicas": 4}, "hyperparameters": {"learningRate": 0.2}}
        )
    )
    refused = wait_for(
        lambda: body_of(api, namespace),
        lambda b: condition(b, "SpecApplied").get("reason") == "ImmutableFieldChanged",
        what="refusal",
    )
    message = condition(refused, "SpecApplied")["message"]
    assert "spec.workers.replicas cannot change from 2 to 4" in message
    assert refused["status"]["phase"] == "Running"
    assert refused["status"]["observedGeneration"] == refused["metadata"]["generation"] == 2
    assert refused["status"]["workers"] == 2
    describe = control_plane.kubectl("describe", "trainingjob", "mlp", "-n", namespace).stdout
    assert "ImmutableFieldChanged" in describe  # the Warning Event

    kuberay.fail(namespace, "mlp-a1")
    wait_for(lambda: api.get(api.ray_jobs(namespace, "mlp-a2")), lambda r: r is not None, what="RayJob a2")
    assert worker_replicas(api, namespace, "mlp-a2") == 2
    config = api.get(api.core(namespace, "configmaps", "mlp-trainer"))
    assert config is not None
    trainer = json.loads(config["data"]["trainer.json"])
    assert trainer["spec"]["workers"]["replicas"] == 2
    assert trainer["spec"]["hyperparameters"]["learningRate"] == 0.05  # the whole edit was refused

    apply(factories.manifest("mlp", namespace))  # revert
    wait_for(
        lambda: body_of(api, namespace),
        lambda b: condition(b, "SpecApplied").get("status") == "True",
        what="refusal lifted",
    )


def test_a_mutable_change_reaches_the_trainer_with_the_next_attempt(
    operator: Any, api: Api, apply: Any, kuberay: Any, namespace: str
) -> None:
    apply(factories.manifest("mlp", namespace))
    wait_for(lambda: api.get(api.ray_jobs(namespace, "mlp-a1")), lambda r: r is not None, what="RayJob a1")
    kuberay.run(namespace, "mlp-a1")
    apply(factories.manifest("mlp", namespace, spec={"hyperparameters": {"learningRate": 0.2}}))
    wait_for(
        lambda: body_of(api, namespace), lambda b: b["status"].get("observedGeneration") == 2, what="gen 2"
    )
    config = api.get(api.core(namespace, "configmaps", "mlp-trainer"))
    assert config is not None
    assert json.loads(config["data"]["trainer.json"])["spec"]["hyperparameters"]["learningRate"] == 0.05

    kuberay.fail(namespace, "mlp-a1")
    config = wait_for(
        lambda: api.get(api.core(namespace, "configmaps", "mlp-trainer")),
        lambda c: c is not None and json.loads(c["data"]["trainer.json"])["attempt"] == 2,
        what="config of attempt 2",
    )
    assert json.loads(config["data"]["trainer.json"])["spec"]["hyperparameters"]["learningRate"] == 0.2


def test_a_spec_the_crd_admits_but_the_models_reject_fails_with_invalid_spec_naming_the_field(
    operator: Any, api: Api, apply: Any, namespace: str, control_plane: Any
) -> None:
    apply(factories.manifest("mlp", namespace, spec={"precision": "fp16"}))  # fp16 on CPU workers
    failed = wait_for(
        lambda: body_of(api, namespace),
        lambda b: (b.get("status") or {}).get("phase") == "Failed",
        what="Failed",
    )
    valid = condition(failed, "SpecValid")
    assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec")
    assert "fp16 needs GPUs" in valid["message"]
    assert condition(failed, "Failed")["reason"] == "InvalidSpec"
    assert api.list(api.ray_jobs(namespace)) == []
    assert api.get(api.core(namespace, "configmaps", "mlp-trainer")) is None
    events = [e for e in api.list(f"/api/v1/namespaces/{namespace}/events") if e["reason"] == "InvalidSpec"]
    assert len(events) == 1 and events[0]["type"] == "Warning"
    # Final and quiet: no hot loop of reconciles or Events.
    generation_events = len(api.list(f"/api/v1/namespaces/{namespace}/events"))
    control_plane.kubectl("annotate", "trainingjob", "mlp", "-n", namespace, "touched=yes")
    time.sleep(1)
    assert len(api.list(f"/api/v1/namespaces/{namespace}/events")) == generation_events


def test_fixing_an_invalid_spec_starts_the_job(operator: Any, api: Api, apply: Any, namespace: str) -> None:
    apply(factories.manifest("mlp", namespace, spec={"precision": "fp16"}))
    wait_for(
        lambda: body_of(api, namespace),
        lambda b: (b.get("status") or {}).get("phase") == "Failed",
        what="Failed",
    )
    apply(factories.manifest("mlp", namespace, spec={"precision": "fp32"}))
    wait_for(lambda: api.get(api.ray_jobs(namespace, "mlp-a1")), lambda r: r is not None, what="RayJob a1")
    fixed = body_of(api, namespace)
    assert condition(fixed, "SpecValid")["status"] == "True"
    assert condition(fixed, "Failed")["status"] == "False"
