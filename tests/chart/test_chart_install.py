"""`helm install` into the real control plane (tests/controlplane): every object the chart renders is
accepted by a real kube-apiserver, and the operator's ServiceAccount can do what the operator needs and
nothing it must not (no Secrets, no privilege escalation), checked by the apiserver's own RBAC authorizer.

The ServiceMonitor, PodMonitor and PrometheusRule are validated against the Prometheus Operator's real
CRD schemas, taken from its Go module (pinned below) through the Go module proxy.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from tests.controlplane import assets, cluster

from .conftest import CHART_DIR, FULL_VALUES, require_tool

pytestmark = pytest.mark.controlplane

PROMETHEUS_OPERATOR_MODULE = "github.com/prometheus-operator/prometheus-operator"
PROMETHEUS_OPERATOR_VERSION = "v0.85.0"
MONITORING_CRDS = ("servicemonitors", "podmonitors", "prometheusrules")
TRAINOP_LABELS = {"app.kubernetes.io/managed-by": "trainop"}  # every child the operator writes carries it


# ------------------------------------------------------------------------------------------ helpers
@pytest.fixture(scope="session")
def monitoring_crds(
    control_plane: cluster.ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> list[str]:
    """Install the Prometheus Operator CRDs the chart's monitoring objects need (once per session)."""
    go = assets.find_go()
    if go is None:
        require_tool("Go toolchain", "needed to fetch the Prometheus Operator CRDs from the Go module proxy")
    download = subprocess.run(
        [str(go), "mod", "download", "-json", f"{PROMETHEUS_OPERATOR_MODULE}@{PROMETHEUS_OPERATOR_VERSION}"],
        cwd=tmp_path_factory.mktemp("go-download"),
        env={**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if download.returncode != 0:
        require_tool("Prometheus Operator CRDs", download.stderr.strip() or download.stdout.strip())
    module_dir = Path(json.loads(download.stdout)["Dir"])
    paths = [
        module_dir / "example" / "prometheus-operator-crd" / f"monitoring.coreos.com_{name}.yaml"
        for name in MONITORING_CRDS
    ]
    return control_plane.install_crds(paths)


def _release() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


@pytest.fixture
def release(control_plane: cluster.ControlPlane) -> Iterator[dict[str, str]]:
    """A unique release name; the release (if installed) is uninstalled afterwards."""
    state = {"name": _release(), "namespace": ""}
    yield state
    if state["namespace"]:
        control_plane.helm("uninstall", state["name"], "--namespace", state["namespace"], check=False)


def _install(
    plane: cluster.ControlPlane, state: dict[str, str], namespace: str, *args: str
) -> subprocess.CompletedProcess[str]:
    state["namespace"] = namespace
    result = plane.helm(
        "install", state["name"], str(CHART_DIR), "--namespace", namespace, *args, check=False
    )
    assert result.returncode == 0, f"helm install failed:\n{result.stderr}"
    return result


def _manifest(plane: cluster.ControlPlane, state: dict[str, str]) -> list[dict[str, Any]]:
    text = plane.helm("get", "manifest", state["name"], "--namespace", state["namespace"]).stdout
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _exists(plane: cluster.ControlPlane, obj: dict[str, Any]) -> bool:
    args = [
        "get",
        f"{obj['kind']}.{obj['apiVersion'].split('/')[0]}" if "/" in obj["apiVersion"] else obj["kind"],
        obj["metadata"]["name"],
        "-o",
        "name",
    ]
    if obj["metadata"].get("namespace"):
        args += ["--namespace", obj["metadata"]["namespace"]]
    return plane.kubectl(*args, check=False).returncode == 0


def _can(
    plane: cluster.ControlPlane,
    service_account: str,
    namespace: str | None,
    verb: str,
    group: str,
    resource: str,
) -> bool:
    """The apiserver's verdict (SubjectAccessReview) on the ServiceAccount doing verb on group/resource."""
    sa_namespace, sa_name = service_account.split("/")
    resource, _, subresource = resource.partition("/")
    review = kubernetes.client.V1SubjectAccessReview(
        spec=kubernetes.client.V1SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{sa_namespace}:{sa_name}",
            groups=[
                "system:serviceaccounts",
                f"system:serviceaccounts:{sa_namespace}",
                "system:authenticated",
            ],
            resource_attributes=kubernetes.client.V1ResourceAttributes(
                namespace=namespace,
                verb=verb,
                group=group,
                resource=resource,
                subresource=subresource or None,
            ),
        )
    )
    api = kubernetes.client.AuthorizationV1Api(plane.api_client())
    return bool(api.create_subject_access_review(review).status.allowed)


def _grants(docs: list[dict[str, Any]], suffix: str) -> list[tuple[str, str, str]]:
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith(suffix)]
    return [
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    ]


