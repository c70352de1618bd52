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

import asyncio
import json
import uuid
from collections.abc import Mapping
from typing import Any

import operator_factories as factories
import pytest

from tests.controlplane import cluster
from tests.security import chart_rbac
from tests.security.as_token import AsToken
from trainop.controller import apply, children, kinds, kube

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


# Adopting a claim: a claim found under the owner's own claim name with no owner gets the owner's reference
# (apply.adopt, deleteWithJob: true) although it is not labelled; nothing else of the claim may change.


class _RefusedError(Exception):
    def __init__(self, code: int, body: dict[str, Any]) -> None:
        super().__init__(code, body)
        self.code, self.body = code, body


class _OperatorApply:
    """The part of ``kube.Kube`` that ``apply.adopt`` uses, sent with the operator's token: the request is
    the operator's own (server-side apply, field manager ``trainop``, forced)."""

    def __init__(self, token: AsToken) -> None:
        self._token = token

    async def apply(self, resource: kube.Resource, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return _ok(_apply(self._token, resource.path(namespace, body["metadata"]["name"]), dict(body)))


def _ok(answer: tuple[int, dict[str, Any]]) -> dict[str, Any]:
    code, body = answer
    if code >= 300:
        raise _RefusedError(code, body)
    return body


def _apply(token: AsToken, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    query = f"?fieldManager={kube.FIELD_MANAGER}&fieldValidation=Strict&force=true"
    return token.request("PATCH", path + query, body, content_type="application/apply-patch+yaml")


def _as_admin(plane: cluster.ControlPlane, method: str, path: str, body: Any) -> dict[str, Any]:
    code, stored = plane.request(method, path, body=json.dumps(body).encode())
    assert code in (200, 201), stored
    return stored


def _owner(
    plane: cluster.ControlPlane, namespace: str, name: str, kind: str = "TrainingJob"
) -> dict[str, Any]:
    """A stored TrainingJob/TuningSweep that keeps its claim (deleteWithJob asks for adoption)."""
    keep = {"checkpoint": {"storage": {"deleteWithJob": True}}}
    body = factories.manifest(
        name, namespace, kind=kind, spec=keep if kind == "TrainingJob" else {"template": keep}
    )
    plural = kinds.BY_KIND[kind].plural
    return _as_admin(plane, "POST", f"/apis/trainop.dev/v1alpha1/namespaces/{namespace}/{plural}", body)


def _user_claim(
    plane: cluster.ControlPlane,
    namespace: str,
    name: str,
    owner_references: list[dict[str, Any]] | None = None,
) -> str:
    """A claim as a user creates it (no trainop label); its path."""
    metadata: dict[str, Any] = {"name": name}
    if owner_references:
        metadata["ownerReferences"] = owner_references
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata,
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    _as_admin(plane, "POST", kube.CLAIMS.path(namespace), claim)
    return kube.CLAIMS.path(namespace, name)


def _reference(owner: Mapping[str, Any], **override: str) -> dict[str, Any]:
    meta = owner["metadata"]
    reference = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
    }
    return {**reference, "controller": True, "blockOwnerDeletion": True, **override}


def _adoption(path: str, reference: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """apply.adopt's body: only the owner reference (and whatever ``extra`` smuggles in)."""
    name = path.rsplit("/", 1)[1]
    namespace = path.split("/namespaces/", 1)[1].split("/", 1)[0]
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "ownerReferences": [reference]}
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata}
    for key, value in extra.items():
        if key in ("labels", "annotations"):
            metadata[key] = value
        else:
            body[key] = value
    return body


@pytest.mark.parametrize("kind", ["TrainingJob", "TuningSweep"])
def test_the_operator_adopts_an_unlabelled_ownerless_claim_under_its_owners_claim_name(
    operator: AsToken, isolated_plane: cluster.ControlPlane, isolated_namespace: str, kind: str
) -> None:
    """docs/operator.md: a claim found under the job's name with no owner is adopted when deleteWithJob is
    true. The claim is the user's (not labelled), so the labelled-children rule alone would refuse it."""
    owner = _owner(isolated_plane, isolated_namespace, "mlp", kind)
    desired = children.desired_pvc(kinds.parse(owner))
    assert desired is not None and desired["metadata"]["name"] == kinds.claim_name(kinds.parse(owner))
    _user_claim(isolated_plane, isolated_namespace, desired["metadata"]["name"])
    try:
        write = asyncio.run(apply.adopt(_OperatorApply(operator), desired))  # type: ignore[arg-type]
    except _RefusedError as refused:
        pytest.fail(f"the operator's adoption was refused: {refused.code} {refused.body.get('message')}")
    assert write.object is not None
    meta = write.object["metadata"]
    assert [(r["kind"], r["name"], r["uid"]) for r in meta["ownerReferences"]] == [
        (kind, "mlp", owner["metadata"]["uid"])
    ]
    assert "labels" not in meta  # adopted by reference, not by label


