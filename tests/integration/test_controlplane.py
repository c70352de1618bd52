"""The test control plane behaves like a real cluster in the ways trainop's integration tests rely on.

Every test here runs against real kube-apiserver, etcd and kube-controller-manager processes (see
tests/controlplane/ and docs/controlplane.md): versions, garbage collection through owner references,
namespace deletion, ServiceAccount tokens under RBAC, KubeRay CRD validation, kubectl and helm.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from tests.controlplane import assets, cluster, crds, fixtures

pytestmark = pytest.mark.controlplane

RAY_GROUP, RAY_VERSION = "ray.io", "v1"


def eventually(condition: Callable[[], bool], *, timeout_s: float = 60, interval_s: float = 0.2) -> bool:
    """Poll until ``condition()`` is true; return whether it became true within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval_s)
    return condition()


def is_gone(read: Callable[[], object]) -> bool:
    try:
        read()
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            return True
        raise
    return False


def ray_pod_template(container: str) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": container, "image": "rayproject/ray:2.60.0"}]}}


def minimal_rayjob(name: str, *, worker_replicas: object = 1) -> dict[str, Any]:
    """A RayJob with a head group and one worker group, the shape trainop's operator emits."""
    return {
        "apiVersion": f"{RAY_GROUP}/{RAY_VERSION}",
        "kind": "RayJob",
        "metadata": {"name": name},
        "spec": {
            "entrypoint": "python -m trainer",
            "rayClusterSpec": {
                "headGroupSpec": {"rayStartParams": {}, "template": ray_pod_template("ray-head")},
                "workerGroupSpecs": [
                    {
                        "groupName": "workers",
                        "replicas": worker_replicas,
                        "minReplicas": 1,
                        "maxReplicas": 1,
                        "rayStartParams": {},
                        "template": ray_pod_template("ray-worker"),
                    }
                ],
            },
        },
    }


def as_dict(value: object) -> dict[str, Any]:
    """Custom-object calls return untyped JSON; narrow it for the type checker."""
    assert isinstance(value, dict)
    return value


def core_api(plane: cluster.ControlPlane) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(plane.api_client())


def custom_api(plane: cluster.ControlPlane) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(plane.api_client())


def binary_version(path: Path) -> str:
    """``Kubernetes v1.37.2`` -> ``v1.37.2``."""
    output = subprocess.run([str(path), "--version"], capture_output=True, text=True, check=True).stdout
    return output.split()[-1]


# ------------------------------------------------------------------------------------------ versions
def test_kubectl_reports_the_server_version_of_the_apiserver_binary_that_was_started(
    control_plane: cluster.ControlPlane,
) -> None:
    result = control_plane.kubectl("version", "--output=json")
    server = json.loads(result.stdout)["serverVersion"]

    assert control_plane.assets.kube_apiserver is not None
    assert server["gitVersion"] == binary_version(control_plane.assets.kube_apiserver)


def test_apiserver_built_from_the_cache_is_the_pinned_kubernetes_version(
    control_plane: cluster.ControlPlane,
) -> None:
    if control_plane.assets.sources.get("kube-apiserver") != "cache":
        pytest.skip("kube-apiserver comes from KUBEBUILDER_ASSETS, whose version is the user's choice")
    pinned = control_plane.assets.pinned_kubernetes_version
    status, version = control_plane.request("GET", "/version")

    assert status == 200
    assert (version["gitVersion"], version["major"], version["minor"]) == (pinned, "1", pinned.split(".")[1])


def test_readyz_passes_every_check_including_rbac_bootstrap(control_plane: cluster.ControlPlane) -> None:
    result = control_plane.kubectl("get", "--raw", "/readyz?verbose")

    assert "readyz check passed" in result.stdout
    assert "[+]poststarthook/rbac/bootstrap-roles ok" in result.stdout


# -------------------------------------------------------------------------- controller-manager (GC, ns)
@pytest.fixture
def controller_manager(control_plane: cluster.ControlPlane) -> cluster.ControlPlane:
    if not control_plane.controller_manager_running:
        pytest.skip(f"no kube-controller-manager binary; {assets.HOW_TO_BUILD}")
    return control_plane


