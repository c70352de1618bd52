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
    # Owners: watched (and read fresh before each reconcile); the applied-spec annotation patched;
    # deleted after ttlSecondsAfterFinished.
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
    # One RayJob per attempt: created, never patched; other attempts' deleted; watched (the cache).
    {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["list", "watch", "create", "delete"]},
    # Watched while an attempt starts: KubeRay reports pod creation failures (quota) there.
    {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["list", "watch"]},
    # The checkpoint claim: created, never deleted by the operator (owner references do it); patched only
    # to add the owner reference to a claim found under its name when deleteWithJob asks for one.
    {
        "apiGroups": [""],
        "resources": ["persistentvolumeclaims"],
        "verbs": ["list", "watch", "create", "patch"],
    },
    # Ray pods of a starting attempt: image pull and scheduling problems become conditions.
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    # The trainer's config: server-side applied once per attempt; read (not watched: listing every
    # ConfigMap of the cluster is more than the operator may do) on an owner's first reconcile.
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch"]},
    # The trainer's identity, Role and binding: server-side applied, watched.
    {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["list", "watch", "create", "patch"]},
    {
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["roles", "rolebindings"],
        "verbs": ["list", "watch", "create", "patch"],
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
