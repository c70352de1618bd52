"""Installing trainop as a user does: ``helm install charts/trainop``, then the operator it deploys.

On every cluster the chart's Deployment runs the operator, and this module waits for its rollout: on a real
cluster from ``E2E_OPERATOR_IMAGE``, on the local cluster bed as a pod of the node agent, whose image map
points the chart's default image at this checkout (its command, arguments, ServiceAccount token, probes
and security context are the chart's; docs/nodeagent.md says what the agent honours).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import yaml

from e2e import cluster as cluster_module

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
    """``kubectl rollout status`` of the operator's Deployment: its pod is Ready (its /healthz answers)."""
    name = release.deployment["metadata"]["name"]
    rollout = cluster.kubectl(
        "rollout",
        "status",
        f"deployment/{name}",
        "-n",
        release.namespace,
        f"--timeout={timeout_s}s",
        timeout_s=timeout_s + 30,
        check=False,
    )
    if rollout.returncode != 0:
        # What the pod did, in the failure itself (the bed is gone by the time anyone reads the report).
        pods = cluster.kubectl("describe", "pods", "-n", release.namespace, check=False)
        raise AssertionError(
            f"the operator's Deployment {release.namespace}/{name} did not roll out in {timeout_s} s:\n"
            f"{rollout.stdout}{rollout.stderr}\n$ kubectl describe pods -n {release.namespace}\n"
            f"{pods.stdout}{pods.stderr}\n$ kubectl logs deployment/{name} --tail=40\n"
            + operator_log_tail(cluster, release, 40)
        )


def operator_log_tail(cluster: cluster_module.Cluster, release: Release, num_lines: int = 60) -> str:
    """The operator pod's last lines (``kubectl logs deploy/...``), for a failed scenario's report."""
    name = release.deployment["metadata"]["name"]
    result = cluster.kubectl(
        "logs", f"deployment/{name}", "-n", release.namespace, f"--tail={num_lines}", check=False
    )
    return result.stdout or result.stderr
