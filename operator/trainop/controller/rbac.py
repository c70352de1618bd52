"""The RBAC rules the operator's own ServiceAccount needs, as data (the Helm chart renders this list).

Verbs are the least that the code in this package uses, each for a stated reason; a test runs the whole
operator under a ClusterRole made of exactly these rules (tests/operator/integration). Creating the
trainer's Role requires holding what it grants (Kubernetes' RBAC escalation check), which the
``*/status`` rule below covers.

This module must not be imported by anything that runs in the operator; it is documentation that tests
and the chart read.
"""

from __future__ import annotations

from typing import Any

OPERATOR_RULES: list[dict[str, Any]] = [
    # Owners: watched; the applied-spec annotation patched; deleted after ttlSecondsAfterFinished.
    {
        "apiGroups": ["trainop.dev"],
        "resources": ["trainingjobs", "tuningsweeps"],
        "verbs": ["get", "list", "watch", "patch", "delete"],
    },
    # The operator-owned status fields (and what the trainer's Role grants, which needs them held).
    {
        "apiGroups": ["trainop.dev"],
        "resources": ["trainingjobs/status", "tuningsweeps/status"],
        "verbs": ["get", "patch"],
    },
    # Owner references with blockOwnerDeletion (OwnerReferencesPermissionEnforcement admission).
    {
        "apiGroups": ["trainop.dev"],
        "resources": ["trainingjobs/finalizers", "tuningsweeps/finalizers"],
        "verbs": ["update"],
    },
    # One RayJob per attempt: created, never patched; other attempts' deleted; status watched.
    {
        "apiGroups": ["ray.io"],
        "resources": ["rayjobs"],
        "verbs": ["get", "list", "watch", "create", "delete"],
    },
    # Read while an attempt starts: KubeRay reports pod creation failures (quota) there.
    {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["get", "list", "watch"]},
    # The checkpoint claim: created, never patched or deleted by the operator (owner references do it).
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "list", "watch", "create"]},
    # Ray pods of a starting attempt: image pull and scheduling problems become conditions.
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    # The trainer's config and identity.
    {"apiGroups": [""], "resources": ["configmaps", "serviceaccounts"], "verbs": ["get", "create", "patch"]},
    {
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["roles", "rolebindings"],
        "verbs": ["get", "create", "patch"],
    },
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    # kopf: discovering resources (and noticing KubeRay's CRDs installed later), namespace patterns.
    {
        "apiGroups": ["apiextensions.k8s.io"],
        "resources": ["customresourcedefinitions"],
        "verbs": ["list", "watch"],
    },
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
]
