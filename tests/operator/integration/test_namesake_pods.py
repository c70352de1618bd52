"""A job deleted and created again under the same name, against the real apiserver: the new incarnation
adopts the kept checkpoint claim, so it must not start while the deleted one's Ray pods may still write
into it, and their failures are not its own. The pods are made by the test (no KubeRay, no kubelet here:
a finalizer holds a deleted pod Terminating, as a worker whose preStop hook is still checkpointing)."""

from __future__ import annotations

import time
from typing import Any

import operator_factories as factories
import pytest
from cluster_api import Api, wait_for

pytestmark = pytest.mark.controlplane


def ray_jobs(api: Api, namespace: str) -> list[str]:
    items = api.list(api.ray_jobs(namespace), "trainop.dev/job=mlp")
    return sorted(r["metadata"]["name"] for r in items if not r["metadata"].get("deletionTimestamp"))


def running_condition(api: Api, namespace: str) -> dict[str, Any]:
    body = api.get(api.job(namespace, "mlp")) or {}
    conditions = {c["type"]: c for c in (body.get("status") or {}).get("conditions") or ()}
    return conditions.get("Running") or {}


def test_a_job_created_again_waits_for_its_deleted_namesakes_ray_pods_to_stop(
    operator: Any, api: Api, apply: Any, namespace: str
) -> None:
    apply(factories.manifest("mlp", namespace))
    wait_for(lambda: ray_jobs(api, namespace), lambda names: names == ["mlp-a1"], what="RayJob a1")
    old = api.get(api.job(namespace, "mlp"))
    assert old is not None
    pod = factories.held_ray_pod("mlp-a1-workers-worker-x", "mlp", 1, owner_uid=old["metadata"]["uid"])
    pod_path = api.core(namespace, "pods", api.create(api.core(namespace, "pods"), pod)["metadata"]["name"])

    api.delete(api.job(namespace, "mlp"))
    wait_for(lambda: ray_jobs(api, namespace), lambda names: names == [], what="the old RayJob gone")
    api.delete(pod_path)  # Terminating: its grace period runs, the finalizer holds it
    apply(factories.manifest("mlp", namespace))

    waiting = wait_for(
        lambda: running_condition(api, namespace),
        lambda c: c.get("reason") == "WaitingForDeletion" and "worker-x" in c.get("message", ""),
        what="the new job waiting for its namesake's pod",
    )
    assert "deleted TrainingJob of the same name" in waiting["message"]
    time.sleep(2)  # a watch event's worth: the RayJob would have been created by now
    assert ray_jobs(api, namespace) == []

    api.patch(pod_path, {"metadata": {"finalizers": None}})
    api.request("DELETE", pod_path, {"gracePeriodSeconds": 0})
    wait_for(lambda: ray_jobs(api, namespace), lambda names: names == ["mlp-a1"], what="the new RayJob a1")
    new = api.get(api.ray_jobs(namespace, "mlp-a1"))
    assert new is not None
    assert new["metadata"]["labels"]["trainop.dev/owner-uid"] != old["metadata"]["uid"]
