"""Node objects the agent plays: registration, the Lease heartbeat, NodeReady, and node loss.

Owns, per node, what the kubelet's node status manager and lease controller do: create the Node (or take
over an existing one of that name) with labels (``kubernetes.io/hostname``, os, arch, the configured
ones), taints, ``podCIDR``, capacity = allocatable (cpu, memory, pods, ephemeral-storage, optionally
``nvidia.com/gpu`` for scheduling only), addresses (the bed's node IP and the hostname), the kubelet
endpoint port, nodeInfo and ``declaredFeatures``; renew ``kube-node-lease/<node>`` every quarter of its
duration (40 s by default); re-post NodeReady and the pressure conditions every 60 s with fresh
heartbeats. :meth:`NodeHeartbeat.lose` stops both, so the node-lifecycle controller marks the node
Unknown exactly as after a real node failure.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import platform
import threading
from pathlib import Path
from typing import Any

from . import kube

log = logging.getLogger(__name__)
JSON = dict[str, Any]

#: The kubelet's defaults: a 40 s lease renewed every quarter of it; status re-posted every minute.
LEASE_DURATION_S = 40
STATUS_REPORT_S = 60.0
KUBELET_VERSION = "v1.37.2"
RUNTIME_VERSION = "nodeagent://0.1.0"


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeConfig:
    name: str
    capacity: dict[str, str]
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    taints: tuple[JSON, ...] = ()

    @classmethod
    def from_json(cls, raw: JSON) -> NodeConfig:
        unknown = set(raw) - {"name", "capacity", "labels", "taints"}
        if unknown:
            raise ValueError(f"node {raw.get('name')!r}: unknown keys {sorted(unknown)}")
        capacity = {**default_capacity(), **{k: str(v) for k, v in (raw.get("capacity") or {}).items()}}
        return cls(
            name=str(raw["name"]),
            capacity=capacity,
            labels={str(k): str(v) for k, v in (raw.get("labels") or {}).items()},
            taints=tuple(raw.get("taints") or ()),
        )


def default_capacity(state_dir: Path | None = None) -> dict[str, str]:
    """This machine's CPUs, memory and disk, and the kubelet's default 110 pods."""
    mem_kib = 0
    with open("/proc/meminfo") as file:
        for line in file:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    stats = os.statvfs(state_dir or "/")
    return {
        "cpu": str(os.cpu_count() or 1),
        "memory": f"{mem_kib}Ki",
        "pods": "110",
        "ephemeral-storage": f"{stats.f_blocks * stats.f_frsize // 1024}Ki",
    }


def load_node_configs(*, names: str | None, config_file: Path | None) -> list[NodeConfig]:
    if config_file is not None:
        raw = json.loads(config_file.read_text())
        return [NodeConfig.from_json(entry) for entry in raw["nodes"]]
    if not names:
        raise ValueError("give --nodes NAME[,NAME...] or --node-config FILE")
    return [
        NodeConfig(name=name.strip(), capacity=default_capacity())
        for name in names.split(",")
        if name.strip()
    ]


def _read(path: str, default: str) -> str:
    try:
        return Path(path).read_text().strip() or default
    except OSError:
        return default


def _os_image() -> str:
    for line in _read("/etc/os-release", "").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return "Linux"


def _condition(kind: str, status: str, reason: str, message: str, now: str) -> JSON:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }


class NodeHeartbeat(threading.Thread):
    """Registers one node, then keeps its Lease and status fresh until stopped or lost."""

    def __init__(
        self,
        config: NodeConfig,
        *,
        client: kube.KubeClient,
        node_ip: str,
        pod_cidr: str,
        kubelet_port: int,
        lease_duration_s: int = LEASE_DURATION_S,
    ) -> None:
        super().__init__(name=f"node-{config.name}", daemon=True)
        self.config = config
        self.client = client
        self.node_ip = node_ip
        self.pod_cidr = pod_cidr
        self.kubelet_port = kubelet_port
        self.lease_duration_s = lease_duration_s
        self._stop_event = threading.Event()
        self.lost = threading.Event()
        self._ready_since: str | None = None
        self.uid = ""

    @property
    def allocatable(self) -> dict[str, str]:
        return dict(self.config.capacity)

    def labels(self) -> dict[str, str]:
        return {
            "kubernetes.io/hostname": self.config.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": "amd64",
            **self.config.labels,
        }

    def status(self) -> JSON:
        now = kube.now_rfc3339()
        self._ready_since = self._ready_since or now
        conditions = [
            _condition(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
                now,
            ),
            _condition(
                "DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure", now
            ),
            _condition(
                "PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available", now
            ),
            _condition("Ready", "True", "KubeletReady", "kubelet is posting ready status", now),
        ]
        conditions[-1]["lastTransitionTime"] = self._ready_since
        return {
            "capacity": dict(self.config.capacity),
            "allocatable": self.allocatable,
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": self.node_ip},
                {"type": "Hostname", "address": self.config.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet_port}},
            # The apiserver then forwards kubectl's WebSocket exec streams untranslated (kubelet_api.py).
            "declaredFeatures": ["ExtendWebSocketsToKubelet"],
            "nodeInfo": {
                "machineID": _read("/etc/machine-id", self.config.name),
                "systemUUID": self.config.name,
                "bootID": _read("/proc/sys/kernel/random/boot_id", ""),
                "kernelVersion": platform.release(),
                "osImage": _os_image(),
                "containerRuntimeVersion": RUNTIME_VERSION,
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    def register(self) -> None:
        """Create the Node (or adopt an existing one of this name) and post its status once."""
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.config.name, "labels": self.labels()},
            "spec": {
                "podCIDR": self.pod_cidr,
                "podCIDRs": [self.pod_cidr],
                "taints": list(self.config.taints),
            },
        }
        try:
            node = self.client.create("/api/v1/nodes", body)
        except kube.ApiError as error:
            if error.status != 409:
                raise
            node = self.client.strategic_patch(
                f"/api/v1/nodes/{self.config.name}", {"metadata": {"labels": self.labels()}}
            )
        self.uid = node["metadata"]["uid"]
        self._post_status()
        self._renew_lease()

    def _post_status(self) -> None:
        self.client.strategic_patch(f"/api/v1/nodes/{self.config.name}/status", {"status": self.status()})

    def _renew_lease(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.config.name}"
        spec = {
            "holderIdentity": self.config.name,
            "leaseDurationSeconds": self.lease_duration_s,
            "renewTime": kube.micro_time(),
        }
        try:
            self.client.merge_patch(path, {"spec": spec})
        except kube.ApiError as error:
            if error.status != 404:
                raise
            self.client.create(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                {
                    "metadata": {
                        "name": self.config.name,
                        "namespace": "kube-node-lease",
                        "ownerReferences": [
                            {"apiVersion": "v1", "kind": "Node", "name": self.config.name, "uid": self.uid}
                        ],
                    },
                    "spec": spec,
                },
            )

    def run(self) -> None:
        renew_s = self.lease_duration_s / 4
        next_status = 0.0
        elapsed = 0.0
        while not self._stop_event.wait(renew_s):
            if self.lost.is_set():
                return
            elapsed += renew_s
            try:
                self._renew_lease()
                if elapsed >= next_status:
                    self._post_status()
                    next_status = elapsed + STATUS_REPORT_S
            except Exception as error:  # the apiserver restarting: try again at the next beat
                log.warning("node %s heartbeat: %s", self.config.name, error)

    def stop(self) -> None:
        self._stop_event.set()

    def lose(self) -> None:
        """Stop heartbeats for good, as if the machine had gone."""
        self.lost.set()
        self._stop_event.set()
