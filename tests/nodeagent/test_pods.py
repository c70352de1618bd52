"""Pods on the node agent, against a real apiserver: what a user sees with kubectl and in the API.

Real parts: kube-apiserver + etcd + kube-controller-manager (tests/controlplane) bound to the bed's
root veth; the agent as its own process with node client certificates (Node authorizer,
NodeRestriction); pods as real processes in their own network and mount namespaces and cgroups. Pods
name their node (``spec.nodeName``): no scheduler runs here. The only stand-in is the agent itself.
"""

from __future__ import annotations

import base64
import os
import pty
import subprocess
import time
from pathlib import Path

import pytest

from . import container_cpu, harness, kit
from .kit import BUSYBOX, Namespace, wait_for

pytestmark = pytest.mark.nodeagent


def _sh(name: str, script: str, **extra: object) -> dict[str, object]:
    return {"name": name, "image": BUSYBOX, "command": ["sh", "-c", script], **extra}


# ------------------------------------------------------------------------------------------- nodes
def test_nodes_register_ready_with_capacity_labels_pod_cidr_and_a_renewed_lease(
    agent_bed: harness.AgentHarness,
) -> None:
    assert agent_bed.plane is not None and agent_bed.bed is not None
    status, node = agent_bed.plane.request("GET", "/api/v1/nodes/node-a")
    assert status == 200
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "node-a"
    assert node["metadata"]["labels"]["trainop.dev/pool"] == "gpu"
    assert node["spec"]["podCIDR"] == f"10.244.{agent_bed.bed.bed_id}.0/25"
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "1"
    assert node["status"]["allocatable"]["cpu"] == "4"
    assert {"type": "InternalIP", "address": agent_bed.bed.node_ip} in node["status"]["addresses"]
    assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == 10250
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "KubeletReady")
    assert "ExtendWebSocketsToKubelet" in node["status"].get("declaredFeatures", [])

    def renew_time() -> str:
        _, lease = agent_bed.plane.request(  # type: ignore[union-attr]
            "GET", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-b"
        )
        return str(lease["spec"]["renewTime"])

    first = renew_time()
    wait_for("the node-b lease to be renewed", lambda: renew_time() != first, timeout_s=30)
    printed = agent_bed.plane.kubectl("get", "nodes").stdout
    assert "node-a   Ready" in printed and "node-b   Ready" in printed


