"""Installing trainop as a user does: ``helm install charts/trainop``, then the operator it deploys.

On a real cluster the chart's Deployment runs the operator (image from ``E2E_OPERATOR_IMAGE``) and this
module waits for its rollout. On the local control plane no pod can run, so the operator runs here as a
process that is as close to that pod as a process gets:

- the **command and arguments of the chart's rendered Deployment** (``helm get manifest``), with only the
  two ports replaced by free ones (several test sessions may share this machine);
- the Deployment's environment (``fieldRef`` values filled in as the kubelet would);
- the **chart's ServiceAccount**: a TokenRequest token (``kubectl create token``), in a kubeconfig with no
  other credential, so the operator has exactly the chart's RBAC, no more.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from e2e import cluster as cluster_module
from tests.controlplane import processes

CHART = cluster_module.REPO_ROOT / "charts" / "trainop"
RELEASE = "trainop"
NAMESPACE = "trainop-system"
OPERATOR_IMAGE_ENV = "E2E_OPERATOR_IMAGE"  # repository:tag of the operator image, for real clusters
CRDS = ("trainingjobs.trainop.dev", "tuningsweeps.trainop.dev")


@dataclasses.dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    deployment: dict[str, Any]

    @property
    def service_account(self) -> str:
        return str(self.deployment["spec"]["template"]["spec"]["serviceAccountName"])

    @property
    def container(self) -> dict[str, Any]:
        containers: list[dict[str, Any]] = self.deployment["spec"]["template"]["spec"]["containers"]
        return containers[0]


def helm_install(cluster: cluster_module.Cluster) -> Release:
    """``helm upgrade --install`` of the chart into trainop-system; CRDs Established; the rendered release."""
    values: list[str] = []
    image = os.environ.get(OPERATOR_IMAGE_ENV, "")
    if image:
        repository, _, tag = image.rpartition(":")
        values += ["--set", f"image.repository={repository}", "--set", f"image.tag={tag}"]
    cluster.helm(
        "upgrade", "--install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace", *values
    )
    for crd in CRDS:
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
    manifest = cluster.helm("get", "manifest", RELEASE, "--namespace", NAMESPACE).stdout
    deployments = [doc for doc in yaml.safe_load_all(manifest) if doc and doc.get("kind") == "Deployment"]
    assert len(deployments) == 1, f"the chart renders {len(deployments)} Deployments, expected 1"
    return Release(name=RELEASE, namespace=NAMESPACE, deployment=deployments[0])


def wait_for_rollout(cluster: cluster_module.Cluster, release: Release, timeout_s: int = 300) -> None:
    name = release.deployment["metadata"]["name"]
    cluster.kubectl(
        "rollout",
        "status",
        f"deployment/{name}",
        "-n",
        release.namespace,
        f"--timeout={timeout_s}s",
        timeout_s=timeout_s + 30,
    )


class OperatorProcess:
    """The chart's operator container, run here as a process with the chart ServiceAccount's token."""

    def __init__(self, *, cluster: cluster_module.Cluster, release: Release, work_dir: Path) -> None:
        self.cluster = cluster
        self.release = release
        self.work_dir = work_dir
        self.process: processes.ManagedProcess | None = None
        self.liveness_port = 0
        self.metrics_port = 0

    def argv(self) -> list[str]:
        container = self.release.container
        command = [*container.get("command", []), *container.get("args", [])]
        binary = Path(sys.executable).parent / command[0]  # the image's `trainop` is this venv's
        ports = {"--liveness-port": self.liveness_port, "--metrics-port": self.metrics_port}
        args = []
        for arg in command[1:]:
            flag = arg.partition("=")[0]
            args.append(f"{flag}={ports[flag]}" if flag in ports else arg)
        return [str(binary), *args]

    def env(self, kubeconfig: Path) -> dict[str, str]:
        field_values = {
            "metadata.name": "trainop-e2e-local",
            "metadata.namespace": self.release.namespace,
        }
        env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "KUBECONFIG")}
        for variable in self.release.container.get("env", []):
            if "value" in variable:
                env[variable["name"]] = str(variable["value"])
            else:
                env[variable["name"]] = field_values[variable["valueFrom"]["fieldRef"]["fieldPath"]]
        env["HOME"] = str(self.work_dir)  # the pod's HOME is /tmp; keep this process's files together
        env["KUBECONFIG"] = str(kubeconfig)
        return env

    def start(self, timeout_s: float = 60) -> None:
        self.liveness_port = processes.free_loopback_port()
        self.metrics_port = processes.free_loopback_port()
        token = self.cluster.create_token(self.release.namespace, self.release.service_account)
        kubeconfig = self.cluster.kubeconfig_for_token(
            token, namespace=self.release.namespace, path=self.work_dir / "operator.kubeconfig"
        )
        self.process = processes.ManagedProcess.start(
            name="trainop-operator",
            argv=self.argv(),
            log_path=self.work_dir / "operator.log",
            env=self.env(kubeconfig),
        )
        self.process.wait_healthy(self._healthy, timeout_s=timeout_s, interval_s=0.2)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=2) as r:
                return int(r.status) == 200
        except OSError:
            return False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.is_running()

    def log_tail(self, num_lines: int = 60) -> str:
        return self.process.log_tail(num_lines=num_lines) if self.process else "(not started)"

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace_s=10)