def create_owner(
    plane: cluster.ControlPlane, namespace: str, kind: str
) -> tuple[str, str, Callable[[], None]]:
    """Create an owner object of ``kind``; return (apiVersion, uid, delete)."""
    if kind == "ConfigMap":
        owner = core_api(plane).create_namespaced_config_map(
            namespace,
            kubernetes.client.V1ConfigMap(metadata=kubernetes.client.V1ObjectMeta(name="owner")),
        )
        assert owner.metadata is not None and owner.metadata.uid is not None

        def delete_configmap() -> None:
            core_api(plane).delete_namespaced_config_map("owner", namespace)

        return "v1", owner.metadata.uid, delete_configmap
    rayjob = as_dict(
        custom_api(plane).create_namespaced_custom_object(
            RAY_GROUP, RAY_VERSION, namespace, "rayjobs", minimal_rayjob("owner")
        )
    )

    def delete_rayjob() -> None:
        custom_api(plane).delete_namespaced_custom_object(
            RAY_GROUP, RAY_VERSION, namespace, "rayjobs", "owner"
        )

    return (
        f"{RAY_GROUP}/{RAY_VERSION}",
        rayjob["metadata"]["uid"],
        delete_rayjob,
    )


def create_dependent(
    plane: cluster.ControlPlane, namespace: str, *, api_version: str, kind: str, uid: str
) -> None:
    core_api(plane).create_namespaced_config_map(
        namespace,
        kubernetes.client.V1ConfigMap(
            metadata=kubernetes.client.V1ObjectMeta(
                name="dependent",
                owner_references=[
                    kubernetes.client.V1OwnerReference(
                        api_version=api_version, kind=kind, name="owner", uid=uid
                    )
                ],
            ),
            data={"config.json": "{}"},
        ),
    )


@pytest.mark.parametrize("owner_kind", ["ConfigMap", "RayJob"])
def test_garbage_collector_deletes_a_configmap_when_its_owner_is_deleted(
    controller_manager: cluster.ControlPlane, namespace: str, owner_kind: str
) -> None:
    api_version, uid, delete_owner = create_owner(controller_manager, namespace, owner_kind)
    create_dependent(controller_manager, namespace, api_version=api_version, kind=owner_kind, uid=uid)

    delete_owner()

    read = lambda: core_api(controller_manager).read_namespaced_config_map("dependent", namespace)  # noqa: E731
    assert eventually(lambda: is_gone(read)), f"dependent of deleted {owner_kind} still exists"


def test_orphan_deletion_keeps_the_dependent_and_strips_its_owner_reference(
    controller_manager: cluster.ControlPlane, namespace: str
) -> None:
    api_version, uid, _ = create_owner(controller_manager, namespace, "ConfigMap")
    create_dependent(controller_manager, namespace, api_version=api_version, kind="ConfigMap", uid=uid)

    core_api(controller_manager).delete_namespaced_config_map("owner", namespace, propagation_policy="Orphan")

    def owner_references() -> object:
        metadata = core_api(controller_manager).read_namespaced_config_map("dependent", namespace).metadata
        assert metadata is not None
        return metadata.owner_references

    assert eventually(lambda: not owner_references()), "GC never orphaned the dependent"
    assert core_api(controller_manager).read_namespaced_config_map("dependent", namespace).data == {
        "config.json": "{}"
    }


def test_deleting_a_namespace_removes_the_namespace_and_its_objects(
    controller_manager: cluster.ControlPlane,
) -> None:
    name = controller_manager.create_namespace(prefix="doomed-")
    core_api(controller_manager).create_namespaced_config_map(
        name, kubernetes.client.V1ConfigMap(metadata=kubernetes.client.V1ObjectMeta(name="inside"))
    )

    controller_manager.delete_namespace(name, wait=True, timeout_s=60)

    assert is_gone(lambda: core_api(controller_manager).read_namespace(name))


def test_a_new_namespace_gets_a_default_service_account(
    controller_manager: cluster.ControlPlane, namespace: str
) -> None:
    read = lambda: core_api(controller_manager).read_namespaced_service_account("default", namespace)  # noqa: E731

    assert eventually(lambda: not is_gone(read), timeout_s=30)


# ------------------------------------------------------------------------------- tokens and RBAC
def test_service_account_token_authenticates_as_that_service_account(
    control_plane: cluster.ControlPlane, namespace: str
) -> None:
    token = control_plane.service_account_token(namespace, "rank0")

    with control_plane.api_client(token=token) as client:
        review = kubernetes.client.AuthenticationV1Api(client).create_self_subject_review(
            kubernetes.client.V1SelfSubjectReview()
        )

    assert review.status is not None and review.status.user_info is not None
    assert review.status.user_info.username == f"system:serviceaccount:{namespace}:rank0"
    assert "system:serviceaccounts" in (review.status.user_info.groups or [])