# -------------------------------------------------------------------------------------- basic runs
def test_pod_runs_to_succeeded_and_a_failing_one_to_failed_with_its_exit_code(
    pod_namespace: Namespace,
) -> None:
    ns = pod_namespace
    ns.pod("ok", containers=[_sh("main", "echo hello from $(hostname)")], restartPolicy="Never")
    ns.pod("bad", containers=[_sh("main", "echo about to fail >&2; exit 3")], restartPolicy="Never")
    ok = ns.wait_phase("ok", "Succeeded")
    terminated = ok["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
    assert ns.logs("ok") == "hello from ok\n"
    assert ok["status"]["podIP"].startswith("10.244.")
    bad = ns.wait_phase("bad", "Failed")
    terminated = bad["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (3, "Error")
    assert ns.logs("bad") == "about to fail\n"
    ns.wait_events("ok", {"Pulled", "Created", "Started"})
    event = next(e for e in ns.events("ok") if e["reason"] == "Started")
    assert event["source"] == {"component": "kubelet", "host": "node-a"}
    assert event["involvedObject"]["fieldPath"] == "spec.containers{main}"


def test_command_not_found_is_container_cannot_run(pod_namespace: Namespace) -> None:
    ns = pod_namespace
    ns.pod(
        "missing",
        containers=[{"name": "main", "image": BUSYBOX, "command": ["no-such-binary"]}],
        restartPolicy="Never",
    )
    pod = ns.wait_phase("missing", "Failed")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["reason"] == "ContainerCannotRun"
    assert terminated["exitCode"] == 128
    assert 'exec: "no-such-binary": executable file not found in $PATH' in terminated["message"]


# ----------------------------------------------------------------------------------------- env
def test_env_has_downward_api_configmap_secret_resource_and_service_values(pod_namespace: Namespace) -> None:
    ns = pod_namespace
    ns.create("configmaps", {"metadata": {"name": "cfg"}, "data": {"MODE": "fast", "LEVEL": "3"}})
    ns.create(
        "secrets", {"metadata": {"name": "creds"}, "data": {"token": base64.b64encode(b"s3cret").decode()}}
    )
    ns.create(
        "services",
        {
            "metadata": {"name": "ray-head"},
            "spec": {"ports": [{"name": "gcs", "port": 6379}], "selector": {"a": "b"}},
        },
    )
    _, service = ns.request("GET", ns.path("services/ray-head"))
    cluster_ip = service["spec"]["clusterIP"]
    # The Service must be in the agent's cache before the container starts: poll via a throwaway pod.
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "MODE"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "OPTIONAL", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "x", "optional": True}}},
        {
            "name": "MEM_MI",
            "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
        },
        {"name": "GREETING", "value": "$(POD_NAME) on $(NODE) mode $(MODE)"},
    ]
    container = {
        "name": "main",
        "image": BUSYBOX,
        "command": ["sh", "-c", "env | sort; echo args: $0 $1", "$(MODE)", "$(NODE)"],
        "env": env,
        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
        "resources": {"limits": {"memory": "64Mi"}},
    }
    wait_for("the agent to see the Service", lambda: _service_seen(ns, cluster_ip), timeout_s=30)
    ns.pod("env", containers=[container], restartPolicy="Never")
    pod = ns.wait_phase("env", "Succeeded")
    lines = ns.logs("env").splitlines()
    values = dict(line.split("=", 1) for line in lines if "=" in line)
    assert values["POD_NAME"] == "env"
    assert values["POD_IP"] == pod["status"]["podIP"]
    assert values["NODE"] == "node-a"
    assert values["MODE"] == "fast" and values["CFG_LEVEL"] == "3"
    assert values["TOKEN"] == "s3cret"
    assert "OPTIONAL" not in values
    assert values["MEM_MI"] == "64"
    assert values["GREETING"] == "env on node-a mode fast"
    assert values["KUBERNETES_SERVICE_HOST"] == "10.0.0.1" and values["KUBERNETES_SERVICE_PORT"] == "443"
    assert values["RAY_HEAD_SERVICE_HOST"] == cluster_ip
    assert values["RAY_HEAD_SERVICE_PORT_GCS"] == "6379"
    assert values["HOSTNAME"] == "env"
    assert "args: fast node-a" in lines


def _service_seen(ns: Namespace, cluster_ip: str) -> bool:
    """True once a pod started now gets the Service's link (the agent's Service watch has it)."""
    name = f"probe-{time.monotonic_ns() % 10**8}"
    ns.pod(name, containers=[_sh("main", "echo ${RAY_HEAD_SERVICE_HOST:-none}")], restartPolicy="Never")
    ns.wait_phase(name, "Succeeded")
    return ns.logs(name).strip() == cluster_ip


def test_missing_configmap_key_is_create_container_config_error_until_it_exists(
    pod_namespace: Namespace,
) -> None:
    ns = pod_namespace
    env = [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "late", "key": "x"}}}]
    ns.pod("late", containers=[_sh("main", "echo $X", env=env)], restartPolicy="Never")
    waiting = ns.wait_container(
        "late",
        "main",
        lambda s: s["state"].get("waiting", {}).get("reason") == "CreateContainerConfigError",
        "config error",
    )
    assert "configmap 'late' not found" in waiting["state"]["waiting"]["message"]
    ns.create("configmaps", {"metadata": {"name": "late"}, "data": {"x": "arrived"}})
    ns.wait_phase("late", "Succeeded")
    assert ns.logs("late") == "arrived\n"


