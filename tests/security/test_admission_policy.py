"""The chart's ValidatingAdmissionPolicy confines the operator's writes where RBAC cannot: asked of the real
apiserver with the operator's own ServiceAccount token (the chart's rendered RBAC and policy,
``chart_rbac``).

The chart's ClusterRole lets the operator create ConfigMaps, Roles and RoleBindings and patch any
ConfigMap in every namespace it serves, ``kube-system`` included when it serves all; RBAC has no way to
say "only the objects I manage". Each refusal below is one RBAC allows (checked with an access review),
so it is the policy's; the positive controls show the writes the operator does make still pass. That the
operator runs a job's whole life under the policy is test_no_credentials_leak.py (its operator holds the
same identity).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from tests.controlplane import cluster
from tests.security import chart_rbac
from tests.security.as_token import AsToken

pytestmark = pytest.mark.controlplane

TRAINOP = {"app.kubernetes.io/managed-by": "trainop"}
POLICY = "ValidatingAdmissionPolicy"


@pytest.fixture
def operator(isolated_plane: cluster.ControlPlane, isolated_namespace: str) -> AsToken:
    token, _ = chart_rbac.install(isolated_plane, isolated_namespace)
    return token


def _configmap(labels: dict[str, str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": f"cm-{uuid.uuid4().hex[:8]}"}
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {"corefile": "."}}


def test_writing_an_unlabelled_configmap_into_kube_system_is_refused_although_rbac_allows_it(
    operator: AsToken,
) -> None:
    assert operator.can("create", "configmaps", namespace="kube-system")  # RBAC says yes
    code, refused = operator.request("POST", "/api/v1/namespaces/kube-system/configmaps", _configmap())
    assert code == 403 and POLICY in refused["message"], refused
    assert "may only write objects labelled app.kubernetes.io/managed-by=trainop" in refused["message"]


def test_patching_an_existing_configmap_is_refused_even_when_the_patch_adds_the_trainop_label(
    operator: AsToken, isolated_plane: cluster.ControlPlane
) -> None:
    coredns = _configmap()  # stands for kube-system's CoreDNS configuration, written by the admin
    code, body = isolated_plane.request(
        "POST", "/api/v1/namespaces/kube-system/configmaps", body=json.dumps(coredns).encode()
    )
    assert code == 201, body
    path = f"/api/v1/namespaces/kube-system/configmaps/{coredns['metadata']['name']}"
    for patch in ({"data": {"corefile": "hijacked"}}, {"metadata": {"labels": TRAINOP}, "data": {"x": "y"}}):
        code, refused = _merge_patch(operator, path, patch)
        assert code == 403 and POLICY in refused["message"], (patch, refused)


def test_an_unlabelled_role_is_refused_and_the_operators_own_labelled_children_pass(
    operator: AsToken, isolated_namespace: str
) -> None:
    ns = isolated_namespace
    rules = [{"apiGroups": ["trainop.dev"], "resources": ["trainingjobs/status"], "verbs": ["get"]}]
    roles = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles"
    code, refused = operator.request("POST", roles, {"metadata": {"name": "plain"}, "rules": rules})
    assert code == 403 and POLICY in refused["message"], refused
    code, created = operator.request(
        "POST", roles, {"metadata": {"name": "managed", "labels": TRAINOP}, "rules": rules}
    )
    assert code == 201, created
    code, created = operator.request("POST", f"/api/v1/namespaces/{ns}/configmaps", _configmap(TRAINOP))
    assert code == 201, created


@pytest.mark.parametrize(
    ("about", "allowed"),
    [
        ({"apiVersion": "trainop.dev/v1alpha1", "kind": "TrainingJob"}, True),
        ({"apiVersion": "v1", "kind": "Pod"}, False),
    ],
    ids=["about-a-trainingjob", "about-a-pod"],
)
def test_events_are_allowed_only_about_trainop_objects(
    operator: AsToken, isolated_namespace: str, about: dict[str, str], allowed: bool
) -> None:
    event = {
        "metadata": {"name": f"ev-{uuid.uuid4().hex[:8]}"},
        "involvedObject": {**about, "name": "x", "namespace": isolated_namespace},
        "reason": "Test",
        "message": "m",
        "type": "Normal",
    }
    code, body = operator.request("POST", f"/api/v1/namespaces/{isolated_namespace}/events", event)
    assert (code == 201) == allowed, body


def test_with_watch_namespaces_the_policy_names_them_and_refuses_the_others(
    isolated_plane: cluster.ControlPlane, isolated_namespace: str
) -> None:
    """RBAC already confines this mode (RoleBindings only in the watched namespaces); the policy repeats
    it as a rule of its own, which the rendered policy shows, and the account's writes elsewhere fail."""
    documents = chart_rbac.render(
        isolated_plane, release="w", namespace=isolated_namespace, values={"watchNamespaces": ["team-a"]}
    )
    (policy,) = [d for d in documents if d["kind"] == POLICY]
    assert {"expression": 'request.namespace in ["team-a"]'}.items() <= policy["spec"]["validations"][
        -1
    ].items()
    operator, _ = chart_rbac.install(
        isolated_plane, isolated_namespace, values={"watchNamespaces": [isolated_namespace]}
    )
    code, _ = operator.request("POST", "/api/v1/namespaces/kube-system/configmaps", _configmap(TRAINOP))
    assert code == 403
    code, body = operator.request(
        "POST", f"/api/v1/namespaces/{isolated_namespace}/configmaps", _configmap(TRAINOP)
    )
    assert code == 201, body


def _merge_patch(token: AsToken, path: str, patch: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return token.request("PATCH", path, patch, content_type="application/merge-patch+json")
