"""A pod's sandbox: its netns and IP, the files every container mounts, and its volumes.

Owns what the kubelet and the CRI's RunPodSandbox make before any container starts: the pod netns with
an IP from the node's podCIDR (``tests.clusterbed.network``; hostNetwork pods use the node's own
network and IP), the kubelet-format ``/etc/hosts``, the ``/etc/resolv.conf`` of the pod's dnsPolicy and
dnsConfig, ``/etc/hostname``, and the volumes (``volumes.PodVolumes``); and their teardown, which leaves
only the pod's log files behind.
"""

from __future__ import annotations

import calendar
import contextlib
import shutil
import time
from pathlib import Path
from typing import Any

from tests.clusterbed import network

from . import cgroups, containers, context, kube, volumes

JSON = dict[str, Any]


def hosts_file(pod: JSON, *, pod_ip: str, cluster_domain: str) -> str:
    """The kubelet's managed /etc/hosts for a pod."""
    spec, metadata = pod["spec"], pod["metadata"]
    hostname = spec.get("hostname") or metadata["name"]
    lines = [
        "# Kubernetes-managed hosts file.",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        "fe00::0\tip6-localnet",
        "fe00::0\tip6-mcastprefix",
        "fe00::1\tip6-allnodes",
        "fe00::2\tip6-allrouters",
    ]
    if spec.get("subdomain"):
        fqdn = f"{hostname}.{spec['subdomain']}.{metadata['namespace']}.svc.{cluster_domain}"
        lines.append(f"{pod_ip}\t{fqdn}\t{hostname}")
    else:
        lines.append(f"{pod_ip}\t{hostname}")
    aliases = spec.get("hostAliases") or []
    if aliases:
        lines.append("")
        lines.append("# Entries added by HostAliases.")
        lines += [f"{alias['ip']}\t{chr(9).join(alias.get('hostnames') or [])}" for alias in aliases]
    return "\n".join(lines) + "\n"


def resolv_conf(pod: JSON, *, cluster_dns: str, cluster_domain: str) -> str | None:
    """The pod's resolv.conf, or None where the host's is used (dnsPolicy Default, or hostNetwork
    with ClusterFirst, as the kubelet does)."""
    spec = pod["spec"]
    policy = spec.get("dnsPolicy") or "ClusterFirst"
    host_network = bool(spec.get("hostNetwork"))
    namespace = pod["metadata"]["namespace"]
    nameservers: list[str] = []
    searches: list[str] = []
    options: list[str] = []
    if policy == "ClusterFirstWithHostNet" or (policy == "ClusterFirst" and not host_network):
        nameservers = [cluster_dns]
        searches = [f"{namespace}.svc.{cluster_domain}", f"svc.{cluster_domain}", cluster_domain]
        options = ["ndots:5"]
    elif policy != "None":
        return None
    config = spec.get("dnsConfig") or {}
    nameservers += [ns for ns in config.get("nameservers") or [] if ns not in nameservers]
    searches += [s for s in config.get("searches") or [] if s not in searches]
    for option in config.get("options") or []:
        text = option["name"] + (f":{option['value']}" if option.get("value") else "")
        options = [o for o in options if o.split(":")[0] != option["name"]] + [text]
    lines = [f"search {' '.join(searches)}"] if searches else []
    lines += [f"nameserver {ns}" for ns in nameservers]
    if options:
        lines.append(f"options {' '.join(options)}")
    return "\n".join(lines) + "\n"


