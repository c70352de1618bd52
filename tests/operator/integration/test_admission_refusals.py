"""A child an admission policy refuses shows on the owner as a condition a user can act on, whatever 4xx
code the refusal carries, and the operator retries until the policy allows it.

The refusal is a real ValidatingAdmissionPolicy of the real apiserver, with ``reason:
RequestEntityTooLarge`` (HTTP 413): before the operator recorded every 4xx but 409 and 429, only 403, 404
and 422 reached the status, and a claim refused with another code (a webhook that names no code gets 400)
left a new job with no status at all, retried every minute without a word.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import operator_factories as factories
import pytest
from cluster_api import Api, ApiError, wait_for

pytestmark = pytest.mark.controlplane

POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
REFUSAL = "claims in this namespace need the storage team's approval: ask in #storage"


@pytest.fixture
def claims_refused(api: Api, namespace: str) -> Iterator[str]:
    """A policy refusing every PersistentVolumeClaim created in ``namespace`` (413), removed after."""
    name = f"no-claims-{uuid.uuid4().hex[:8]}"
    api.create(
        POLICIES,
        {
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["persistentvolumeclaims"],
                        }
                    ]
                },
                "validations": [
                    {"expression": "false", "message": REFUSAL, "reason": "RequestEntityTooLarge"}
                ],
            },
        },
    )
    api.create(
        BINDINGS,
        {
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        },
    )

    def refused() -> int | None:
        try:
            api.request(
                "POST",
                api.core(namespace, "persistentvolumeclaims") + "?dryRun=All",
                {
                    "metadata": {"name": "probe"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
                },
            )
        except ApiError as error:
            return error.code
        return None

    wait_for(refused, lambda code: code == 413, what="the policy in force (413 on a dry-run claim)")
    try:
        yield name
    finally:
        for path in (f"{BINDINGS}/{name}", f"{POLICIES}/{name}"):
            if api.get(path) is not None:
                api.delete(path)


def test_a_claim_refused_by_an_admission_policy_with_413_is_reported_and_created_once_allowed(
    operator: Any, api: Api, apply: Any, namespace: str, claims_refused: str
) -> None:
    apply(factories.manifest("mlp", namespace))

    def job() -> dict[str, Any]:
        return api.get(api.job(namespace, "mlp")) or {}

    def storage() -> dict[str, Any]:
        return {c["type"]: c for c in (job().get("status") or {}).get("conditions", [])}.get(
            "StorageReady", {}
        )

    refused = wait_for(storage, lambda c: c.get("reason") == "CreateFailed", what="StorageReady CreateFailed")
    assert refused["status"] == "False"
    assert refused["message"].startswith("Cannot create PersistentVolumeClaim mlp-ckpt: ")
    assert REFUSAL in refused["message"]
    assert (job().get("status") or {}).get("phase") == "Pending"
    warnings = [
        e for e in api.list(f"/api/v1/namespaces/{namespace}/events") if e["reason"] == "CreateFailed"
    ]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning" and REFUSAL in warnings[0]["message"]
    assert api.get(api.ray_jobs(namespace, "mlp-a1")) is None  # nothing past the refused claim
    assert "rayJob" not in ((job().get("status") or {}).get("children") or {})

    api.delete(f"{BINDINGS}/{claims_refused}")
    wait_for(
        lambda: api.get(api.ray_jobs(namespace, "mlp-a1")),
        lambda r: r is not None,
        timeout_s=90,
        what="RayJob once the claim is allowed",
    )
    wait_for(storage, lambda c: c.get("reason") == "ClaimPending", what="claim created, Pending")