# -------------------------------------------------------------------------------------------- install
def test_default_install_is_accepted_and_creates_every_object(
    control_plane: cluster.ControlPlane, namespace: str, release: dict[str, str]
) -> None:
    result = _install(control_plane, release, namespace)
    assert "KubeRay CRDs" not in result.stdout  # the control plane has ray.io/v1 installed
    docs = _manifest(control_plane, release)
    assert {d["kind"] for d in docs} == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "Service",
        "Deployment",
    }
    for obj in docs:
        assert _exists(control_plane, obj), f"{obj['kind']}/{obj['metadata']['name']} missing after install"
    status = json.loads(control_plane.helm("status", release["name"], "-n", namespace, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"


def test_full_values_install_is_accepted_including_monitoring_and_network_policies(
    control_plane: cluster.ControlPlane, namespace: str, release: dict[str, str], monitoring_crds: list[str]
) -> None:
    assert len(monitoring_crds) == 3
    suffix = release["name"]
    watched = [control_plane.create_namespace(prefix=f"team-{i}-") for i in range(3)]
    monitoring = control_plane.create_namespace(prefix="monitoring-")
    try:
        _install(
            control_plane,
            release,
            namespace,
            "--values",
            str(FULL_VALUES),
            "--set",
            f"fullnameOverride=full-{suffix}",
            "--set",
            f"watchNamespaces={{{watched[0]},{watched[1]}}}",
            "--set",
            f"networkPolicy.namespaces={{{','.join(watched)}}}",
            "--set",
            f"metrics.serviceMonitor.namespace={monitoring}",
            "--set",
            f"metrics.podMonitor.namespace={monitoring}",
            "--set",
            f"prometheusRule.namespace={monitoring}",
            "--set",
            f"grafanaDashboards.namespace={monitoring}",
        )
        docs = _manifest(control_plane, release)
        kinds = sorted(d["kind"] for d in docs)
        assert kinds.count("NetworkPolicy") == 4 and kinds.count("ConfigMap") == 3
        assert {"ServiceMonitor", "PodMonitor", "PrometheusRule"} <= set(kinds)
        for obj in docs:
            assert _exists(control_plane, obj), (
                f"{obj['kind']}/{obj['metadata']['name']} missing after install"
            )
        # The apiserver kept the rule groups (the CRD schema would prune a misplaced field).
        rule = json.loads(
            control_plane.kubectl(
                "get",
                "prometheusrules.monitoring.coreos.com",
                f"full-{suffix}",
                "-n",
                monitoring,
                "-o",
                "json",
            ).stdout
        )
        alerts = {r.get("alert") for g in rule["spec"]["groups"] for r in g["rules"]}
        assert {"TrainopJobStalled", "TrainopOperatorDown"} <= alerts
        pod_monitor = json.loads(
            control_plane.kubectl(
                "get",
                "podmonitors.monitoring.coreos.com",
                f"full-{suffix}-trainers",
                "-n",
                monitoring,
                "-o",
                "json",
            ).stdout
        )
        assert pod_monitor["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True
    finally:
        control_plane.helm("uninstall", release["name"], "--namespace", namespace, check=False)
        release["namespace"] = ""
        for name in [*watched, monitoring]:
            control_plane.delete_namespace(name)


def test_upgrade_changes_the_operator_and_uninstall_keeps_the_crds(
    control_plane: cluster.ControlPlane, namespace: str, release: dict[str, str]
) -> None:
    _install(control_plane, release, namespace)
    upgrade = control_plane.helm(
        "upgrade",
        release["name"],
        str(CHART_DIR),
        "--namespace",
        namespace,
        "--set",
        "operator.logFormat=json",
        check=False,
    )
    assert upgrade.returncode == 0, upgrade.stderr
    deployment = json.loads(
        control_plane.kubectl(
            "get",
            "deployment",
            "-n",
            namespace,
            "-l",
            f"app.kubernetes.io/instance={release['name']}",
            "-o",
            "json",
        ).stdout
    )["items"][0]
    assert "--log-format=json" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    control_plane.helm("uninstall", release["name"], "--namespace", namespace)
    release["namespace"] = ""
    crds = control_plane.kubectl("get", "crd", "-o", "name").stdout.split()
    assert "customresourcedefinition.apiextensions.k8s.io/trainingjobs.trainop.dev" in crds
    assert (
        control_plane.kubectl(
            "get", "clusterrole", f"{release['name']}-trainop-operator", check=False
        ).returncode
        != 0
    )


# ----------------------------------------------------------------------------------------------- RBAC
@pytest.fixture(scope="module")
def cluster_wide(control_plane: cluster.ControlPlane) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """One default (cluster-wide) install shared by the RBAC tests, which only read it.

    Returns ("<namespace>/<serviceaccount>", the release's objects).
    """
    namespace = control_plane.create_namespace(prefix="rbac-")
    state = {"name": _release(), "namespace": ""}
    try:
        _install(control_plane, state, namespace)
        docs = _manifest(control_plane, state)
        (account,) = [d for d in docs if d["kind"] == "ServiceAccount"]
        yield f"{namespace}/{account['metadata']['name']}", docs
    finally:
        if state["namespace"]:
            control_plane.helm("uninstall", state["name"], "--namespace", namespace, check=False)
        control_plane.delete_namespace(namespace)


def test_service_account_may_do_everything_the_chart_grants_in_any_namespace(
    control_plane: cluster.ControlPlane, cluster_wide: tuple[str, list[dict[str, Any]]]
) -> None:
    account, docs = cluster_wide
    elsewhere = f"somewhere-{uuid.uuid4().hex[:6]}"  # SubjectAccessReview needs no real namespace
    denied = [
        g for g in _grants(docs, "-operator") if not _can(control_plane, account, elsewhere, g[2], g[0], g[1])
    ]
    denied += [
        g
        for g in _grants(docs, "-operator-cluster")
        if not _can(control_plane, account, None, g[2], g[0], g[1])
    ]
    assert not denied, f"granted in the chart but refused by the apiserver: {denied}"


@pytest.mark.parametrize(
    ("verb", "group", "resource"),
    [
        ("get", "", "secrets"),
        ("list", "", "secrets"),
        ("watch", "", "secrets"),
        ("create", "", "pods"),
        ("create", "", "pods/exec"),
        ("create", "trainop.dev", "trainingjobs"),
        ("update", "trainop.dev", "trainingjobs"),
        ("delete", "", "pods"),
        ("delete", "", "configmaps"),
        ("escalate", "rbac.authorization.k8s.io", "roles"),
        ("bind", "rbac.authorization.k8s.io", "roles"),
        ("create", "rbac.authorization.k8s.io", "clusterroles"),
        ("create", "", "serviceaccounts/token"),
        ("impersonate", "", "serviceaccounts"),
        ("create", "batch", "jobs"),
        ("delete", "ray.io", "rayclusters"),
    ],
    ids=lambda value: str(value) or "core",
)
def test_service_account_is_refused_what_the_operator_must_not_do(
    control_plane: cluster.ControlPlane,
    cluster_wide: tuple[str, list[dict[str, Any]]],
    verb: str,
    group: str,
    resource: str,
) -> None:
    account, _ = cluster_wide
    assert not _can(control_plane, account, "default", verb, group, resource)


def test_kubectl_auth_can_i_as_the_operator_refuses_secrets_and_allows_rayjobs(
    control_plane: cluster.ControlPlane, cluster_wide: tuple[str, list[dict[str, Any]]], namespace: str
) -> None:
    account, _ = cluster_wide
    user = "system:serviceaccount:" + account.replace("/", ":")
    secrets = control_plane.kubectl(
        "auth", "can-i", "get", "secrets", "--as", user, "-n", namespace, check=False
    )
    assert (secrets.returncode, secrets.stdout.strip()) == (1, "no")
    rayjobs = control_plane.kubectl(
        "auth", "can-i", "create", "rayjobs.ray.io", "--as", user, "-n", namespace, check=False
    )
    assert (rayjobs.returncode, rayjobs.stdout.strip()) == (0, "yes")


def test_operator_token_can_create_a_jobs_own_role_and_binding_but_not_escalate(
    control_plane: cluster.ControlPlane, cluster_wide: tuple[str, list[dict[str, Any]]], namespace: str
) -> None:
    """What the operator does per job: a Role allowing patch on that job's status, bound to the job's
    ServiceAccount, all labelled as trainop's (the chart's admission policy refuses anything else). The
    apiserver allows it only because the operator holds that permission itself; a binding to a more
    powerful role must be refused."""
    account, _ = cluster_wide
    sa_namespace, sa_name = account.split("/")
    token = control_plane.service_account_token(sa_namespace, sa_name, create=False)
    job_namespace = control_plane.create_namespace(prefix="job-")
    client = control_plane.api_client(token=token)
    try:
        rbac = kubernetes.client.RbacAuthorizationV1Api(client)
        core = kubernetes.client.CoreV1Api(client)
        core.create_namespaced_service_account(
            job_namespace,
            kubernetes.client.V1ServiceAccount(
                metadata=kubernetes.client.V1ObjectMeta(name="resnet-trainer", labels=TRAINOP_LABELS)
            ),
        )
        rbac.create_namespaced_role(
            job_namespace,
            {
                "metadata": {"name": "resnet-status-writer", "labels": TRAINOP_LABELS},
                "rules": [
                    {
                        "apiGroups": ["trainop.dev"],
                        "resources": ["trainingjobs/status"],
                        "resourceNames": ["resnet"],
                        "verbs": ["get", "patch"],
                    }
                ],
            },
        )
        rbac.create_namespaced_role_binding(
            job_namespace,
            {
                "metadata": {"name": "resnet-status-writer", "labels": TRAINOP_LABELS},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "resnet-status-writer",
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": "resnet-trainer", "namespace": job_namespace}
                ],
            },
        )
        with pytest.raises(kubernetes.client.ApiException) as refused_role:
            rbac.create_namespaced_role(
                job_namespace,
                {
                    "metadata": {"name": "secret-reader", "labels": TRAINOP_LABELS},
                    "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
                },
            )
        assert refused_role.value.status == 403
        with pytest.raises(kubernetes.client.ApiException) as refused_binding:
            rbac.create_namespaced_role_binding(
                job_namespace,
                {
                    # cluster-admin, not admin: admin is an aggregated role, empty without the
                    # aggregation controller (this control plane runs none): binding it is allowed.
                    "metadata": {"name": "cluster-admin", "labels": TRAINOP_LABELS},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "cluster-admin",
                    },
                    "subjects": [
                        {"kind": "ServiceAccount", "name": "resnet-trainer", "namespace": job_namespace}
                    ],
                },
            )
        assert refused_binding.value.status == 403
        with pytest.raises(kubernetes.client.ApiException) as refused_read:
            core.list_namespaced_secret(job_namespace)
        assert refused_read.value.status == 403
    finally:
        client.close()
        control_plane.delete_namespace(job_namespace)


def test_watch_namespaces_confine_the_operator_to_those_namespaces(
    control_plane: cluster.ControlPlane, namespace: str, release: dict[str, str]
) -> None:
    watched = control_plane.create_namespace(prefix="watched-")
    other = control_plane.create_namespace(prefix="other-")
    try:
        _install(control_plane, release, namespace, "--set", f"watchNamespaces={{{watched}}}")
        account = f"{namespace}/{release['name']}-trainop"
        assert _can(control_plane, account, watched, "watch", "trainop.dev", "trainingjobs")
        assert _can(control_plane, account, watched, "create", "ray.io", "rayjobs")
        assert not _can(control_plane, account, other, "watch", "trainop.dev", "trainingjobs")
        assert not _can(control_plane, account, other, "create", "ray.io", "rayjobs")
        assert not _can(control_plane, account, None, "list", "trainop.dev", "trainingjobs")  # all namespaces
        # kopf's discovery stays cluster-wide: namespaces and CRDs are cluster-scoped.
        assert _can(control_plane, account, None, "list", "", "namespaces")
        assert _can(
            control_plane, account, None, "watch", "apiextensions.k8s.io", "customresourcedefinitions"
        )
    finally:
        control_plane.helm("uninstall", release["name"], "--namespace", namespace, check=False)
        release["namespace"] = ""
        control_plane.delete_namespace(watched)
        control_plane.delete_namespace(other)


# ------------------------------------------------------------------------------------- pod security
@pytest.mark.parametrize(
    ("set_values", "violates"),
    [
        ([], False),
        (["securityContext.allowPrivilegeEscalation=true", "podSecurityContext.runAsNonRoot=false"], True),
    ],
    ids=["chart-defaults", "weakened-control"],
)
def test_operator_pod_meets_the_restricted_pod_security_standard(
    control_plane: cluster.ControlPlane, namespace: str, tmp_path: Path, set_values: list[str], violates: bool
) -> None:
    """The apiserver's PodSecurity admission judges the Deployment's pod template against `restricted`."""
    control_plane.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/warn=restricted")
    args = [
        "template",
        "t",
        str(CHART_DIR),
        "--namespace",
        namespace,
        "--show-only",
        "templates/deployment.yaml",
    ]
    for item in set_values:
        args += ["--set", item]
    rendered = tmp_path / "deployment.yaml"
    rendered.write_text(control_plane.helm(*args).stdout)
    result = control_plane.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", str(rendered), check=False
    )
    assert result.returncode == 0, result.stderr
    assert ("would violate PodSecurity" in result.stderr) is violates, result.stderr
