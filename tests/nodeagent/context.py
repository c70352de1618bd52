"""What a pod worker is given by the agent: one node's identity, settings and shared registries.

Owns the small shared pieces with their locks: the per-node pod IP allocator, the Service cache that
service links read, and the settings bundle (:class:`AgentSettings`). Nothing here starts threads or
talks to the apiserver by itself.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path

from tests.clusterbed import network

from . import container_cpu, env, events, images, kube, mountpoints


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentSettings:
    state_dir: Path
    bed: network.BedAddresses
    #: kube-dns ClusterIP written into pods' resolv.conf.
    cluster_dns: str = "10.0.0.10"
    cluster_domain: str = "cluster.local"
    #: CrashLoopBackOff and ImagePullBackOff: first delay, doubling up to the cap (the kubelet's cap is
    #: 300 s; 60 s keeps tests and dev loops short).
    backoff_initial_s: float = 10.0
    backoff_max_s: float = 60.0
    #: How often a running pod's API-data volumes and tokens are refreshed.
    volume_resync_s: float = 15.0

    @property
    def pods_dir(self) -> Path:
        return self.state_dir / "pods"

    @property
    def cpu_log(self) -> Path:
        """One JSON line per finished container run: pod, container, CPU seconds (instances.account)."""
        return self.state_dir / container_cpu.LOG_NAME


class IpAllocator:
    """Pod IPs of one node's podCIDR block."""

    def __init__(self, node_cidr: str, *, gateway: str) -> None:
        self._free = list(network.pod_ips(node_cidr, gateway=gateway))
        self._by_uid: dict[str, str] = {}
        self._lock = threading.Lock()

    def allocate(self, pod_uid: str) -> str:
        with self._lock:
            if pod_uid in self._by_uid:
                return self._by_uid[pod_uid]
            if not self._free:
                raise RuntimeError("no free pod IP left in this node's podCIDR")
            self._by_uid[pod_uid] = ip = self._free.pop(0)
            return ip

    def release(self, pod_uid: str) -> None:
        with self._lock:
            if (ip := self._by_uid.pop(pod_uid, None)) is not None:
                self._free.append(ip)


class ServiceCache:
    """Every Service with a ClusterIP, from the agent's one Service watch."""

    def __init__(self) -> None:
        self._services: dict[tuple[str, str], env.ServiceInfo] = {}
        self._lock = threading.Lock()
        self.synced = threading.Event()

    def apply(self, kind: str, obj: kube.JSON) -> None:
        if kind == "LIST":
            listed = [env.ServiceInfo.from_object(item) for item in obj["items"]]
            with self._lock:
                self._services = {(info.namespace, info.name): info for info in listed}
            self.synced.set()
            return
        info = env.ServiceInfo.from_object(obj)
        with self._lock:
            if kind == "DELETED":
                self._services.pop((info.namespace, info.name), None)
            else:
                self._services[(info.namespace, info.name)] = info

    def snapshot(self) -> list[env.ServiceInfo]:
        with self._lock:
            return list(self._services.values())


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeContext:
    """One node as its pod workers see it."""

    name: str
    ip: str
    pod_cidr: str
    allocatable: dict[str, str]
    client: kube.KubeClient
    recorder: events.EventRecorder
    ips: IpAllocator
    settings: AgentSettings
    images: images.ImageFile
    services: ServiceCache
    mountpoints: mountpoints.Mountpoints
    #: Wrapper directories for image ``bin`` dirs (see ``containers.bin_wrappers``), shared by all nodes.
    bin_wrappers: Callable[[Path], Path]
