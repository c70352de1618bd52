"""Spec edits the operator must refuse (immutable fields) and specs only the models can reject.

Immutable fields are refused by the apiserver itself at apply time (the CRD's transition rules), so the
first test shows that refusal and a running job left untouched. The operator's own check
(controller/acceptance.py) stays for objects stored before those rules existed; no edit through the
apiserver can reach it any more, so it is covered by tests/operator/unit/test_spec_acceptance.py. The only
manifests the apiserver admits and the models refuse are manifest.OPERATOR_ONLY_RULES (sweeps whose grid
does not match numTrials): the InvalidSpec tests use one.
"""

from __future__ import annotations

import json
import time
from typing import Any

import operator_factories as factories
import pytest
import yaml
from cluster_api import Api, wait_for

pytestmark = pytest.mark.controlplane


def body_of(api: Api, namespace: str) -> dict[str, Any]:
    body = api.get(api.job(namespace, "mlp"))
    assert body is not None
    return body


def sweep_of(api: Api, namespace: str) -> dict[str, Any]:
    body = api.get(api.job(namespace, "lr", plural="tuningsweeps"))
    assert body is not None
    return body


def condition(body: dict[str, Any], type_: str) -> dict[str, Any]:
    return {c["type"]: c for c in (body.get("status") or {}).get("conditions", [])}.get(type_, {})


def worker_replicas(api: Api, namespace: str, name: str) -> int:
    ray_job = api.get(api.ray_jobs(namespace, name))
    assert ray_job is not None
    return int(ray_job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"])


def test_changing_an_immutable_field_is_refused_at_apply_time_and_the_running_job_is_untouched(
    operator: Any, api: Api, apply: Any, kuberay: Any, namespace: str, control_plane: Any
) -> None:
    apply(factories.manifest("mlp", namespace))
    wait_for(lambda: api.get(api.ray_jobs(namespace, "mlp-a1")), lambda r: r is not None, what="RayJob a1")
    kuberay.run(namespace, "mlp-a1")
    running = wait_for(
        lambda: body_of(api, namespace), lambda b: (b.get("status") or {}).get("phase") == "Running"
    )

    edit = factories.manifest(
        "mlp", namespace, spec={"workers": {"replicas": 4}, "hyperparameters": {"learningRate": 0.2}}
    )
    refused = control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(edit), check=False)
    assert refused.returncode != 0
    assert "spec.workers.replicas cannot change from 2 to 4" in refused.stderr, refused.stderr
    after = body_of(api, namespace)
    assert after["metadata"]["generation"] == running["metadata"]["generation"] == 1  # the whole edit refused
    assert after["spec"]["hyperparameters"]["learningRate"] == 0.05
    assert after["status"]["phase"] == "Running" and after["status"]["workers"] == 2

    kuberay.fail(namespace, "mlp-a1")
    wait_for(lambda: api.get(api.ray_jobs(namespace, "mlp-a2")), lambda r: r is not None, what="RayJob a2")
    assert worker_replicas(api, namespace, "mlp-a2") == 2


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
    apply(factories.manifest("lr", namespace, kind="TuningSweep", spec=factories.GRID_SIZE_MISMATCH))
    failed = wait_for(
        lambda: sweep_of(api, namespace),
        lambda b: (b.get("status") or {}).get("phase") == "Failed",
        what="Failed",
    )
    valid = condition(failed, "SpecValid")
    assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec")
    assert "spec: numTrials must be 2 with algorithm grid" in valid["message"]
    assert condition(failed, "Failed")["reason"] == "InvalidSpec"
    assert api.list(api.ray_jobs(namespace)) == []
    assert api.get(api.core(namespace, "configmaps", "lr-sweep")) is None
    events = [e for e in api.list(f"/api/v1/namespaces/{namespace}/events") if e["reason"] == "InvalidSpec"]
    assert len(events) == 1 and events[0]["type"] == "Warning"
    # Final and quiet: no hot loop of reconciles or Events.
    generation_events = len(api.list(f"/api/v1/namespaces/{namespace}/events"))
    control_plane.kubectl("annotate", "tuningsweep", "lr", "-n", namespace, "touched=yes")
    time.sleep(1)
    assert len(api.list(f"/api/v1/namespaces/{namespace}/events")) == generation_events


def test_fixing_an_invalid_spec_starts_the_job(operator: Any, api: Api, apply: Any, namespace: str) -> None:
    apply(factories.manifest("lr", namespace, kind="TuningSweep", spec=factories.GRID_SIZE_MISMATCH))
    wait_for(
        lambda: sweep_of(api, namespace),
        lambda b: (b.get("status") or {}).get("phase") == "Failed",
        what="Failed",
    )
    apply(factories.manifest("lr", namespace, kind="TuningSweep", spec=factories.GRID_SIZE_FIXED))
    wait_for(lambda: api.get(api.ray_jobs(namespace, "lr-s1")), lambda r: r is not None, what="RayJob s1")
    fixed = sweep_of(api, namespace)
    assert condition(fixed, "SpecValid")["status"] == "True"
    assert condition(fixed, "Failed")["status"] == "False"
