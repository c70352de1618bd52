"""The RBAC rules the operator's own ServiceAccount needs, as data: the one source of the chart's RBAC.

Verbs are the least that the code in this package uses, each for a stated reason; a test runs the whole
operator under a ClusterRole made of exactly these rules (tests/operator/integration). Creating the
trainer's Role requires holding what it grants (Kubernetes' RBAC escalation check), which the
``*/status`` rule below covers.

``chart_template()`` renders charts/trainop/templates/_rbac.tpl from ``GRANTS`` (reasons as comments);
``make crds`` writes it and tests/unit/test_chart_rbac.py fails when the committed file differs by one
byte, so what users install is this list. RBAC cannot say "only the objects I manage"; the chart's
ValidatingAdmissionPolicy (templates/admission-policy.yaml) narrows the writes these rules allow.

This module must not be imported by anything that runs in the operator; it is documentation that tests
and the chart read.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from typing import Any


@dataclasses.dataclass(frozen=True)
class Grant:
    """One RBAC rule and why the operator needs it."""

    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str
    #: About cluster-scoped resources: always bound cluster-wide, also when only some namespaces are watched.
    cluster_scoped: bool = False

    def rule(self) -> dict[str, Any]:
        return {
            "apiGroups": list(self.api_groups),
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }


GRANTS: tuple[Grant, ...] = (
    Grant(
        ("trainop.dev",),
        ("trainingjobs", "tuningsweeps"),
        ("get", "list", "watch", "patch", "delete"),
        "The API objects: kopf watches them; the operator reads one before reconciling it, patches its "
        "trainop.dev/applied-spec annotation, and deletes it once spec.ttlSecondsAfterFinished has passed.",
    ),
    Grant(
        ("trainop.dev",),
        ("trainingjobs/status", "tuningsweeps/status"),
        ("get", "patch"),
        "Status subresource: the operator writes phase, conditions, attempts. It also creates each job's "
        "Role granting get+patch on that one job's status (for the trainer's rank 0); RBAC allows that "
        "without the escalate verb only because the operator holds both verbs itself.",
    ),
    Grant(
        ("trainop.dev",),
        ("trainingjobs/finalizers", "tuningsweeps/finalizers"),
        ("update",),
        "Children carry controller ownerReferences with blockOwnerDeletion=true; clusters running the "
        "OwnerReferencesPermissionEnforcement admission plugin (e.g. OpenShift) require this to set them.",
    ),
    Grant(
        ("ray.io",),
        ("rayjobs",),
        ("list", "watch", "create", "delete"),
        "One RayJob per attempt: created, never patched (a RayJob's spec is fixed), other attempts' deleted; "
        "watched (the children cache), never read one by one.",
    ),
    Grant(
        ("ray.io",),
        ("rayclusters",),
        ("list", "watch"),
        "Read-only, watched: KubeRay's RayCluster of a starting attempt tells why it is not ready (quota, "
        "pod creation failures).",
    ),
    Grant(
        ("",),
        ("persistentvolumeclaims",),
        ("list", "watch", "create", "patch"),
        "The checkpoint claim: created once, never deleted by the operator (owner references do that); "
        "patched only to add the job's owner reference to a claim found under its name when "
        "deleteWithJob asks for one; watched to notice it bound, lost, created or being deleted.",
    ),
    Grant(
        ("",),
        ("pods",),
        ("list", "watch"),
        "Read-only: the job's pods explain image-pull and scheduling problems on its status.",
    ),
    Grant(
        ("",),
        ("configmaps",),
        ("get", "create", "patch"),
        "The trainer's config: server-side applied once per attempt; read on an owner's first reconcile "
        "(not watched: listing every ConfigMap of the cluster is more than the operator may do).",
    ),
    Grant(
        ("",),
        ("serviceaccounts",),
        ("list", "watch", "create", "patch"),
        "The job's ServiceAccount (its trainer's identity): server-side applied, watched.",
    ),
    Grant(
        ("rbac.authorization.k8s.io",),
        ("roles", "rolebindings"),
        ("list", "watch", "create", "patch"),
        "Each job's Role (get+patch on its own status only, create on Events for a profile's outcome) and "
        "its RoleBinding: server-side applied, watched.",
    ),
    Grant(
        ("",),
        ("events",),
        ("create",),
        "Events on jobs, posted by the operator (kopf's own posting is off; core/v1); the trainer's Role "
        "grants the same.",
    ),
    Grant(
        ("apiextensions.k8s.io",),
        ("customresourcedefinitions",),
        ("list", "watch"),
        "kopf: discovers and follows CRDs (ours appearing, KubeRay's being installed later).",
        cluster_scoped=True,
    ),
    Grant(
        ("",),
        ("namespaces",),
        ("list", "watch"),
        "kopf, with --namespace: resolves the names/patterns to namespaces and follows them coming and "
        "going (unused when serving all namespaces; kept so the list does not depend on values).",
        cluster_scoped=True,
    ),
)

OPERATOR_RULES: list[dict[str, Any]] = [grant.rule() for grant in GRANTS]

_TEMPLATE_HEADER = """\
{{/*
Generated from trainop.controller.rbac.GRANTS by `make crds`. Do not edit: tests/unit/test_chart_rbac.py
fails when this file differs from what that list renders, and the security tier checks, on a real
apiserver, what the ServiceAccount bound to the rendered ClusterRoles may and may not do.

THE permissions of the trainop operator: one list, independent of .Values (nothing below may read them;
tests/chart renders it with different values files and compares). charts/trainop/README.md lists the same
rules in a table, and tests/chart checks table and template against each other.

"trainop.rbac.namespacedRules" are granted cluster-wide (ClusterRoleBinding) or, with watchNamespaces,
per watched namespace (one RoleBinding per namespace to the same ClusterRole).
"trainop.rbac.clusterRules" are about cluster-scoped resources and always need a ClusterRoleBinding.
RBAC cannot confine writes to the objects trainop manages: templates/admission-policy.yaml does.
*/}}
"""


def _rules_yaml(grants: list[Grant]) -> str:
    lines: list[str] = []
    for grant in grants:
        lines += textwrap.wrap(grant.why, width=104, initial_indent="# ", subsequent_indent="# ")
        lines += [
            f"- apiGroups: {json.dumps(list(grant.api_groups))}",
            f"  resources: {json.dumps(list(grant.resources))}",
            f"  verbs: {json.dumps(list(grant.verbs))}",
        ]
    return "\n".join(lines)


def chart_template() -> str:
    """The text of charts/trainop/templates/_rbac.tpl."""
    namespaced = [grant for grant in GRANTS if not grant.cluster_scoped]
    cluster = [grant for grant in GRANTS if grant.cluster_scoped]
    return (
        _TEMPLATE_HEADER
        + '\n{{- define "trainop.rbac.namespacedRules" -}}\n'
        + _rules_yaml(namespaced)
        + '\n{{- end }}\n\n{{- define "trainop.rbac.clusterRules" -}}\n'
        + _rules_yaml(cluster)
        + "\n{{- end }}\n"
    )