def test_service_account_token_without_roles_is_denied_reading_secrets(
    control_plane: cluster.ControlPlane, namespace: str
) -> None:
    token = control_plane.service_account_token(namespace, "rank0")
    token_kubeconfig = control_plane.kubeconfig_for_token(token, namespace=namespace)

    can_i = control_plane.kubectl(
        "auth", "can-i", "get", "secrets", "-n", namespace, kubeconfig_path=token_kubeconfig, check=False
    )
    with (
        control_plane.api_client(token=token) as client,
        pytest.raises(kubernetes.client.ApiException) as denied,
    ):
        kubernetes.client.CoreV1Api(client).list_namespaced_secret(namespace)

    assert (can_i.returncode, can_i.stdout.strip()) == (1, "no")
    assert denied.value.status == 403


def test_role_binding_grants_a_service_account_token_exactly_the_verbs_it_names(
    control_plane: cluster.ControlPlane, namespace: str
) -> None:
    rbac = kubernetes.client.RbacAuthorizationV1Api(control_plane.api_client())
    rbac.create_namespaced_role(
        namespace,
        kubernetes.client.V1Role(
            metadata=kubernetes.client.V1ObjectMeta(name="read-configmaps"),
            rules=[
                kubernetes.client.V1PolicyRule(
                    api_groups=[""], resources=["configmaps"], verbs=["get", "list"]
                )
            ],
        ),
    )
    rbac.create_namespaced_role_binding(
        namespace,
        kubernetes.client.V1RoleBinding(
            metadata=kubernetes.client.V1ObjectMeta(name="rank0-reads-configmaps"),
            role_ref=kubernetes.client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="Role", name="read-configmaps"
            ),
            subjects=[
                kubernetes.client.RbacV1Subject(kind="ServiceAccount", name="rank0", namespace=namespace)
            ],
        ),
    )
    token_kubeconfig = control_plane.kubeconfig_for_token(
        control_plane.service_account_token(namespace, "rank0"), namespace=namespace
    )

    def can_i(verb: str, resource: str) -> str:
        result = control_plane.kubectl(
            "auth", "can-i", verb, resource, "-n", namespace, kubeconfig_path=token_kubeconfig, check=False
        )
        return result.stdout.strip()

    assert [can_i("list", "configmaps"), can_i("delete", "configmaps"), can_i("get", "secrets")] == [
        "yes",
        "no",
        "no",
    ]


# ------------------------------------------------------------------------------------- CRDs
@pytest.mark.parametrize("crd", ["rayjobs.ray.io", "rayclusters.ray.io"])
def test_kuberay_crd_is_established_and_serves_v1(control_plane: cluster.ControlPlane, crd: str) -> None:
    status, body = control_plane.request(
        "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}"
    )
    conditions = {c["type"]: c["status"] for c in body["status"]["conditions"]}

    assert status == 200
    assert conditions["Established"] == "True"
    assert "v1" in [version["name"] for version in body["spec"]["versions"] if version["served"]]


def test_our_crds_from_the_crds_directory_are_established(control_plane: cluster.ControlPlane) -> None:
    paths = control_plane.settings.crd_paths
    if not paths:
        pytest.skip(f"no CRD YAML in {crds.DEFAULT_CRD_DIR} (or ${fixtures.CRD_DIR_ENV}) yet")
    expected = [
        document["metadata"]["name"]
        for path in paths
        for document in yaml.safe_load_all(path.read_text())
        if document
    ]
    listed = control_plane.kubectl(
        "get", "crd", "-o", "jsonpath={range .items[*]}{.metadata.name}{'\\n'}{end}"
    )

    assert set(expected) <= set(control_plane.crd_names)
    assert set(expected) <= set(listed.stdout.split())