# ------------------------------------------------------------------------------------- volumes
def test_volumes_configmap_secret_downward_emptydir_and_a_service_account_token(
    pod_namespace: Namespace,
) -> None:
    ns = pod_namespace
    ns.create("configmaps", {"metadata": {"name": "files"}, "data": {"a.txt": "alpha", "b.txt": "beta"}})
    ns.create(
        "secrets", {"metadata": {"name": "keys"}, "data": {"key": base64.b64encode(b"private").decode()}}
    )
    volumes = [
        {
            "name": "cfg",
            "configMap": {
                "name": "files",
                "items": [{"key": "a.txt", "path": "sub/renamed.txt", "mode": 0o600}],
            },
        },
        {"name": "sec", "secret": {"secretName": "keys", "defaultMode": 0o400}},
        {
            "name": "info",
            "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]},
        },
        {"name": "scratch", "emptyDir": {}},
        {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}},
    ]
    mounts = [
        {"name": "cfg", "mountPath": "/etc/cfg"},
        {"name": "sec", "mountPath": "/etc/sec"},
        {"name": "info", "mountPath": "/etc/info"},
        {"name": "scratch", "mountPath": "/scratch"},
        {"name": "mem", "mountPath": "/mem"},
    ]
    script = (
        "cat /etc/cfg/sub/renamed.txt; echo; stat -L -c %a /etc/cfg/sub/renamed.txt; cat /etc/sec/key; echo; "
        "cat /etc/info/labels; echo; cat /scratch/from-init; "
        "touch /etc/cfg/x 2>/dev/null && echo cfg-writable || echo cfg-read-only; "
        "df -k /mem | tail -1 | awk '{print \"mem-kib\", $2}'; "
        "SA=/var/run/secrets/kubernetes.io/serviceaccount; "
        "cat $SA/namespace; echo; cat $SA/ca.crt | head -1; "
        "echo token: $(cat $SA/token)"
    )
    ns.pod(
        "vols",
        labels={"app": "vols", "tier": "test"},
        initContainers=[_sh("init", "echo written-by-init > /scratch/from-init", volumeMounts=[mounts[3]])],
        containers=[_sh("main", script, volumeMounts=mounts)],
        volumes=volumes,
        restartPolicy="Never",
    )
    ns.wait_phase("vols", "Succeeded")
    out = ns.logs("vols").splitlines()
    assert out[:4] == ["alpha", "600", "private", 'app="vols"']
    assert out[4] == 'tier="test"'
    assert "written-by-init" in out
    assert "cfg-read-only" in out
    assert "mem-kib 8192" in out
    assert ns.name in out
    assert "-----BEGIN CERTIFICATE-----" in out
    token = next(line for line in out if line.startswith("token: ")).split(" ", 1)[1]
    status, review = ns.request(
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
    )
    assert status == 201, review
    assert review["status"]["authenticated"] is True
    assert review["status"]["user"]["username"] == f"system:serviceaccount:{ns.name}:default"
    assert review["status"]["user"]["extra"]["authentication.kubernetes.io/pod-name"] == ["vols"]


