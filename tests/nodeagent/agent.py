"""The node agent: N nodes in one process, each with its heartbeat, pod watch, workers and endpoint.

Owns the wiring and the process-wide lifecycle:

- start: remove what a crashed agent of this bed (or of a bed nobody holds) left behind (pod netns and
  the processes in them, cgroups, host mountpoints, mounts under the state dir); enter the bed netns
  (the nodes' host network: the apiserver is reached at the bed's root IP, pods at their IPs, the
  kubelet endpoints listen on the node IP); make ``<state-dir>/pods`` a shared mount so a pod's tmpfs
  unmounts reach containers' mount namespaces; register every node; watch Services (service links) and,
  per node, the Pods bound to it (``fieldSelector=spec.nodeName``), one :class:`PodWorker` per pod uid;
  serve each node's kubelet endpoint and the test-hook socket;
- stop: every container killed (SIGTERM, then SIGKILL after a short grace), every sandbox torn down, the
  cgroup tree, mountpoints and mounts removed. Node objects stay (a stopped kubelet does not delete its
  Node either); their Leases simply stop.

One agent per bed: a second agent on the same bed would clean up the first one's pods at its start.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from tests.clusterbed import network

from . import (
    cgroups,
    containers,
    context,
    control,
    events,
    images,
    kube,
    kubelet_api,
    mountpoints,
    nodes,
    runtime,
    volumes,
)
from .podworker import PodWorker

log = logging.getLogger(__name__)
JSON = dict[str, Any]
_CLONE_NEWNET = 0x40000000
_SHUTDOWN_GRACE_S = 2.0
_LEASE_DURATION_S = nodes.LEASE_DURATION_S


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentConfig:
    settings: context.AgentSettings
    nodes: list[nodes.NodeConfig]
    #: A kubeconfig path; ``{node}`` in it is replaced by each node's name (one identity per node).
    kubeconfig: str
    images_file: Path | None = None
    #: The first node's kubelet port; node i listens on ``kubelet_port + i``.
    kubelet_port: int = 10250
    tls: kubelet_api.TLSFiles | None = None
    #: Enter the bed netns at start (False only when the caller already runs inside it).
    enter_bed_netns: bool = True
    #: The node Leases' duration; renewed every quarter of it (the kubelet: 40 s, every 10 s).
    lease_duration_s: int = _LEASE_DURATION_S


def enter_netns(path: str) -> None:
    """Move this thread (call it before starting any thread: they inherit it) into netns ``path``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns {path}: {os.strerror(error)}")
    finally:
        os.close(fd)


