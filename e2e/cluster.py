"""The cluster the scenarios run against, and the user's tools for it (kubectl, helm).

Two kinds, one interface (:class:`Cluster`):

- :class:`LocalCluster` (the default, CI): the cluster bed of ``tests/clusterbed`` -- etcd, kube-apiserver,
  kube-controller-manager, kube-scheduler, kube-proxy, CoreDNS and **KubeRay's own controller** (installed
  from its kustomize manifests), with pods run by the node agent on two nodes. Our CRDs are absent: the
  scenarios install them with ``helm install``, as a user does. The apiserver writes an audit log of every
  status write to our resources (``audit.POLICY``), which is how a scenario proves *who* wrote a status field.
- :class:`RealCluster` (``E2E_REAL_CLUSTER=1``): whatever ``$KUBECONFIG`` points at, with KubeRay installed;
  kubectl and helm from ``$PATH`` (falling back to the ones built for the control plane). No audit log.

Both are driven the same way from here on: ``helm install``, the chart's Deployment rolls out, faults go
through ``kubectl exec`` and ``kubectl delete pod``. This module starts and stops the local cluster; it runs
no trainop component.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from e2e import audit
from tests.clusterbed import assets as bed_assets
from tests.clusterbed import bed as bed_module
from tests.controlplane import assets as assets_module

REPO_ROOT = Path(__file__).resolve().parents[1]
REAL_CLUSTER_ENV = "E2E_REAL_CLUSTER"


#: The node pool of the node-loss scenario (e2e/test_storage.py): nodes of its own, tainted so that no other
#: scenario's pod lands there (losing one harms nobody else), each with room for one of its 3-CPU workers
#: only, so that its two workers run on two nodes and, after one node is lost, fit on the two others.
POOL_LABEL = "e2e.trainop.dev/pool"
POOL = "storage"
POOL_NODES = tuple(
    bed_module.NodeSpec(
        name=f"pool-{i}",
        cpu="4",
        memory="16Gi",
        labels={POOL_LABEL: POOL},
        taints=({"key": POOL_LABEL, "value": POOL, "effect": "NoSchedule"},),
    )
    for i in (1, 2, 3)
)


def real_cluster_requested() -> bool:
    return os.environ.get(REAL_CLUSTER_ENV, "") not in ("", "0", "false", "False")


class Cluster:
    """What a scenario needs from a cluster: kubectl and helm as a user runs them, and tokens."""

    #: "local" (the cluster bed: real KubeRay, pods on the node agent) or "real" (``$KUBECONFIG``).
    kind: str
    #: The admin kubeconfig: the user's kubectl and helm use it.
    kubeconfig: Path
    kubectl_path: Path
    helm_path: Path
    #: The apiserver's audit log (local only): proof of which identity wrote what.
    audit_log: audit.AuditLog | None = None

    def tool_env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout_s: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return self._run(self.kubectl_path, args, input=input, check=check, timeout_s=timeout_s)

    def kubectl_json(self, *args: str) -> dict[str, Any]:
        result: dict[str, Any] = yaml.safe_load(self.kubectl(*args, "-o", "json").stdout)
        return result

    def kubectl_popen(self, *args: str, stdout: Any = subprocess.PIPE) -> subprocess.Popen[str]:
        """A long-running kubectl (``--watch``); the caller reads stdout and terminates it."""
        return subprocess.Popen(
            [str(self.kubectl_path), *args],
            env=self.tool_env(),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
        )

    def helm(
        self, *args: str, input: str | None = None, check: bool = True, timeout_s: float = 180
    ) -> subprocess.CompletedProcess[str]:
        return self._run(self.helm_path, args, input=input, check=check, timeout_s=timeout_s)

    def create_token(self, namespace: str, service_account: str, *, duration: str = "2h") -> str:
        """A TokenRequest token for a ServiceAccount (``kubectl create token``), as the kubelet gets one."""
        return self.kubectl(
            "create", "token", service_account, "-n", namespace, f"--duration={duration}"
        ).stdout.strip()

    def kubeconfig_for_token(self, token: str, *, namespace: str, path: Path) -> Path:
        """A kubeconfig with the admin's cluster entry and ``token`` as its only credential."""
        admin = yaml.safe_load(self.kubeconfig.read_text())
        context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
        cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [cluster],
            "users": [{"name": "token", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "token",
                    "context": {"cluster": cluster["name"], "user": "token", "namespace": namespace},
                }
            ],
            "current-context": "token",
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as file:
            yaml.safe_dump(config, file, sort_keys=False)
        return path

    def diagnostics(self) -> str:
        """Log tails for a failed scenario's report."""
        return ""

    def close(self) -> None:
        return None

    def _run(
        self, binary: Path, args: Sequence[str], *, input: str | None, check: bool, timeout_s: float
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(binary), *args],
            env=self.tool_env(),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, result.args, result.stdout, result.stderr)
        return result