def test_persistent_volume_claim_mounts_its_bound_host_path_volume(
    pod_namespace: Namespace, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ns = pod_namespace
    data = tmp_path_factory.mktemp("pv")
    data.chmod(0o777)
    pv_name = f"pv-{ns.name}"
    status, pv = ns.request(
        "POST",
        "/api/v1/persistentvolumes",
        {
            "metadata": {"name": pv_name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "hostPath": {"path": str(data)},
                "storageClassName": "manual",
                "claimRef": {"namespace": ns.name, "name": "data"},
            },
        },
    )
    assert status == 201, pv
    try:
        ns.create(
            "persistentvolumeclaims",
            {
                "metadata": {"name": "data"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "manual",
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        )
        ns.pod(
            "writer",
            containers=[
                _sh(
                    "main",
                    "echo checkpoint > /ckpt/step-1",
                    volumeMounts=[{"name": "d", "mountPath": "/ckpt"}],
                )
            ],
            volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}],
            restartPolicy="Never",
        )
        ns.wait_phase("writer", "Succeeded")
        assert (data / "step-1").read_text() == "checkpoint\n"
    finally:
        ns.request("DELETE", f"/api/v1/persistentvolumes/{pv_name}")


# ------------------------------------------------------------------------------------- network
def test_pods_on_two_nodes_reach_each_other_by_ip_once_ready(pod_namespace: Namespace) -> None:
    ns = pod_namespace
    server = {
        **_sh(
            "web", "mkdir -p /tmp/srv && cd /tmp/srv && echo pong > ping && exec python3 -m http.server 8080"
        ),
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/ping", "port": "http"}, "periodSeconds": 1},
    }
    ns.pod("server", containers=[server], node="node-a")
    wait_for("server Ready", lambda: ns.condition("server", "Ready") == "True")
    server_ip = ns.get_pod("server")["status"]["podIP"]
    ns.pod(
        "client",
        containers=[_sh("main", f"wget -qO- http://{server_ip}:8080/ping")],
        node="node-b",
        restartPolicy="Never",
    )
    client = ns.wait_phase("client", "Succeeded", "Failed")
    assert client["status"]["phase"] == "Succeeded", ns.logs("client")
    assert ns.logs("client") == "pong\n"
    assert client["status"]["podIP"] != server_ip
    assert client["status"]["hostIP"] == ns.bed.bed.node_ip  # type: ignore[union-attr]


# ----------------------------------------------------------------------------------- lifecycle
def test_init_containers_run_in_order_to_completion_before_the_app(pod_namespace: Namespace) -> None:
    ns = pod_namespace
    mount = {"name": "work", "mountPath": "/work-dir"}
    ns.pod(
        "ordered",
        initContainers=[
            _sh("first", "sleep 0.3; echo first >> /work-dir/order", volumeMounts=[mount]),
            _sh("second", "echo second >> /work-dir/order", volumeMounts=[mount]),
        ],
        containers=[_sh("app", "echo app >> /work-dir/order; cat /work-dir/order", volumeMounts=[mount])],
        volumes=[{"name": "work", "emptyDir": {}}],
        restartPolicy="Never",
    )
    pod = ns.wait_phase("ordered", "Succeeded")
    assert ns.logs("ordered", "-c", "app") == "first\nsecond\napp\n"
    init = pod["status"]["initContainerStatuses"]
    assert [s["state"]["terminated"]["reason"] for s in init] == ["Completed", "Completed"]
    assert ns.condition("ordered", "Initialized") == "True"


def test_a_failing_init_container_fails_a_never_pod_without_starting_the_app(
    pod_namespace: Namespace,
) -> None:
    ns = pod_namespace
    ns.pod(
        "initfail",
        initContainers=[_sh("setup", "exit 7")],
        containers=[_sh("app", "echo should not run")],
        restartPolicy="Never",
    )
    pod = ns.wait_phase("initfail", "Failed")
    assert pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 7
    assert "waiting" in pod["status"]["containerStatuses"][0]["state"]


def test_crashing_container_restarts_then_backs_off_and_on_failure_stops_at_success(
    pod_namespace: Namespace,
) -> None:
    ns = pod_namespace
    ns.pod("crash", containers=[_sh("main", "echo run; exit 1")], restartPolicy="Always")
    status = ns.wait_container(
        "crash",
        "main",
        lambda s: (
            s["restartCount"] >= 1 and s["state"].get("waiting", {}).get("reason") == "CrashLoopBackOff"
        ),
        "CrashLoopBackOff",
    )
    assert status["lastState"]["terminated"]["exitCode"] == 1
    assert "back-off" in status["state"]["waiting"]["message"]
    assert ns.phase("crash") == "Running"
    ns.wait_events("crash", {"BackOff"})
    ns.pod(
        "retry",
        containers=[
            _sh(
                "main",
                "ip -4 -o addr show eth0 | awk '{print $4}'; "
                "[ -e /scratch/tried ] && exit 0; touch /scratch/tried; exit 2",
                volumeMounts=[{"name": "s", "mountPath": "/scratch"}],
            )
        ],
        volumes=[{"name": "s", "emptyDir": {}}],
        restartPolicy="OnFailure",
    )
    pod = ns.wait_phase("retry", "Succeeded")
    status = pod["status"]["containerStatuses"][0]
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 2
    # The restarted container runs in the same sandbox: same netns, same IP.
    first_run, second_run = ns.logs("retry", "--previous"), ns.logs("retry")
    assert first_run == second_run == f"{pod['status']['podIP']}/24\n"


def test_memory_limit_is_enforced_and_reported_as_oomkilled(pod_namespace: Namespace) -> None:
    ns = pod_namespace
    hog = {
        "name": "hog",
        "image": BUSYBOX,
        "command": ["python3", "-c", "chunks = [bytearray(16 << 20) for _ in range(64)]"],
        "resources": {"limits": {"memory": "48Mi"}},
    }
    ns.pod("hog", containers=[hog], restartPolicy="Never")
    pod = ns.wait_phase("hog", "Failed")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["reason"], terminated["exitCode"]) == ("OOMKilled", 137)


