"""A bed for the node agent's own tests: bed network + control plane on it + the agent as a process.

Owns the minimal orchestration the agent's tests need until ``tests/clusterbed`` has the full bed
(scheduler, kube-proxy, CoreDNS, KubeRay): a :class:`network.BedNetwork`; a :class:`cluster.ControlPlane`
bound to the bed's root IP with the apiserver's kubelet client certificate, ``NodeRestriction``, and the
controllers pods and nodes need (root CA publisher for ``kube-root-ca.crt``, node lifecycle, endpoint
slices, PV binder, PVC protection); one client certificate per node (``system:node:<name>`` in
``system:nodes``, so the Node authorizer and NodeRestriction judge the agent as they judge a kubelet)
and a kubelet serving certificate for the node IP; and ``python -m tests.nodeagent`` started with them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.clusterbed import network
from tests.controlplane import assets as assets_module
from tests.controlplane import cluster, flags, kubeconfig, pki, processes

from . import container_cpu, control

REPO_ROOT = Path(__file__).resolve().parents[2]
NODE_CONTROLLERS = (
    *flags.CONTROLLERS,
    "root-ca-certificate-publisher-controller",
    "node-lifecycle-controller",
    "endpointslice-controller",
    "persistentvolume-binder-controller",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class HarnessSettings:
    #: ``{"name": ..., "capacity": {...}, "labels": {...}, "taints": [...]}`` per node.
    nodes: Sequence[Mapping[str, Any]] = ({"name": "node-a"},)
    #: Extra image map entries (``images.py`` format), on top of the default trainop images.
    images: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    backoff_initial_s: float = 10.0
    backoff_max_s: float = 60.0
    #: Short leases and grace period so node loss shows within seconds.
    lease_duration_s: int = 12
    #: Refresh of configMap/secret/projected volumes (the agent's default is 15 s).
    sync_frequency_s: float = 2.0
    node_monitor_grace_period_s: int = 10
    root_dir: Path | None = None
    keep_data_dir: bool = False
    #: kube-controller-manager's controllers (the cluster bed runs every default one).
    controllers: Sequence[str] = NODE_CONTROLLERS
    #: More kube-apiserver flags (the e2e tier's audit log).
    extra_apiserver_args: Sequence[str] = ()
    #: CRDs installed once the apiserver is ready.
    crd_paths: Sequence[Path] = ()


class AgentHarness:
    def __init__(self, *, assets: assets_module.Assets, settings: HarnessSettings) -> None:
        self.assets = assets
        self.settings = settings
        self.bed: network.BedNetwork | None = None
        self.plane: cluster.ControlPlane | None = None
        self.process: processes.ManagedProcess | None = None
        self.state_dir = Path()
        #: Every container run's CPU time, read when the agent stopped (container_cpu.read).
        self.container_cpu: list[container_cpu.Run] = []
        self.images_path = Path()
        self._argv: list[str] = []
        self.control = control.AgentControl(Path("/nonexistent"))

    @property
    def node_names(self) -> list[str]:
        return [str(node["name"]) for node in self.settings.nodes]

    def __enter__(self) -> AgentHarness:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self.bed = network.BedNetwork.create()
        settings = self.settings
        self.plane = cluster.ControlPlane(
            assets=self.assets,
            settings=cluster.ControlPlaneSettings(
                install_kuberay_crds=False,
                crd_paths=settings.crd_paths,
                root_dir=settings.root_dir,
                keep_data_dir=settings.keep_data_dir,
                bind_address=self.bed.apiserver_ip,
                kubelet_client_auth=True,
                controllers=settings.controllers,
                extra_apiserver_args=(
                    "--enable-admission-plugins=NodeRestriction",
                    *settings.extra_apiserver_args,
                ),
                extra_controller_manager_args=(
                    f"--node-monitor-grace-period={settings.node_monitor_grace_period_s}s",
                    "--node-monitor-period=1s",
                ),
            ),
        )
        self.plane.start()
        data = self.plane.data_dir
        credentials = data / "nodeagent-pki"
        for name in self.node_names:
            pair = pki.issue_client_cert(
                self.plane.pki,
                credentials,
                stem=f"node-{name}",
                common_name=f"system:node:{name}",
                organizations=("system:nodes",),
            )
            kubeconfig.write(
                credentials / f"{name}.kubeconfig",
                server=self.plane.server_url,
                ca_cert_path=self.plane.pki.ca_cert_path,
                client_cert_path=pair.cert_path,
                client_key_path=pair.key_path,
                user=f"system:node:{name}",
            )
        serving = pki.issue_serving_cert(
            self.plane.pki, credentials, stem="kubelet", common_name="nodeagent", ips=(self.bed.node_ip,)
        )
        self.state_dir = data / "nodeagent"
        self.state_dir.mkdir()
        node_config = data / "nodeagent-nodes.json"
        node_config.write_text(json.dumps({"nodes": list(settings.nodes)}))
        self.images_path = data / "nodeagent-images.json"
        self.write_images(settings.images)
        argv = [
            sys.executable,
            "-m",
            "tests.nodeagent",
            f"--kubeconfig={credentials}/{{node}}.kubeconfig",
            f"--bed-id={self.bed.bed_id}",
            f"--node-config={node_config}",
            f"--state-dir={self.state_dir}",
            f"--images={self.images_path}",
            f"--tls-cert-file={serving.cert_path}",
            f"--tls-private-key-file={serving.key_path}",
            f"--client-ca-file={self.plane.pki.ca_cert_path}",
            f"--backoff-initial={settings.backoff_initial_s}",
            f"--backoff-max={settings.backoff_max_s}",
            f"--lease-duration={settings.lease_duration_s}",
            f"--sync-frequency={settings.sync_frequency_s}",
        ]
        self._argv = argv
        self.control = control.AgentControl(self.state_dir / "control.sock")
        self.start_agent()

    def start_agent(self) -> None:
        """Start (or start again, on the same state dir and bed) the agent process; wait until it serves."""
        assert self.plane is not None
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        self.process = processes.ManagedProcess.start(
            name="nodeagent",
            argv=self._argv,
            log_path=self.plane.data_dir / "logs" / "nodeagent.log",
            env=env,
        )
        self.process.wait_healthy(self.control.healthy, timeout_s=60, what="did not become ready")

    def kill_agent(self) -> None:
        """SIGKILL the agent, as a crash would: it cleans up nothing."""
        assert self.process is not None
        self.process.popen.kill()
        self.process.popen.wait()
        self.process = None

    def write_images(self, images: Mapping[str, Mapping[str, Any]]) -> None:
        """Replace the extra image map entries (the agent re-reads the file on its next image lookup)."""
        self.images_path.write_text(json.dumps({"images": dict(images)}))
        # mtime granularity: make sure a rewrite within the same tick is still seen as a change
        stamp = time.time()
        os.utime(self.images_path, (stamp, stamp))

    def log_tail(self, num_lines: int = 60) -> str:
        return self.process.log_tail(num_lines=num_lines) if self.process is not None else ""

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace_s=60)  # every pod's containers end here: each run's CPU time is logged
            self.process = None
            self.container_cpu = container_cpu.read(self.state_dir / container_cpu.LOG_NAME)
        if self.plane is not None:
            self.plane.stop()
            self.plane = None
        if self.bed is not None:
            self.bed.destroy()
            self.bed = None