class LocalCluster(Cluster):
    """The cluster bed (real KubeRay, two nodes on the node agent) with an audit log; our CRDs come from
    ``helm install``."""

    kind = "local"
    #: The bed's nodes: room for every scenario's pods at once, no GPUs (the unschedulable scenario asks
    #: for one), and two of them so the scheduler has a real choice; plus the pool above.
    NODES = (bed_module.NodeSpec(name="node-a"), bed_module.NodeSpec(name="node-b"), *POOL_NODES)

    def __init__(self, *, assets: assets_module.Assets, work_dir: Path) -> None:
        missing = [name for name in ("kubectl", "helm") if getattr(assets, name) is None]
        if missing:
            raise assets_module.AssetsUnavailable(f"no {', '.join(missing)}; {assets_module.HOW_TO_BUILD}")
        assert assets.kubectl is not None and assets.helm is not None
        audit_dir = work_dir / "audit"
        audit_dir.mkdir(parents=True, exist_ok=True)
        policy = audit_dir / "policy.yaml"
        policy.write_text(yaml.safe_dump(audit.POLICY, sort_keys=False))
        log_path = audit_dir / "audit.log"
        settings = bed_module.BedSettings(
            nodes=self.NODES,
            keep_data_dir=os.environ.get("TRAINOP_CONTROLPLANE_KEEP", "") not in ("", "0"),
            extra_apiserver_args=(
                f"--audit-policy-file={policy}",
                f"--audit-log-path={log_path}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
            ),
        )
        self.bed = bed_module.ClusterBed(assets=assets, extra=bed_assets.ensure(), settings=settings)
        self.bed.start()
        self.kubeconfig = self.bed.plane.kubeconfig_path
        self.kubectl_path = assets.kubectl
        self.helm_path = assets.helm
        self.audit_log = audit.AuditLog(log_path)

    def tool_env(self) -> dict[str, str]:
        # kubectl and helm caches inside the control plane's data dir, not under $HOME.
        return self.bed.plane.tool_env()

    def diagnostics(self) -> str:
        return self.bed.log_tails(num_lines=20)

    def close(self) -> None:
        self.bed.stop()


class RealCluster(Cluster):
    """``$KUBECONFIG`` (a kind/k3d/cloud cluster with KubeRay); see docs/real-cluster.md."""

    kind = "real"

    def __init__(self, *, assets: assets_module.Assets | None) -> None:
        kubeconfig = os.environ.get("KUBECONFIG", "")
        if not kubeconfig:
            raise RuntimeError(f"{REAL_CLUSTER_ENV}=1 needs KUBECONFIG pointing at the cluster under test")
        self.kubeconfig = Path(kubeconfig.split(os.pathsep)[0])
        self.kubectl_path = _tool("kubectl", assets.kubectl if assets else None)
        self.helm_path = _tool("helm", assets.helm if assets else None)


def _tool(name: str, fallback: Path | None) -> Path:
    found = shutil.which(name)
    if found:
        return Path(found)
    if fallback is not None:
        return fallback
    raise RuntimeError(f"no {name} on PATH")