@pytest.mark.parametrize(
    ("claim", "override"),
    [
        ("data", {}),  # a claim of another name
        ("other-ckpt", {}),  # another job's claim name
        ("mlp-sweep-ckpt", {}),  # a TuningSweep's suffix with a TrainingJob's reference
        ("mlp-ckpt", {"apiVersion": "v1", "kind": "ConfigMap"}),  # an owner that is not trainop's
        ("mlp-ckpt", {"name": "other"}),  # the reference names another job
    ],
    ids=[
        "another-name",
        "another-jobs-claim",
        "sweep-suffix-for-a-job",
        "not-a-trainop-owner",
        "another-owner",
    ],
)
def test_adding_an_owner_reference_to_a_claim_not_under_that_owners_claim_name_is_refused(
    operator: AsToken,
    isolated_plane: cluster.ControlPlane,
    isolated_namespace: str,
    claim: str,
    override: dict[str, str],
) -> None:
    owner = _owner(isolated_plane, isolated_namespace, "mlp")
    path = _user_claim(isolated_plane, isolated_namespace, claim)
    assert operator.can("patch", "persistentvolumeclaims", namespace=isolated_namespace)  # RBAC says yes
    code, refused = _apply(operator, path, _adoption(path, _reference(owner, **override)))
    assert code == 403 and POLICY in refused["message"], refused


@pytest.mark.parametrize(
    "extra",
    [
        {"labels": TRAINOP},  # adopting by the label stays refused
        {"labels": {"team": "a"}},
        {"annotations": {"note": "x"}},
        {"spec": {"volumeName": "someone-elses-volume"}},  # valid on a pending claim: binds it
    ],
    ids=["trainop-label", "label", "annotation", "spec"],
)
def test_an_adoption_that_also_changes_labels_annotations_or_spec_is_refused(
    operator: AsToken, isolated_plane: cluster.ControlPlane, isolated_namespace: str, extra: dict[str, Any]
) -> None:
    owner = _owner(isolated_plane, isolated_namespace, "mlp")
    path = _user_claim(isolated_plane, isolated_namespace, "mlp-ckpt")
    code, refused = _apply(operator, path, _adoption(path, _reference(owner), **extra))
    assert code == 403 and POLICY in refused["message"], refused
    code, unchanged = isolated_plane.request("GET", path)
    assert code == 200 and "ownerReferences" not in unchanged["metadata"], unchanged


def test_re_pointing_a_claim_that_already_has_an_owner_is_refused(
    operator: AsToken, isolated_plane: cluster.ControlPlane, isolated_namespace: str
) -> None:
    """Only ownerless claims are adopted: a claim owned by anything (here the user's ConfigMap) keeps its
    owner, whether the operator adds its reference (apply) or replaces the list (merge patch)."""
    owner = _owner(isolated_plane, isolated_namespace, "mlp")
    keeper = _as_admin(
        isolated_plane, "POST", f"/api/v1/namespaces/{isolated_namespace}/configmaps", _configmap()
    )
    kept_by = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": keeper["metadata"]["name"],
        "uid": keeper["metadata"]["uid"],
    }
    path = _user_claim(isolated_plane, isolated_namespace, "mlp-ckpt", owner_references=[kept_by])
    code, refused = _apply(operator, path, _adoption(path, _reference(owner)))
    assert code == 403 and POLICY in refused["message"], refused
    code, refused = _merge_patch(operator, path, {"metadata": {"ownerReferences": [_reference(owner)]}})
    assert code == 403 and POLICY in refused["message"], refused


def _merge_patch(token: AsToken, path: str, patch: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return token.request("PATCH", path, patch, content_type="application/merge-patch+json")