class Sandbox:
    """Create with :meth:`create_network`, then :meth:`setup_volumes` (retried until it works)."""

    def __init__(self, *, node: context.NodeContext, pod: JSON, pod_dir: Path) -> None:
        self.node = node
        self.pod = pod
        self.pod_dir = pod_dir
        self.uid = str(pod["metadata"]["uid"])
        self.host_network = bool(pod["spec"].get("hostNetwork"))
        self.pod_ip = ""
        self.netns_path: str | None = None
        self.files: containers.SandboxFiles | None = None
        self.volumes = volumes.PodVolumes(
            pod=pod, pod_dir=pod_dir, api=_NodeVolumeApi(node), node_allocatable=node.allocatable
        )
        self.volumes_ready = False

    @property
    def cgroup_root(self) -> Path:
        return cgroups.bed_path(self.node.settings.bed.bed_id) / f"pod{self.uid}"

    @property
    def network_ready(self) -> bool:
        return bool(self.pod_ip)

    def create_network(self) -> None:
        """The netns and IP (raises network.NetworkError), then the pod's /etc files."""
        if self.network_ready:
            return
        if self.host_network:
            self.pod_ip = self.node.ip
        else:
            ip = self.node.ips.allocate(self.uid)
            pod_network = network.create_pod_network(self.node.settings.bed, pod_uid=self.uid, pod_ip=ip)
            self.netns_path = str(pod_network.netns_path)
            self.pod_ip = ip
        settings = self.node.settings
        etc = self.pod_dir / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        hostname = self.pod["spec"].get("hostname") or self.pod["metadata"]["name"]
        if self.host_network:
            hostname = self.node.name
        (etc / "hostname").write_text(hostname + "\n")
        hosts: Path | None = None
        if not self.host_network:
            hosts = etc / "hosts"
            hosts.write_text(hosts_file(self.pod, pod_ip=self.pod_ip, cluster_domain=settings.cluster_domain))
        resolv: Path | None = None
        content = resolv_conf(
            self.pod, cluster_dns=settings.cluster_dns, cluster_domain=settings.cluster_domain
        )
        if content is not None:
            resolv = etc / "resolv.conf"
            resolv.write_text(content)
        for path in (etc / "hostname", hosts, resolv):
            if path is not None:
                path.chmod(0o644)
        self.files = containers.SandboxFiles(
            hosts=hosts, resolv_conf=resolv, hostname=etc / "hostname", shm=self.volumes.shm_path
        )

    def setup_volumes(self, pod: JSON) -> dict[str, volumes.HostVolume]:
        """Raises volumes.VolumeError while something is missing; the worker retries."""
        self.volumes.pod = pod
        host_volumes = self.volumes.setup()
        self.volumes_ready = True
        return host_volumes

    def teardown(self) -> None:
        """Everything but the logs: volumes, netns, IP, the pod's cgroups and /etc files. Idempotent."""
        with contextlib.suppress(FileNotFoundError):
            cgroups.remove_tree(self.cgroup_root)
        self.volumes.teardown()
        self.volumes_ready = False
        if not self.host_network and self.pod_ip:
            network.destroy_pod_network(self.node.settings.bed, pod_uid=self.uid)
            self.node.ips.release(self.uid)
        self.pod_ip = ""
        self.netns_path = None
        for name in ("etc", "termination", "launch"):
            shutil.rmtree(self.pod_dir / name, ignore_errors=True)


class _NodeVolumeApi:
    """``volumes.VolumeApi`` through the node's own identity."""

    def __init__(self, node: context.NodeContext) -> None:
        self.client = node.client

    def _get_or_none(self, path: str) -> JSON | None:
        try:
            return self.client.get(path)
        except kube.ApiError as error:
            if error.status == 404:
                return None
            raise volumes.VolumeError(str(error)) from error

    def config_map(self, namespace: str, name: str) -> JSON | None:
        return self._get_or_none(f"/api/v1/namespaces/{namespace}/configmaps/{name}")

    def secret(self, namespace: str, name: str) -> JSON | None:
        return self._get_or_none(f"/api/v1/namespaces/{namespace}/secrets/{name}")

    def persistent_volume_claim(self, namespace: str, name: str) -> JSON | None:
        return self._get_or_none(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}")

    def persistent_volume(self, name: str) -> JSON | None:
        return self._get_or_none(f"/api/v1/persistentvolumes/{name}")

    def service_account_token(
        self, namespace: str, service_account: str, *, audience: str | None, expiration_s: int, pod: JSON
    ) -> tuple[str, float]:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience] if audience else [],
                "expirationSeconds": expiration_s,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod["metadata"]["name"],
                    "uid": pod["metadata"]["uid"],
                },
            },
        }
        try:
            response = self.client.create(
                f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token", body
            )
        except kube.ApiError as error:
            raise volumes.VolumeError(f"token for serviceaccount {service_account!r}: {error}") from error
        expiry = calendar.timegm(
            time.strptime(response["status"]["expirationTimestamp"], "%Y-%m-%dT%H:%M:%SZ")
        )
        return str(response["status"]["token"]), float(expiry)