def test_minimal_rayjob_is_accepted_by_server_side_dry_run_and_not_stored(
    control_plane: cluster.ControlPlane, namespace: str
) -> None:
    api = custom_api(control_plane)

    accepted = as_dict(
        api.create_namespaced_custom_object(
            RAY_GROUP, RAY_VERSION, namespace, "rayjobs", minimal_rayjob("train"), dry_run="All"
        )
    )

    assert accepted["metadata"]["name"] == "train"
    assert accepted["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 1
    stored = as_dict(api.list_namespaced_custom_object(RAY_GROUP, RAY_VERSION, namespace, "rayjobs"))
    assert stored["items"] == []


def test_rayjob_with_a_string_for_worker_replicas_is_rejected_naming_the_field(
    control_plane: cluster.ControlPlane, namespace: str
) -> None:
    with pytest.raises(kubernetes.client.ApiException) as rejected:
        custom_api(control_plane).create_namespaced_custom_object(
            RAY_GROUP,
            RAY_VERSION,
            namespace,
            "rayjobs",
            minimal_rayjob("train", worker_replicas="two"),
            dry_run="All",
        )

    assert rejected.value.status == 422
    causes = json.loads(rejected.value.body or "{}")["details"]["causes"]
    assert {
        "field": "spec.rayClusterSpec.workerGroupSpecs[0].replicas",
        "reason": "FieldValueTypeInvalid",
    } in [{"field": cause.get("field"), "reason": cause.get("reason")} for cause in causes]


def test_kubectl_server_side_apply_dry_run_accepts_a_minimal_rayjob(
    control_plane: cluster.ControlPlane, namespace: str
) -> None:
    result = control_plane.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "-n",
        namespace,
        "-f",
        "-",
        input=yaml.safe_dump(minimal_rayjob("train")),
    )

    assert result.stdout.strip() == "rayjob.ray.io/train serverside-applied (server dry run)"


# --------------------------------------------------------------------------------------- helm
@pytest.fixture
def helm_plane(control_plane: cluster.ControlPlane) -> cluster.ControlPlane:
    if control_plane.assets.helm is None:
        pytest.skip(f"no helm binary; {assets.HOW_TO_BUILD}")
    return control_plane


def test_helm_reports_the_pinned_version(helm_plane: cluster.ControlPlane) -> None:
    result = helm_plane.helm("version", "--short")

    assert result.stdout.strip().split("+")[0] == helm_plane.assets.versions["HELM_VERSION"]


def test_helm_installs_and_uninstalls_a_chart_in_the_cluster(
    helm_plane: cluster.ControlPlane, namespace: str, tmp_path: Path
) -> None:
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    (chart / "templates" / "configmap.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-settings\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n"
    )
    (chart / "values.yaml").write_text("greeting: hello\n")

    def read() -> kubernetes.client.V1ConfigMap:
        return core_api(helm_plane).read_namespaced_config_map("probe-settings", namespace)

    helm_plane.helm("install", "probe", str(chart), "--namespace", namespace, "--set", "greeting=bonjour")
    installed = read()
    helm_plane.helm("uninstall", "probe", "--namespace", namespace, "--wait")

    assert installed.data == {"greeting": "bonjour"}
    assert is_gone(read)


# ------------------------------------------------------------------------------- dev cluster CLI
def children_of(pid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@dataclasses.dataclass(frozen=True)
class DevCluster:
    process: subprocess.Popen[str]
    kubeconfig: Path
    num_components: int


@pytest.fixture
def dev_cluster(control_plane_assets: assets.Assets, tmp_path: Path) -> Iterator[DevCluster]:
    """``python -m tests.controlplane`` started and ready (its export line printed); killed afterwards."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.controlplane",
            "--no-kuberay-crds",
            "--crds",
            str(tmp_path / "none"),
            "--no-build",
        ],
        cwd=cluster.REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    first = process.stdout.readline()
    assert first.startswith("export KUBECONFIG="), first
    kubeconfig = Path(first.strip().split("=", 1)[1])
    yield DevCluster(
        process=process,
        kubeconfig=kubeconfig,
        num_components=3 if control_plane_assets.kube_controller_manager is not None else 2,
    )
    if process.poll() is None:
        process.kill()
        process.wait()
    shutil.rmtree(kubeconfig.parent, ignore_errors=True)  # a SIGKILLed dev cluster cannot clean up


def test_dev_cluster_stops_its_processes_and_removes_its_data_dir_on_ctrl_c(dev_cluster: DevCluster) -> None:
    components = children_of(dev_cluster.process.pid)

    dev_cluster.process.send_signal(signal.SIGINT)
    code = dev_cluster.process.wait(timeout=60)

    assert len(components) == dev_cluster.num_components
    assert code == 0
    assert [pid for pid in components if pid_alive(pid)] == []
    assert not dev_cluster.kubeconfig.parent.exists()


def test_dev_cluster_components_die_with_it_when_it_is_killed(dev_cluster: DevCluster) -> None:
    components = children_of(dev_cluster.process.pid)

    os.kill(dev_cluster.process.pid, signal.SIGKILL)
    dev_cluster.process.wait(timeout=10)

    assert len(components) == dev_cluster.num_components
    assert eventually(lambda: not [pid for pid in components if pid_alive(pid)], timeout_s=15)
