"""A child the apiserver refuses (for quota, or by an admission policy with whatever 4xx code) shows on the
owner as a condition a user can act on, with a Warning Event, and the operator keeps retrying (with
backoff) until the refusal is lifted.

The ResourceQuota's ``status`` is written by the test: the test control plane runs no resourcequota
controller, and the apiserver's quota admission (which is real here) only enforces a quota whose status
has been computed. The policy is a real ValidatingAdmissionPolicy with ``reason: RequestEntityTooLarge``
(HTTP 413): before the operator recorded every 4xx but 409 and 429, only 403, 404 and 422 reached the
status, and a claim refused with another code (a webhook that names no code gets 400) left a new job with
no status at all, retried every minute without a word."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import operator_factories as factories
import pytest
from cluster_api import Api, ApiError, wait_for

pytestmark = pytest.mark.controlplane


def quota(api: Api, namespace: str, claims: int) -> None:
    path = f"/api/v1/namespaces/{namespace}/resourcequotas"
    hard = {"persistentvolumeclaims": str(claims)}
    if api.get(f"{path}/claims") is None:
        api.create(path, {"metadata": {"name": "claims"}, "spec": {"hard": hard}})
    else:
        api.patch(f"{path}/claims", {"spec": {"hard": hard}})
    api.patch(f"{path}/claims/status", {"status": {"hard": hard, "used": {"persistentvolumeclaims": "0"}}})


def storage_condition(api: Api, namespace: str) -> dict[str, Any]:
    body = api.get(api.job(namespace, "mlp")) or {}
    return {c["type"]: c for c in (body.get("status") or {}).get("conditions", [])}.get("StorageReady", {})


def refused_and_nothing_past_it(
    api: Api, namespace: str, reason: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The StorageReady condition saying ``reason`` and its one Warning Event; no RayJob yet."""
    refused = wait_for(
        lambda: storage_condition(api, namespace), lambda c: c.get("reason") == reason, what=reason
    )
    assert refused["status"] == "False"
    warnings = [e for e in api.list(f"/api/v1/namespaces/{namespace}/events") if e["reason"] == reason]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning"
    assert api.get(api.ray_jobs(namespace, "mlp-a1")) is None  # nothing past the refused claim
    return refused, warnings[0]


def created_once_allowed(api: Api, namespace: str) -> None:
    wait_for(
        lambda: api.get(api.ray_jobs(namespace, "mlp-a1")),
        lambda r: r is not None,
        timeout_s=90,
        what="RayJob once the claim may be created",
    )
    wait_for(
        lambda: storage_condition(api, namespace),
        lambda c: c.get("reason") == "ClaimPending",
        what="claim created, Pending",
    )


def test_a_claim_refused_for_quota_is_reported_and_created_once_the_quota_allows_it(
    operator: Any, api: Api, apply: Any, namespace: str
) -> None:
    quota(api, namespace, claims=0)
    apply(factories.manifest("mlp", namespace))
    refused, _ = refused_and_nothing_past_it(api, namespace, "QuotaExceeded")
    assert "exceeded quota" in refused["message"]
    quota(api, namespace, claims=5)
    created_once_allowed(api, namespace)


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
    refused, warning = refused_and_nothing_past_it(api, namespace, "CreateFailed")
    assert refused["message"].startswith("Cannot create PersistentVolumeClaim mlp-ckpt: ")
    assert REFUSAL in refused["message"] and REFUSAL in warning["message"]
    status = (api.get(api.job(namespace, "mlp")) or {}).get("status") or {}
    assert status.get("phase") == "Pending" and "rayJob" not in (status.get("children") or {})
    api.delete(f"{BINDINGS}/{claims_refused}")
    created_once_allowed(api, namespace)
