"""A child the apiserver refuses for quota shows on the owner as a condition a user can act on, with a
Warning Event, and the operator keeps retrying (with backoff) until the quota allows it.

The ResourceQuota's ``status`` is written by the test: the test control plane runs no resourcequota
controller, and the apiserver's quota admission (which is real here) only enforces a quota whose status
has been computed."""

from __future__ import annotations

from typing import Any

import operator_factories as factories
import pytest
from cluster_api import Api, wait_for

pytestmark = pytest.mark.controlplane


def quota(api: Api, namespace: str, claims: int) -> None:
    path = f"/api/v1/namespaces/{namespace}/resourcequotas"
    hard = {"persistentvolumeclaims": str(claims)}
    if api.get(f"{path}/claims") is None:
        api.create(path, {"metadata": {"name": "claims"}, "spec": {"hard": hard}})
    else:
        api.patch(f"{path}/claims", {"spec": {"hard": hard}})
    api.patch(f"{path}/claims/status", {"status": {"hard": hard, "used": {"persistentvolumeclaims": "0"}}})


def test_a_claim_refused_for_quota_is_reported_and_created_once_the_quota_allows_it(
    operator: Any, api: Api, apply: Any, namespace: str
) -> None:
    quota(api, namespace, claims=0)
    apply(factories.manifest("mlp", namespace))

    def storage() -> dict[str, Any]:
        body = api.get(api.job(namespace, "mlp")) or {}
        return {c["type"]: c for c in (body.get("status") or {}).get("conditions", [])}.get(
            "StorageReady", {}
        )

    refused = wait_for(storage, lambda c: c.get("reason") == "QuotaExceeded", what="QuotaExceeded")
    assert refused["status"] == "False" and "exceeded quota" in refused["message"]
    warnings = [
        e for e in api.list(f"/api/v1/namespaces/{namespace}/events") if e["reason"] == "QuotaExceeded"
    ]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning"
    assert api.get(api.ray_jobs(namespace, "mlp-a1")) is None  # nothing past the refused claim

    quota(api, namespace, claims=5)
    wait_for(
        lambda: api.get(api.ray_jobs(namespace, "mlp-a1")),
        lambda r: r is not None,
        timeout_s=60,
        what="RayJob once the claim exists",
    )
    wait_for(storage, lambda c: c.get("reason") == "ClaimPending", what="claim created, Pending")
