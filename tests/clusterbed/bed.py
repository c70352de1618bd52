"""A Kubernetes cluster whose pods run: the control plane plus everything a node and its add-ons add.

``ClusterBed`` composes, in start order:

1. the bed's network (``network.BedNetwork``: a netns per bed and per pod, a bridge, routes);
2. the control plane of ``tests.controlplane`` with the apiserver on the bed's root address (so pods reach
   it through the ``kubernetes`` Service), kubelet client credentials (``kubectl logs``/``exec``), the
   NodeRestriction admission plugin, and kube-controller-manager running **every** default controller
   (Deployments, ReplicaSets, Jobs, EndpointSlices, PV binding, claim protection, node lifecycle, pod GC…);
3. kube-scheduler (real binding decisions: resources, selectors, taints, volume topology);
4. the node-local volume provisioner (``provisioner``: the default StorageClass);
5. the node agent (``tests.nodeagent``: the one declared stand-in, kubelet + container runtime);
6. kube-proxy in the bed netns (iptables mode: Service ClusterIPs, the ``kubernetes`` Service included),
   once the agent has registered the Node it runs for;
7. add-ons applied as a cluster admin would: CoreDNS (``addons/coredns.yaml``) and KubeRay from its own
   kustomize install (``config/default``: its CRDs, RBAC and the controller's Deployment).

Every binary is the real one, built from its Go module by ``tests/controlplane/build.sh`` and found through
``assets``; the pods of CoreDNS, KubeRay, the trainop operator and the Ray clusters are real pods, scheduled
by the scheduler and run by the node agent with the images of ``images``. Nothing here writes status a real
controller would write.

It must not know about trainop: installing the chart and running jobs is the e2e tier's business.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import ssl
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import kubernetes

from tests.clusterbed import assets as bed_assets
from tests.clusterbed import images, network, provisioner
from tests.controlplane import assets as assets_module
from tests.controlplane import cluster as controlplane
from tests.controlplane import kubeconfig, pki, processes
from tests.nodeagent import control, harness

ADDONS_DIR = Path(__file__).resolve().parent / "addons"
#: The kube-dns Service's ClusterIP (addons/coredns.yaml); the node agent writes it into pods' resolv.conf.
CLUSTER_DNS_IP = "10.0.0.10"
CLUSTER_DOMAIN = "cluster.local"
#: kube-controller-manager: every controller on by default, as a kubeadm cluster runs it.
BED_CONTROLLERS = ("*",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeSpec:
    """One node the agent registers: its name, what the scheduler may place on it, labels and taints.

    Capacity is what the scheduler sees, not what this 2-core machine has: the pods' processes share the
    machine's real CPUs (memory limits are real cgroup limits)."""

    name: str
    cpu: str = "16"
    memory: str = "64Gi"
    pods: int = 110
    gpus: int = 0
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    taints: tuple[dict[str, str], ...] = ()

    def to_config(self) -> dict[str, Any]:
        capacity: dict[str, str] = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.pods)}
        if self.gpus:
            capacity["nvidia.com/gpu"] = str(self.gpus)
        return {"name": self.name, "capacity": capacity, "labels": self.labels, "taints": list(self.taints)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class BedSettings:
    nodes: Sequence[NodeSpec] = (NodeSpec(name="node-a"),)
    #: CRDs installed at start (ours for the operator tier; none for e2e, where helm installs them).
    crd_paths: Sequence[Path] = ()
    install_kuberay: bool = True
    install_coredns: bool = True
    extra_apiserver_args: Sequence[str] = ()
    keep_data_dir: bool = False
    start_timeout_s: float = 180.0


class BedFailed(RuntimeError):
    """A component of the bed did not come up; the message names it and carries its log tail."""


class ClusterBed:
    """The whole cluster; ``harness`` (``tests.nodeagent.harness``) owns the network, the control plane and
    the node agent, this class adds the scheduler, kube-proxy, the provisioner and the add-ons."""

    def __init__(
        self,
        *,
        assets: assets_module.Assets,
        extra: bed_assets.BedAssets,
        settings: BedSettings | None = None,
    ) -> None:
        self.assets = assets
        self.extra = extra
        self.settings = settings or BedSettings()
        self.harness = harness.AgentHarness(
            assets=assets,
            settings=harness.HarnessSettings(
                nodes=[node.to_config() for node in self.settings.nodes],
                images=images.image_map(extra=extra)["images"],
                controllers=BED_CONTROLLERS,
                extra_apiserver_args=tuple(self.settings.extra_apiserver_args),
                crd_paths=tuple(self.settings.crd_paths),
                keep_data_dir=self.settings.keep_data_dir,
                # Short enough that a lost node shows in seconds, long enough for 2 busy cores.
                lease_duration_s=20,
                node_monitor_grace_period_s=20,
            ),
        )
        self._processes: dict[str, processes.ManagedProcess] = {}
        #: Seconds since start when each part was ready, for docs/e2e.md's start-up figures.
        self.timings: dict[str, float] = {}

    # ------------------------------------------------------------------------------------ lifecycle
    def __enter__(self) -> ClusterBed:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def plane(self) -> controlplane.ControlPlane:
        assert self.harness.plane is not None, "bed not started"
        return self.harness.plane

    @property
    def network(self) -> network.BedNetwork:
        assert self.harness.bed is not None, "bed not started"
        return self.harness.bed

    @property
    def control(self) -> control.AgentControl:
        """The node agent's test hooks (kill a container, freeze a process, lose a node)."""
        return self.harness.control

    def start(self) -> None:
        started = time.monotonic()

        def mark(what: str) -> None:
            self.timings[what] = round(time.monotonic() - started, 2)

        try:
            self.harness.start()  # network, control plane, node agent (nodes registered)
            mark("control plane + node agent")
            self._start_scheduler()
            mark("kube-scheduler")
            self._start_provisioner()
            self._wait_nodes_ready()
            mark("nodes Ready")
            # kube-proxy waits for its Node's addresses before it programs anything (30 s otherwise).
            self._start_kube_proxy()
            mark("kube-proxy")
            if self.settings.install_coredns:
                self.kubectl("apply", "--server-side", "-f", str(ADDONS_DIR / "coredns.yaml"))
            if self.settings.install_kuberay:
                self.kubectl(
                    "apply", "--server-side", "-k", str(self.extra.kuberay_config / "default"), timeout_s=120
                )
            if self.settings.install_coredns:
                self._wait_rollout("kube-system", "coredns")
                mark("CoreDNS ready")
            if self.settings.install_kuberay:
                self._wait_rollout("default", "kuberay-operator")
                mark("KubeRay ready")
        except BaseException:
            self.stop()
            raise
        mark("total")

    def stop(self) -> None:
        """The add-on processes, then the harness (node agent: every pod; control plane; network)."""
        for name in ("provisioner", "kube-proxy", "kube-scheduler"):
            if (process := self._processes.pop(name, None)) is not None:
                process.stop(grace_s=10)
        self.harness.stop()

    # ----------------------------------------------------------------------------------- components
    @property
    def data_dir(self) -> Path:
        return self.plane.data_dir

    def _log_path(self, name: str) -> Path:
        return self.data_dir / "logs" / f"{name}.log"

    def _kubeconfig_for(self, stem: str, common_name: str) -> Path:
        pair = pki.issue_client_cert(
            self.plane.pki, self.data_dir / "pki", stem=stem, common_name=common_name
        )
        return kubeconfig.write(
            self.data_dir / f"{stem}.kubeconfig",
            server=self.plane.server_url,
            ca_cert_path=self.plane.pki.ca_cert_path,
            client_cert_path=pair.cert_path,
            client_key_path=pair.key_path,
            user=common_name,
        )

    def _start_scheduler(self) -> None:
        config = self._kubeconfig_for("scheduler", "system:kube-scheduler")
        port = processes.free_loopback_port()
        process = processes.ManagedProcess.start(
            name="kube-scheduler",
            argv=[
                str(self.extra.kube_scheduler),
                f"--kubeconfig={config}",
                # No delegated authn/z for its own port: /healthz is always allowed, and nothing else is
                # asked of it on loopback.
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.data_dir / 'scheduler-certs'}",
            ],
            log_path=self._log_path("kube-scheduler"),
        )
        self._processes["kube-scheduler"] = process
        insecure = _insecure_context()
        process.wait_healthy(
            lambda: (
                processes.https_status(f"https://127.0.0.1:{port}/healthz", ssl_context=insecure)[0] == 200
            ),
            timeout_s=self.settings.start_timeout_s,
            what="did not become healthy",
        )

    def _start_kube_proxy(self) -> None:
        config = self._kubeconfig_for("kube-proxy", "system:kube-proxy")
        node_ip = self.network.node_ip
        healthz, metrics = processes.free_loopback_ports(2)
        process = processes.ManagedProcess.start(
            name="kube-proxy",
            argv=self.network.bed_netns_argv(
                [
                    str(self.extra.kube_proxy),
                    f"--kubeconfig={config}",
                    "--proxy-mode=iptables",
                    f"--cluster-cidr={self.network.pod_cidr}",
                    # Every node shares the bed netns, so one kube-proxy programs it, as the first node's.
                    f"--hostname-override={self.settings.nodes[0].name}",
                    f"--bind-address={node_ip}",
                    f"--healthz-bind-address={node_ip}:{healthz}",
                    f"--metrics-bind-address={node_ip}:{metrics}",
                    # Leave the VM kernel's conntrack table size alone (it is not ours to resize).
                    "--conntrack-max-per-core=0",
                    # NodePorts only on the node's own address, not on every address of the bed netns.
                    "--nodeport-addresses=primary",
                ]
            ),
            log_path=self._log_path("kube-proxy"),
        )
        self._processes["kube-proxy"] = process
        # /healthz answers 503 until the first sync of Services and EndpointSlices into iptables.
        process.wait_healthy(
            lambda: processes.http_ok(f"http://{node_ip}:{healthz}/healthz"),
            timeout_s=self.settings.start_timeout_s,
            what="did not sync its rules",
        )

    def _start_provisioner(self) -> None:
        self.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(provisioner.storage_class()))
        self._processes["provisioner"] = processes.ManagedProcess.start(
            name="provisioner",
            argv=[
                sys.executable,
                "-m",
                "tests.clusterbed.provisioner",
                f"--kubeconfig={self.plane.kubeconfig_path}",
                f"--volumes-dir={self.data_dir / 'volumes'}",
            ],
            log_path=self._log_path("provisioner"),
            env={**os.environ, "PYTHONPATH": str(controlplane.REPO_ROOT)},
        )

    # -------------------------------------------------------------------------------------- waiting
    def _wait(self, what: str, ready: Callable[[], bool], *, timeout_s: float | None = None) -> None:
        deadline = time.monotonic() + (timeout_s or self.settings.start_timeout_s)
        while not ready():
            running = dict(self._processes)
            if self.harness.process is not None:
                running["node-agent"] = self.harness.process
            for name, process in running.items():
                if not process.is_running():
                    raise BedFailed(f"{name} exited while waiting for {what}:\n{process.log_tail()}")
            if time.monotonic() > deadline:
                raise BedFailed(f"timed out waiting for {what}\n{self.log_tails()}")
            time.sleep(0.5)

    def _wait_nodes_ready(self) -> None:
        names = {node.name for node in self.settings.nodes}
        core: Any = kubernetes.client.CoreV1Api(self.api_client())

        def ready() -> bool:
            nodes = core.list_node().items
            ok = {
                n.metadata.name
                for n in nodes
                if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or ()))
            }
            return names <= ok

        self._wait(f"nodes {sorted(names)} Ready", ready)

    def _wait_rollout(self, namespace: str, deployment: str) -> None:
        apps: Any = kubernetes.client.AppsV1Api(self.api_client())

        def ready() -> bool:
            with contextlib.suppress(kubernetes.client.ApiException):
                d = apps.read_namespaced_deployment(deployment, namespace)
                return bool(d.status and (d.status.available_replicas or 0) >= (d.spec.replicas or 1))
            return False

        self._wait(f"Deployment {namespace}/{deployment} available", ready)

    # -------------------------------------------------------------------------------------- clients
    def api_client(self) -> kubernetes.client.ApiClient:
        return self.plane.api_client()

    def kubectl(self, *args: str, **kwargs: Any) -> Any:
        return self.plane.kubectl(*args, **kwargs)

    def log_tails(self, *, num_lines: int = 30) -> str:
        parts = [self.plane.log_tails(num_lines=num_lines)] if self.harness.plane is not None else []
        parts.append(f"----- node agent -----\n{self.harness.log_tail(num_lines)}")
        parts += [
            f"----- {name} ({process.log_path}) -----\n{process.log_tail(num_lines=num_lines)}"
            for name, process in self._processes.items()
        ]
        return "\n".join(parts)


def _insecure_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # self-signed serving cert in --cert-dir; loopback only
    return context
