"""Spec edits the operator must refuse (immutable fields) and specs only the models can reject.

Immutable fields are refused by the apiserver itself at apply time (the CRD's transition rules), so the
first test shows that refusal and a running job left untouched. The operator's own check
(controller/acceptance.py) stays for objects stored before those rules existed; no edit through the
apiserver can reach it any more, so it is covered by tests/operator/unit/test_spec_acceptance.py. The only
manifests the apiserver admits and the models refuse are manifest.OPERATOR_ONLY_RULES (sweeps whose grid
does not match numTrials): the InvalidSpec tests use one.

KubeRay's part is played by its stand-in (``kuberay_standin``, the tier's only mock): it writes the RayJob
statuses KubeRay would (Running, Failed) where the tests need an attempt to run or fail.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import operator_factories as factories
import pytest
import yaml
from cluster_api import Api, wait_for
from operator_process import OperatorProcess
from prometheus_client.parser import text_string_to_metric_families

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


def sweep_reconciles(operator: OperatorProcess) -> float:
    """TuningSweep reconciles (success and error) the operator process has run since it started."""
    total = 0.0
    for family in text_string_to_metric_families(operator.metrics()):
        for sample in family.samples:
            if sample.name == "trainop_operator_reconcile_total" and sample.labels["kind"] == "TuningSweep":
                total += sample.value
    return total


@pytest.fixture
def namespaced_operator(dedicated_operator: OperatorProcess, namespace: str) -> Iterator[OperatorProcess]:
    """The operator watching this test's namespace only, so its reconcile counter counts this test's
    objects alone (the shared one also reconciles what earlier tests left in namespaces being deleted)."""
    dedicated_operator.start(namespaces=[namespace])
    yield dedicated_operator
    dedicated_operator.stop()


def test_a_spec_the_crd_admits_but_the_models_reject_fails_with_invalid_spec_naming_the_field(
    namespaced_operator: OperatorProcess, api: Api, apply: Any, namespace: str, control_plane: Any
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
    # Final and quiet: no hot loop of reconciles or Events, even when a watch event (an annotation: no new
    # generation) arrives. Expected: 0 reconciles in the window. The operator has no periodic resync
    # (engine: no polling; kopf re-lists, which reconciles every owner once, only after a 410 Gone, not
    # within seconds of a fresh start) and a Failed sweep without a TTL requeues nothing. Allowed: 1, the
    # reconcile that wrote Failed and its Event, whose count is recorded just after it returns. A requeue
    # loop makes many in 5 s, and so does an error retry loop this soon (backoff 0.5 s, doubling).
    wait_for(  # the counter read is this sweep's, and counts
        lambda: sweep_reconciles(namespaced_operator), lambda n: n >= 1, what="the sweep's reconcile counted"
    )
    events_before = len(api.list(f"/api/v1/namespaces/{namespace}/events"))
    before = sweep_reconciles(namespaced_operator)
    control_plane.kubectl("annotate", "tuningsweep", "lr", "-n", namespace, "touched=yes")
    time.sleep(5)
    after = sweep_reconciles(namespaced_operator)
    assert after - before <= 1, f"{after - before:.0f} reconciles of a Failed sweep in 5 s"
    assert len(api.list(f"/api/v1/namespaces/{namespace}/events")) == events_before


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
