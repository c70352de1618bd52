"""Deleting an owner: the garbage collector of the real controller-manager removes every owned child;
the checkpoint claim stays unless checkpoint.storage.deleteWithJob. No finalizer holds anything up."""

from __future__ import annotations

from typing import Any

import operator_factories as factories
import pytest
from cluster_api import Api, wait_for

pytestmark = pytest.mark.controlplane


def children(api: Api, namespace: str) -> dict[str, Any]:
    return {
        "RayJob": api.get(api.ray_jobs(namespace, "mlp-a1")),
        "ConfigMap": api.get(api.core(namespace, "configmaps", "mlp-trainer")),
        "ServiceAccount": api.get(api.core(namespace, "serviceaccounts", "mlp-trainer")),
        "Role": api.get(api.rbac(namespace, "roles", "mlp-trainer")),
        "RoleBinding": api.get(api.rbac(namespace, "rolebindings", "mlp-trainer")),
    }


def test_deleting_a_job_removes_its_children_but_keeps_the_checkpoint_claim(
    operator: Any, api: Api, apply: Any, namespace: str
) -> None:
    apply(factories.manifest("mlp", namespace))
    wait_for(lambda: children(api, namespace), lambda c: all(c.values()), what="all children")
    job = api.get(api.job(namespace, "mlp"))
    assert job is not None and not job["metadata"].get("finalizers")

    api.delete(api.job(namespace, "mlp"))
    wait_for(lambda: api.get(api.job(namespace, "mlp")), lambda j: j is None, what="job gone")
    wait_for(
        lambda: children(api, namespace), lambda c: not any(c.values()), timeout_s=30, what="children gone"
    )
    claim = api.get(api.core(namespace, "persistentvolumeclaims", "mlp-ckpt"))
    assert claim is not None and not claim["metadata"].get("deletionTimestamp")


def test_a_job_created_again_under_the_same_name_adopts_the_kept_claim(
    operator: Any, api: Api, apply: Any, namespace: str
) -> None:
    apply(factories.manifest("mlp", namespace))
    wait_for(lambda: children(api, namespace), lambda c: all(c.values()), what="all children")
    claim_uid = api.get(api.core(namespace, "persistentvolumeclaims", "mlp-ckpt"))["metadata"]["uid"]  # type: ignore[index]
    api.delete(api.job(namespace, "mlp"))
    wait_for(
        lambda: children(api, namespace), lambda c: not any(c.values()), timeout_s=30, what="children gone"
    )

    apply(factories.manifest("mlp", namespace))
    wait_for(lambda: children(api, namespace), lambda c: all(c.values()), what="children again")
    claim = api.get(api.core(namespace, "persistentvolumeclaims", "mlp-ckpt"))
    assert claim is not None and claim["metadata"]["uid"] == claim_uid  # same volume: the run resumes


def test_delete_with_job_lets_the_garbage_collector_delete_the_claim_too(
    operator: Any, api: Api, apply: Any, namespace: str
) -> None:
    apply(factories.manifest("mlp", namespace, spec={"checkpoint": {"storage": {"deleteWithJob": True}}}))
    wait_for(
        lambda: api.get(api.core(namespace, "persistentvolumeclaims", "mlp-ckpt")),
        lambda c: c is not None,
        what="claim",
    )
    api.delete(api.job(namespace, "mlp"))
    # No pod uses the claim, so the pvc-protection controller lifts its finalizer and the claim goes.
    wait_for(
        lambda: api.get(api.core(namespace, "persistentvolumeclaims", "mlp-ckpt")),
        lambda c: c is None,
        timeout_s=30,
        what="claim deleted by the garbage collector",
    )