def test_each_container_runs_cpu_time_is_logged_from_its_cgroup_exited_children_included(
    pod_namespace: Namespace, agent_bed: harness.AgentHarness
) -> None:
    """The agent's per-container CPU log (how the e2e tier says where its CPU goes): a container that
    spins for 3 s through short-lived children (each ``date`` is a process that exits) against one that
    sleeps as long."""
    ns = pod_namespace
    spin = "end=$(( $(date +%s) + 3 )); while [ $(date +%s) -lt $end ]; do :; done"
    ns.pod("cpu", containers=[_sh("spin", spin), _sh("idle", "sleep 3")], restartPolicy="Never")
    ns.wait_phase("cpu", "Succeeded")
    runs = {
        run.container: run
        for run in container_cpu.read(agent_bed.state_dir / container_cpu.LOG_NAME)
        if (run.namespace, run.pod) == (ns.name, "cpu")
    }
    assert set(runs) == {"spin", "idle"}, runs
    # at least a quarter of a core over its 3 s even on a loaded 2-core machine; never more than it ran
    assert 0.75 <= runs["spin"].cpu_s <= runs["spin"].wall_s + 0.5, runs["spin"]
    assert runs["idle"].cpu_s < 0.3, runs["idle"]
    assert runs["idle"].wall_s >= 2.9, runs["idle"]
    assert container_cpu.by_role(runs.values())[0].container == "spin"


def test_an_oom_kill_of_one_process_ends_the_whole_container_as_the_kubelets_oom_group_does(
    pod_namespace: Namespace,
) -> None:
    """The kernel kills only the hog (a child; cgroup v1 picks one process), yet the container ends at once,
    OOMKilled with exit 137: the kubelet's ``memory.oom.group`` behaviour on cgroup v2. Without it the shell
    would sleep on and the pod would stay Running (what a Ray container whose worker was OOM-killed did)."""
    ns = pod_namespace
    hog = {
        "name": "hog",
        "image": BUSYBOX,
        "command": [
            "sh",
            "-c",
            "python3 -c 'chunks = [bytearray(16 << 20) for _ in range(64)]'; sleep 600",
        ],
        "resources": {"limits": {"memory": "48Mi"}},
    }
    ns.pod("group", containers=[hog], restartPolicy="Never")
    pod = ns.wait_phase("group", "Failed", timeout_s=60)
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["reason"], terminated["exitCode"]) == ("OOMKilled", 137), terminated


def test_unknown_image_backs_off_and_the_pod_starts_once_the_image_exists(
    agent_bed: harness.AgentHarness, pod_namespace: Namespace
) -> None:
    ns = pod_namespace
    image = f"registry.test/not-yet-{ns.name}:1"
    ns.pod(
        "pull",
        containers=[{"name": "main", "image": image, "command": ["sh", "-c", "echo pulled"]}],
        restartPolicy="Never",
    )
    ns.wait_container(
        "pull",
        "main",
        lambda s: s["state"].get("waiting", {}).get("reason") == "ErrImagePull",
        "ErrImagePull",
    )
    status = ns.wait_container(
        "pull",
        "main",
        lambda s: s["state"].get("waiting", {}).get("reason") == "ImagePullBackOff",
        "ImagePullBackOff",
    )
    assert image in status["state"]["waiting"]["message"]
    assert ns.phase("pull") == "Pending"
    expected = {
        f'Failed to pull image "{image}": image {image!r} is not in the node agent\'s image map',
        "Error: ErrImagePull",
        f'Back-off pulling image "{image}"',
        "Error: ImagePullBackOff",
    }
    # Events are sent off the pod worker's thread: they may trail the status a little.
    wait_for("the pull events", lambda: expected <= {e["message"] for e in ns.events("pull")}, timeout_s=30)
    agent_bed.write_images({**kit.IMAGES, image: {}})
    try:
        ns.wait_phase("pull", "Succeeded")
        assert ns.logs("pull") == "pulled\n"
    finally:
        agent_bed.write_images(kit.IMAGES)


def test_run_as_non_root_with_a_root_image_is_a_config_error(pod_namespace: Namespace) -> None:
    ns = pod_namespace
    ns.pod(
        "rootless",
        containers=[{"name": "main", "image": "registry.test/root-user:1"}],
        securityContext={"runAsNonRoot": True},
        restartPolicy="Never",
    )
    status = ns.wait_container(
        "rootless",
        "main",
        lambda s: s["state"].get("waiting", {}).get("reason") == "CreateContainerConfigError",
        "CreateContainerConfigError",
    )
    assert "container has runAsNonRoot and image will run as root" in status["state"]["waiting"]["message"]


