"""The operator's RBAC is least privilege, and a job's trainer token can patch only its own CR's status --
asked of the real apiserver with real ServiceAccount tokens.

What the operator may do is listed below by hand (``OPERATOR_MAY``, the table in docs/operator.md) and
compared with what the apiserver actually grants the chart's ServiceAccount bound to the ClusterRoles
``helm template`` renders (``chart_rbac``: what users install, with the chart's admission policy): a
permission added to the code without a reviewed entry here fails. That the chart renders exactly
``rbac.OPERATOR_RULES`` is tests/unit/test_chart_rbac.py; that the operator *needs* no more than these
rules is the operator tier's ``test_the_operator_needs_no_more_than_its_listed_rbac_rules``.

The trainer side: ``test_a_running_rayjob_makes_the_job_running_and_the_trainers_own_token_may_patch_only_
its_status`` (operator tier) shows the trainer's token patching its own status and being refused four other
things; here the token's complete rule set is compared with exactly "get and patch the status of this one
object".
"""

from __future__ import annotations

import json

import operator_factories as factories
import pytest

from tests.controlplane import cluster
from tests.security import chart_rbac
from tests.security.as_token import AsToken, Permission
from trainop.controller import children, kinds

pytestmark = pytest.mark.controlplane

_OWNERS = ("trainingjobs", "tuningsweeps")
OPERATOR_MAY: set[Permission] = {
    *(
        (g, r, v)
        for g, r in [("trainop.dev", o) for o in _OWNERS]
        for v in ("get", "list", "watch", "patch", "delete")
    ),
    *(("trainop.dev", f"{o}/status", v) for o in _OWNERS for v in ("get", "patch")),
    *(("trainop.dev", f"{o}/finalizers", "update") for o in _OWNERS),
    *(("ray.io", "rayjobs", v) for v in ("list", "watch", "create", "delete")),
    *(("ray.io", "rayclusters", v) for v in ("list", "watch")),
    *(("", "persistentvolumeclaims", v) for v in ("list", "watch", "create", "patch")),
    *(("", "pods", v) for v in ("list", "watch")),
    *(("", "configmaps", v) for v in ("get", "create", "patch")),
    *(("", "serviceaccounts", v) for v in ("list", "watch", "create", "patch")),
    *(
        ("rbac.authorization.k8s.io", r, v)
        for r in ("roles", "rolebindings")
        for v in ("list", "watch", "create", "patch")
    ),
    ("", "events", "create"),
    *(("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("list", "watch")),
    *(("", "namespaces", v) for v in ("list", "watch")),
}


@pytest.fixture
def operator_token(isolated_plane: cluster.ControlPlane, isolated_namespace: str) -> AsToken:
    operator, _ = chart_rbac.install(isolated_plane, isolated_namespace)
    return operator


@pytest.fixture
def baseline(isolated_plane: cluster.ControlPlane, isolated_namespace: str) -> AsToken:
    """A ServiceAccount with no bindings: what every authenticated identity may do (discovery, reviews)."""
    return AsToken(isolated_plane, isolated_plane.service_account_token(isolated_namespace, "nobody"))


def test_the_operator_holds_exactly_the_reviewed_permissions_and_no_wildcard(
    operator_token: AsToken, baseline: AsToken, isolated_namespace: str
) -> None:
    granted = operator_token.rules(isolated_namespace) - baseline.rules(isolated_namespace)
    assert all(names == () for _, names in granted)
    held = {permission for permission, _ in granted}
    assert not any("*" in part for permission in held for part in permission), sorted(held)
    assert held == OPERATOR_MAY, {
        "not reviewed": sorted(held - OPERATOR_MAY),
        "missing": sorted(OPERATOR_MAY - held),
    }


@pytest.mark.parametrize(
    ("verb", "resource", "group", "subresource", "cluster_wide"),
    [
        ("get", "secrets", "", None, False),
        ("list", "secrets", "", None, True),
        ("watch", "secrets", "", None, True),
        ("create", "pods", "", None, False),
        ("create", "pods", "", "exec", False),
        ("delete", "pods", "", None, False),
        ("create", "serviceaccounts", "", "token", False),  # minting tokens for the trainers' accounts
        ("list", "configmaps", "", None, True),
        ("delete", "configmaps", "", None, False),
        ("patch", "rayjobs", "ray.io", None, False),  # one RayJob per attempt, never patched
        ("escalate", "roles", "rbac.authorization.k8s.io", None, False),
        ("bind", "roles", "rbac.authorization.k8s.io", None, False),
        ("bind", "clusterroles", "rbac.authorization.k8s.io", None, True),
        ("create", "clusterroles", "rbac.authorization.k8s.io", None, True),
        ("create", "clusterrolebindings", "rbac.authorization.k8s.io", None, True),
        ("impersonate", "serviceaccounts", "", None, True),
        ("impersonate", "users", "", None, True),
        ("list", "nodes", "", None, True),
        ("create", "customresourcedefinitions", "apiextensions.k8s.io", None, True),
    ],
)
def test_the_operator_may_not(
    operator_token: AsToken,
    isolated_namespace: str,
    verb: str,
    resource: str,
    group: str,
    subresource: str | None,
    cluster_wide: bool,
) -> None:
    namespace = None if cluster_wide else isolated_namespace
    assert not operator_token.can(verb, resource, group=group, namespace=namespace, subresource=subresource)


def test_the_operator_can_neither_read_secrets_nor_escalate_through_the_roles_it_writes(
    operator_token: AsToken, isolated_plane: cluster.ControlPlane, isolated_namespace: str
) -> None:
    ns = isolated_namespace
    code, body = isolated_plane.request(
        "POST",
        f"/api/v1/namespaces/{ns}/secrets",
        body=b'{"metadata": {"name": "db"}, "stringData": {"password": "hunter2"}}',
    )
    assert code == 201, body
    assert operator_token.request("GET", f"/api/v1/namespaces/{ns}/secrets/db")[0] == 403
    assert operator_token.request("GET", f"/api/v1/namespaces/{ns}/secrets")[0] == 403

    rbac_path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    greedy_role = {
        "metadata": {"name": "greedy"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
    }
    code, refused = operator_token.request("POST", f"{rbac_path}/roles", greedy_role)
    assert code == 403 and "attempting to grant RBAC permissions not currently held" in refused["message"], (
        refused
    )
    # Binding a role it does not hold is refused too. (Not the aggregated "admin": this test bed runs no
    # clusterrole-aggregation controller, so "admin"/"edit"/"view" are empty there and bindable by anyone.)
    secret_reader = {
        "metadata": {"name": f"secret-reader-{ns}"[:63]},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}],
    }
    code, body = isolated_plane.request(
        "POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", body=json.dumps(secret_reader).encode()
    )
    assert code == 201, body
    for cluster_role in ("cluster-admin", secret_reader["metadata"]["name"]):
        binding = {
            "metadata": {"name": f"grab-{cluster_role}"[:63]},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
            "subjects": [{"kind": "ServiceAccount", "name": "trainop-operator", "namespace": ns}],
        }
        code, refused = operator_token.request("POST", f"{rbac_path}/rolebindings", binding)
        assert (
            code == 403 and "attempting to grant RBAC permissions not currently held" in refused["message"]
        ), (
            cluster_role,
            refused,
        )
    # The one Role it does write -- its trainers' -- it may create (so the refusals above are RBAC's
    # escalation check, not a missing permission).
    job = factories.job("mlp", ns)
    trainer_role = next(m for m in children.desired_rbac(kinds.parse(job)) if m["kind"] == "Role")
    del trainer_role["metadata"]["ownerReferences"]
    assert operator_token.request("POST", f"{rbac_path}/roles", trainer_role)[0] == 201


def test_a_jobs_trainer_token_holds_only_get_and_patch_of_its_own_status_and_event_creation(
    isolated_plane: cluster.ControlPlane, isolated_namespace: str, baseline: AsToken
) -> None:
    ns = isolated_namespace
    job = kinds.parse(factories.job("mlp", ns))
    for manifest in children.desired_rbac(job):  # the operator's builder, applied as the admin
        del manifest["metadata"]["ownerReferences"]
        path = {
            "ServiceAccount": f"/api/v1/namespaces/{ns}/serviceaccounts",
            "Role": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
            "RoleBinding": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
        }[manifest["kind"]]
        code, body = isolated_plane.request("POST", path, body=json.dumps(manifest).encode())
        assert code == 201, body
    trainer = AsToken(isolated_plane, isolated_plane.service_account_token(ns, "mlp-trainer", create=False))
    trainer.wait_until_can("create", "events", namespace=ns)  # the RoleBinding reached the authorizer

    granted = trainer.rules(ns) - baseline.rules(ns)
    assert granted == {
        (("trainop.dev", "trainingjobs/status", "get"), ("mlp",)),
        (("trainop.dev", "trainingjobs/status", "patch"), ("mlp",)),
        (("", "events", "create"), ()),
    }
    assert trainer.can(
        "patch", "trainingjobs", group="trainop.dev", namespace=ns, name="mlp", subresource="status"
    )
    assert not trainer.can(
        "patch", "trainingjobs", group="trainop.dev", namespace=ns, name="other", subresource="status"
    )
    assert not trainer.can("patch", "trainingjobs", group="trainop.dev", namespace=ns, name="mlp")
    assert not trainer.can("delete", "trainingjobs", group="trainop.dev", namespace=ns, name="mlp")
    assert not trainer.can("get", "secrets", namespace=ns)
    assert not trainer.can("create", "pods", namespace=ns)