def clean_leftovers(bed_id: int, state_dir: Path) -> None:
    """Remove a previous agent's pods of this bed, and agent leftovers of beds nobody holds."""
    addresses = network.BedAddresses(bed_id)
    for name in network.netns_names():
        if name.startswith(addresses.netns + "-"):
            network.kill_netns_processes(name)
            network.ip("netns", "del", name, check=False)
    cgroups.remove_bed_tree(bed_id)
    for other in cgroups.bed_ids_with_groups():
        if other != bed_id and not network.bed_is_live(other):
            cgroups.remove_bed_tree(other)
    volumes.unmount_all_under(state_dir / "pods")
    removed = mountpoints.remove_leftovers(bed_id)
    if removed:
        log.info("removed %d mountpoints left by a previous agent", len(removed))


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.settings = config.settings
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.workers: dict[str, tuple[str, PodWorker]] = {}
        self.nodes: dict[str, context.NodeContext] = {}
        self.heartbeats: dict[str, nodes.NodeHeartbeat] = {}
        self._node_stops: dict[str, threading.Event] = {}
        self._servers: list[kubelet_api.KubeletServer] = []
        self._control: control.ControlServer | None = None
        self._services = context.ServiceCache()
        self._images = images.ImageFile(config.images_file, defaults=images.default_images())
        self._mountpoints = mountpoints.Mountpoints(self.settings.bed.bed_id)
        self._wrapper_lock = threading.Lock()
        self._clients: list[kube.KubeClient] = []

    # ------------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        bed = self.settings.bed
        clean_leftovers(bed.bed_id, self.settings.state_dir)
        if self.config.enter_bed_netns:
            enter_netns(f"/run/netns/{bed.netns}")
        pods_dir = self.settings.pods_dir
        pods_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "--bind", str(pods_dir), str(pods_dir)], check=True)
        subprocess.run(["mount", "--make-rshared", str(pods_dir)], check=True)
        cidrs = network.split_pod_cidr(bed.pod_cidr, len(self.config.nodes))
        for index, (node_config, cidr) in enumerate(zip(self.config.nodes, cidrs, strict=True)):
            self._start_node(node_config, cidr, self.config.kubelet_port + index)
        first = next(iter(self.nodes.values()))
        threading.Thread(
            target=self._watch_services, args=(first.client,), name="services", daemon=True
        ).start()
        self._services.synced.wait(30)
        for name in self.nodes:
            threading.Thread(target=self._watch_pods, args=(name,), name=f"pods-{name}", daemon=True).start()
        self._control = control.ControlServer(
            self.settings.state_dir / "control.sock",
            {
                ("GET", "/healthz"): lambda _: {"ok": True, "nodes": sorted(self.nodes)},
                ("GET", "/pods"): lambda _: {"pods": self._describe_pods()},
                ("POST", "/kill"): self._hook_kill,
                ("POST", "/lose-node"): self._hook_lose_node,
                ("POST", "/exec"): self._hook_exec,
            },
        )
        self._control.start()
        log.info("node agent ready: nodes %s on bed %d", ", ".join(self.nodes), bed.bed_id)

    def _start_node(self, config: nodes.NodeConfig, pod_cidr: str, port: int) -> None:
        client = kube.KubeClient(Path(self.config.kubeconfig.replace("{node}", config.name)))
        self._clients.append(client)
        heartbeat = nodes.NodeHeartbeat(
            config,
            client=client,
            node_ip=self.settings.bed.node_ip,
            pod_cidr=pod_cidr,
            kubelet_port=port,
            lease_duration_s=self.config.lease_duration_s,
        )
        heartbeat.register()
        heartbeat.start()
        self.heartbeats[config.name] = heartbeat
        self._node_stops[config.name] = threading.Event()
        self.nodes[config.name] = context.NodeContext(
            name=config.name,
            ip=self.settings.bed.node_ip,
            pod_cidr=pod_cidr,
            allocatable=heartbeat.allocatable,
            client=client,
            recorder=events.EventRecorder(client, node_name=config.name),
            ips=context.IpAllocator(pod_cidr, gateway=self.settings.bed.gateway),
            settings=self.settings,
            images=self._images,
            services=self._services,
            mountpoints=self._mountpoints,
            bin_wrappers=self._bin_wrappers,
        )
        if self.config.tls is not None:
            server = kubelet_api.KubeletServer(
                node_name=config.name,
                address=(self.settings.bed.node_ip, port),
                tls=self.config.tls,
                find=functools.partial(self.find, node=config.name),
                pods=functools.partial(self._node_pods, config.name),
            )
            server.start()
            self._servers.append(server)

    def _bin_wrappers(self, bin_dir: Path) -> Path:
        with self._wrapper_lock:
            return containers.write_bin_wrappers(bin_dir, self.settings.state_dir / "bin-wrappers")

    def stop(self) -> None:
        """Kill every container, tear everything down. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        for event in self._node_stops.values():
            event.set()
        for heartbeat in self.heartbeats.values():
            heartbeat.stop()
        with self._lock:
            workers = [worker for _, worker in self.workers.values()]
        for worker in workers:
            for instance in list(worker.instances.values()):
                runtime.signal_main(instance.running, signal.SIGTERM)
        deadline = time.monotonic() + _SHUTDOWN_GRACE_S
        while any(w.instances for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        for worker in workers:
            worker.post(("shutdown",))
        for worker in workers:
            worker.join(timeout=30)
        for server in self._servers:
            server.shutdown()
            server.server_close()
        if self._control is not None:
            self._control.shutdown()
            self._control.server_close()
            (self.settings.state_dir / "control.sock").unlink(missing_ok=True)
        for node in self.nodes.values():
            node.recorder.flush(timeout_s=2)
        cgroups.remove_bed_tree(self.settings.bed.bed_id)
        self._mountpoints.release_all()
        volumes.unmount_all_under(self.settings.pods_dir)
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.close()
        log.info("node agent stopped")

    def wait(self) -> None:
        self._stop.wait()

    # ---------------------------------------------------------------------------------- watches
    def _watch_services(self, client: kube.KubeClient) -> None:
        for kind, obj in client.watch("/api/v1/services", stop=self._stop):
            self._services.apply(kind, obj)

    def _watch_pods(self, node: str) -> None:
        stop = self._node_stops[node]
        client = self.nodes[node].client
        for kind, obj in client.watch(
            "/api/v1/pods", query={"fieldSelector": f"spec.nodeName={node}"}, stop=stop
        ):
            if stop.is_set():
                return
            if kind == "LIST":
                listed = {item["metadata"]["uid"] for item in obj["items"]}
                with self._lock:
                    gone = [w for uid, (n, w) in self.workers.items() if n == node and uid not in listed]
                for worker in gone:
                    worker.post(("deleted",))
                for item in obj["items"]:
                    self._dispatch(node, item)
            elif kind == "DELETED":
                with self._lock:
                    entry = self.workers.get(obj["metadata"]["uid"])
                if entry is not None:
                    entry[1].post(("deleted",))
            else:
                self._dispatch(node, obj)

    def _dispatch(self, node: str, pod: JSON) -> None:
        uid = pod["metadata"]["uid"]
        with self._lock:
            entry = self.workers.get(uid)
            if entry is None:
                if self._stop.is_set() or self._node_stops[node].is_set():
                    return
                worker = PodWorker(node=self.nodes[node], pod=pod, on_done=self._worker_done)
                self.workers[uid] = (node, worker)
                worker.start()
                return
        entry[1].post(("update", pod))

    def _worker_done(self, uid: str) -> None:
        with self._lock:
            self.workers.pop(uid, None)

    # ------------------------------------------------------------------------------------ lookup
    def find(self, namespace: str, name: str, *, node: str | None = None) -> PodWorker | None:
        with self._lock:
            for worker_node, worker in self.workers.values():
                if node is not None and worker_node != node:
                    continue
                if worker.namespace == namespace and worker.name_ == name and not worker.finished.is_set():
                    return worker
        return None

    def _node_pods(self, node: str) -> list[JSON]:
        with self._lock:
            return [worker.pod for worker_node, worker in self.workers.values() if worker_node == node]

    def _describe_pods(self) -> list[JSON]:
        with self._lock:
            entries = list(self.workers.values())
        described = []
        for node, worker in entries:
            running = {
                name: {
                    "pid": instance.running.pid,
                    "pids": instance.running.cgroup.pids(),
                    "run": instance.number,
                }
                for name, instance in list(worker.instances.items())
            }
            described.append(
                {
                    "namespace": worker.namespace,
                    "name": worker.name_,
                    "uid": worker.uid,
                    "node": node,
                    "containers": running,
                }
            )
        return described

    # ------------------------------------------------------------------------------------- hooks
    def _instance(self, body: JSON) -> Any:
        worker = self.find(str(body.get("namespace")), str(body.get("pod")))
        if worker is None:
            raise control.HookError(f"pod {body.get('namespace')}/{body.get('pod')} is not on this agent")
        instance = worker.instance(str(body.get("container")))
        if instance is None:
            raise control.HookError(
                f"container {body.get('container')!r} of pod {body.get('pod')} is not running"
            )
        return instance

    def _hook_kill(self, body: JSON) -> JSON:
        instance = self._instance(body)
        signum = control.parse_signal(body.get("signal", "KILL"))
        target = str(body.get("process") or "main")
        if target == "main":
            pids = [instance.running.pid]
        else:
            pids = [
                pid for pid in instance.running.cgroup.pids() if target == "all" or target in _cmdline(pid)
            ]
            if not pids:
                raise control.HookError(f"no process in the container matches {target!r}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        log.info("hook: signal %d to %s (pids %s)", signum, body, pids)
        return {"pids": pids}

    def _hook_lose_node(self, body: JSON) -> JSON:
        node = str(body.get("node"))
        if node not in self.nodes:
            raise control.HookError(f"no node {node!r} on this agent")
        self.heartbeats[node].lose()
        self._node_stops[node].set()
        with self._lock:
            workers = [w for n, w in self.workers.values() if n == node]
        for worker in workers:
            worker.post(("lose",))
        for worker in workers:
            worker.join(timeout=30)
        log.info("hook: node %s lost (%d pods)", node, len(workers))
        return {"pods": len(workers)}

    def _hook_exec(self, body: JSON) -> JSON:
        instance = self._instance(body)
        process = dataclasses.replace(instance.running.process, argv=tuple(body.get("command") or ()))
        worker = self.find(str(body["namespace"]), str(body["pod"]))
        assert worker is not None
        code, output = runtime.run_in(
            instance.running,
            process,
            spec_dir=worker.pod_dir / "launch",
            timeout_s=float(body.get("timeoutSeconds") or 30),
        )
        return {"exitCode": code, "output": output}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