def test_run_as_user_and_fs_group_apply_to_the_process_and_its_volumes(pod_namespace: Namespace) -> None:
    ns = pod_namespace
    # The trainer image's python is this checkout's venv, whose interpreter lives under /root (0700 here).
    script = (
        "id -u; id -G; stat -c %g /data; touch /data/f && stat -c %g /data/f; "
        "python -c 'import kubernetes; print(\"py-ok\")'"
    )
    container = {
        "name": "main",
        "image": "ghcr.io/trainop/trainer:0.1.0",
        "command": ["sh", "-c", script],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    ns.pod(
        "user",
        containers=[container],
        volumes=[{"name": "data", "emptyDir": {}}],
        securityContext={"runAsUser": 1234, "runAsGroup": 2345, "fsGroup": 3456},
        restartPolicy="Never",
    )
    ns.wait_phase("user", "Succeeded", "Failed")
    out = ns.logs("user").split()
    assert out[0] == "1234"
    assert "2345" in out[1:3] and "3456" in out[1:4]
    assert out[-3:] == ["3456", "3456", "py-ok"]


# -------------------------------------------------------------------------------------- probes
def test_readiness_follows_its_probe_and_a_failing_liveness_probe_restarts(
    agent_bed: harness.AgentHarness, pod_namespace: Namespace
) -> None:
    ns = pod_namespace
    container = {
        **_sh("main", "while true; do sleep 0.2; done"),
        "readinessProbe": {"exec": {"command": ["test", "-e", "/tmp/ready"]}, "periodSeconds": 1},
        "livenessProbe": {
            "exec": {"command": ["sh", "-c", "! test -e /tmp/sick"]},
            "periodSeconds": 1,
            "failureThreshold": 2,
        },
    }
    ns.pod("probed", containers=[container], terminationGracePeriodSeconds=1)
    ns.wait_phase("probed", "Running")
    assert ns.condition("probed", "Ready") == "False"
    agent_bed.control.exec(ns.name, "probed", "main", ["touch", "/tmp/ready"])
    wait_for("Ready after the file appears", lambda: ns.condition("probed", "Ready") == "True")
    assert ns.container_status("probed", "main")["ready"] is True
    agent_bed.control.exec(ns.name, "probed", "main", ["touch", "/tmp/sick"])
    status = ns.wait_container("probed", "main", lambda s: s["restartCount"] >= 1, "a liveness restart")
    killing = ns.wait_events("probed", {"Killing", "Unhealthy"})
    assert "Container main failed liveness probe, will be restarted" in [e["message"] for e in killing]
    assert any(e["message"].startswith("Liveness probe failed") for e in killing)
    # The new run has a fresh /tmp: not ready until the file is made again.
    assert status["ready"] is False


# ------------------------------------------------------------------------------------- deletion
def test_deletion_runs_pre_stop_then_sigterm_and_kills_after_the_grace_period(
    agent_bed: harness.AgentHarness, pod_namespace: Namespace
) -> None:
    ns = pod_namespace
    polite = {
        **_sh("main", "trap 'echo got TERM; cat /tmp/pre-stop; exit 0' TERM; while true; do sleep 0.1; done"),
        "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "echo pre-stop ran > /tmp/pre-stop"]}}},
    }
    stubborn = _sh("main", "trap '' TERM; while true; do sleep 0.1; done")
    ns.pod("polite", containers=[polite], terminationGracePeriodSeconds=10)
    ns.pod("stubborn", containers=[stubborn], terminationGracePeriodSeconds=3)
    polite_pod = ns.wait_phase("polite", "Running")
    ns.wait_phase("stubborn", "Running")
    polite_uid = polite_pod["metadata"]["uid"]
    started = time.monotonic()
    ns.delete("pods/polite")
    ns.delete("pods/stubborn")
    wait_for("polite deleted", lambda: ns.pod_gone("polite"))
    wait_for("stubborn deleted", lambda: ns.pod_gone("stubborn"))
    # The stubborn one ignores SIGTERM, so it can only be gone through SIGKILL after its grace period.
    assert time.monotonic() - started >= 3
    log = agent_bed.state_dir / "pods" / f"{ns.name}_polite_{polite_uid}" / "main" / "0.log"
    assert log.read_text() == "got TERM\npre-stop ran\n"
    ns.wait_events("stubborn", {"Killing"})


# --------------------------------------------------------------------------------- kubelet API
def test_kubectl_logs_serves_previous_runs_and_follows_a_running_container(pod_namespace: Namespace) -> None:
    ns = pod_namespace
    mount = [{"name": "s", "mountPath": "/state"}]
    script = (
        "n=$(cat /state/n 2>/dev/null || echo 0); echo run $n; echo $((n+1)) > /state/n; "
        "[ $n -ge 1 ] && sleep 4; echo end $n; exit 1"
    )
    ns.pod(
        "runs", containers=[_sh("main", script, volumeMounts=mount)], volumes=[{"name": "s", "emptyDir": {}}]
    )
    ns.wait_container(
        "runs", "main", lambda s: s["restartCount"] >= 1 and "running" in s["state"], "the second run"
    )
    assert ns.logs("runs", "--previous") == "run 0\nend 0\n"
    assert ns.logs("runs", "--previous", "--tail=1") == "end 0\n"
    followed = ns.logs("runs", "-f")  # returns when the running container ends
    assert followed == "run 1\nend 1\n"
    ns.pod("fresh", containers=[_sh("main", "sleep 30")])
    ns.wait_phase("fresh", "Running")
    result = ns.plane.kubectl("logs", "-n", ns.name, "fresh", "--previous", check=False)
    assert result.returncode != 0
    assert 'previous terminated container "main" in pod "fresh" not found' in result.stderr


def test_kubectl_exec_runs_in_the_container_with_stdin_and_returns_its_exit_code(
    pod_namespace: Namespace, tmp_path: Path
) -> None:
    ns = pod_namespace
    ns.pod(
        "shell",
        containers=[
            _sh("main", "echo inside > /tmp/marker; sleep 60", env=[{"name": "WHO", "value": "pod-env"}])
        ],
    )
    ns.wait_phase("shell", "Running")
    wait_for(
        "the marker file",
        lambda: (
            ns.plane.kubectl("exec", "-n", ns.name, "shell", "--", "cat", "/tmp/marker", check=False).stdout
            == "inside\n"
        ),
    )
    result = ns.plane.kubectl(
        "exec",
        "-n",
        ns.name,
        "shell",
        "--",
        "sh",
        "-c",
        "echo $WHO $(hostname); echo err >&2; exit 4",
        check=False,
    )
    assert result.stdout == "pod-env shell\n"
    assert "err" in result.stderr
    assert result.returncode == 4
    piped = ns.plane.kubectl(
        "exec", "-i", "-n", ns.name, "shell", "--", "sh", "-c", "tr a-z A-Z", input="over stdin\n"
    )
    assert piped.stdout == "OVER STDIN\n"
    source = tmp_path / "copied.txt"
    source.write_text("through kubectl cp\n")
    ns.plane.kubectl("cp", str(source), f"{ns.name}/shell:/tmp/copied.txt")  # tar over exec stdin
    copied = ns.plane.kubectl("exec", "-n", ns.name, "shell", "--", "cat", "/tmp/copied.txt")
    assert copied.stdout == "through kubectl cp\n"


def test_kubectl_exec_with_a_terminal_gives_the_command_a_tty(pod_namespace: Namespace) -> None:
    ns = pod_namespace
    ns.pod("term", containers=[_sh("main", "sleep 60")])
    ns.wait_phase("term", "Running")
    # kubectl asks for a terminal only when its own stdin is one: give it a pseudo-terminal.
    master, slave = pty.openpty()
    try:
        result = subprocess.run(
            [
                str(ns.plane.assets.kubectl),
                "exec",
                "-it",
                "-n",
                ns.name,
                "term",
                "--",
                "sh",
                "-c",
                "tty; stty size",
            ],
            env=ns.plane.tool_env(),
            stdin=slave,
            capture_output=True,
            timeout=60,
        )
    finally:
        os.close(slave)
        os.close(master)
    lines = result.stdout.decode().replace("\r", "").splitlines()
    assert result.returncode == 0, result.stderr
    assert lines[0].startswith("/dev/pts/")
    assert len(lines[1].split()) == 2  # rows and columns of the (resizable) terminal


# ----------------------------------------------------------------------------------- node loss
def test_a_lost_node_goes_unknown_and_its_pods_processes_are_gone(
    agent_bed: harness.AgentHarness, pod_namespace: Namespace
) -> None:
    """Runs last in this module: node-b stays lost for the rest of the session."""
    ns = pod_namespace
    ns.pod("doomed", containers=[_sh("main", "sleep 600")], node="node-b")
    ns.wait_phase("doomed", "Running")
    described = next(p for p in agent_bed.control.pods() if p["name"] == "doomed")
    pids = described["containers"]["main"]["pids"]
    assert pids
    agent_bed.control.lose_node("node-b")
    assert not [pid for pid in pids if kit.process_alive(pid)]

    def ready_status() -> str:
        _, node = ns.request("GET", "/api/v1/nodes/node-b")
        return str(next(c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"))

    wait_for("NodeReady Unknown", lambda: ready_status() == "Unknown", timeout_s=60)
    # The API still has the pod (nobody told the apiserver); the node-lifecycle controller marks it not ready.
    wait_for("the pod marked not Ready", lambda: ns.condition("doomed", "Ready") == "False", timeout_s=30)
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert described["uid"].replace("-", "")[:8] not in netns


# ------------------------------------------------------------------------ more of the pod contract
def test_configmap_volume_updates_reach_a_running_container(pod_namespace: Namespace) -> None:
    ns = pod_namespace
    ns.create("configmaps", {"metadata": {"name": "live"}, "data": {"value": "one"}})
    mount = [{"name": "cfg", "mountPath": "/etc/live"}]
    script = "while true; do cat /etc/live/value; echo; sleep 0.3; done"
    ns.pod(
        "watcher",
        containers=[_sh("main", script, volumeMounts=mount)],
        volumes=[{"name": "cfg", "configMap": {"name": "live"}}],
    )
    # kubectl logs fails (exit 1) until the container has started: wait for it first (CI of the dev box,
    # 2026-11-29, read the logs while the agent was still starting the pod).
    ns.wait_phase("watcher", "Running")
    wait_for("the first value", lambda: "one" in ns.logs("watcher"))
    status, answer = ns.request(
        "PUT", ns.path("configmaps/live"), {"metadata": {"name": "live"}, "data": {"value": "two"}}
    )
    assert status == 200, answer
    wait_for("the updated value in the running container", lambda: "two" in ns.logs("watcher"), timeout_s=60)
    assert ns.container_status("watcher", "main")["restartCount"] == 0


def test_post_start_hook_runs_inside_the_started_container(pod_namespace: Namespace) -> None:
    ns = pod_namespace
    container = {
        **_sh("main", "while [ ! -e /tmp/post-started ]; do sleep 0.1; done; cat /tmp/post-started"),
        "lifecycle": {
            "postStart": {"exec": {"command": ["sh", "-c", "echo hook saw $(hostname) > /tmp/post-started"]}}
        },
    }
    ns.pod("hooked", containers=[container], restartPolicy="Never")
    ns.wait_phase("hooked", "Succeeded")
    assert ns.logs("hooked") == "hook saw hooked\n"


def test_read_only_root_filesystem_leaves_tmp_and_volumes_writable(pod_namespace: Namespace) -> None:
    ns = pod_namespace
    script = (
        "touch /etc/should-fail 2>/dev/null && echo root-writable || echo root-read-only; "
        "touch /tmp/ok && echo tmp-writable; touch /data/ok && echo volume-writable"
    )
    container = {
        **_sh("main", script, volumeMounts=[{"name": "data", "mountPath": "/data"}]),
        "securityContext": {"readOnlyRootFilesystem": True},
    }
    ns.pod("ro", containers=[container], volumes=[{"name": "data", "emptyDir": {}}], restartPolicy="Never")
    ns.wait_phase("ro", "Succeeded")
    assert ns.logs("ro") == "root-read-only\ntmp-writable\nvolume-writable\n"
    assert not os.path.exists("/etc/should-fail")


def test_host_network_pod_uses_the_node_address_and_hostname(
    agent_bed: harness.AgentHarness, pod_namespace: Namespace
) -> None:
    ns = pod_namespace
    assert agent_bed.bed is not None
    ns.pod(
        "hostnet",
        containers=[_sh("main", "hostname; ip -4 -o addr show eth0")],
        hostNetwork=True,
        restartPolicy="Never",
    )
    pod = ns.wait_phase("hostnet", "Succeeded")
    assert pod["status"]["podIP"] == pod["status"]["hostIP"] == agent_bed.bed.node_ip
    hostname, address = ns.logs("hostnet").splitlines()
    assert hostname == "node-a"
    assert f"{agent_bed.bed.node_ip}/24" in address
