"""The bed's network: a private layer-3 world of namespaces for one test cluster, and its cleanup.

Owns, for a bed with id X (1..200), allocated by holding ``flock`` on ``/run/trainop-bed/X.lock``:

- in the root netns (pytest, etcd, kube-apiserver, controllers): veth ``tbXr`` 172.29.X.1/24 and a route
  to the pods, 10.244.X.0/24 via 172.29.X.2 (optionally the Service CIDR too). The apiserver binds
  172.29.X.1;
- the bed netns ``trainop-bX``, the nodes' shared "host network": lo, ``eth0`` 172.29.X.2/24 (the veth
  peer), bridge ``cbr0`` 10.244.X.1/24, ip_forward=1 and bridge-nf-call-iptables=1 (kube-proxy's rules
  must also see pod-to-pod traffic crossing the bridge). The node agent and hostNetwork pods live here;
- one netns per pod, ``trainop-bX-<8 hex of the pod uid>``: lo, ``eth0`` with an IP from its node's
  podCIDR (``split_pod_cidr``), default route via 10.244.X.1; the host end ``v<8 hex>`` sits on cbr0.

Traffic stays on loopback and these subnets: nothing here touches the VM's own interfaces or routes
other than the one route above. Creating a bed first removes every leftover of beds whose lock is not
held (a crashed run's namespaces, veths and the processes still inside them), so the next start cleans
up after a crash; :meth:`BedNetwork.destroy` removes everything it made.

Everything goes through ``ip`` (iproute2), the tool an operator would use by hand, so a failing step
shows up as the same command line and message. It does not know about pods, nodes or Kubernetes objects:
the node agent decides which IP a pod gets and calls :func:`create_pod_network`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import ipaddress
import math
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

BED_DIR = Path("/run/trainop-bed")
MAX_BED_ID = 200
BRIDGE = "cbr0"
#: The bed netns side of the root veth: the nodes' "NIC".
NODE_INTERFACE = "eth0"
_NETNS_PATTERN = re.compile(r"^trainop-b(\d+)(?:-[0-9a-f]{8})?$")
_ROOT_VETH_PATTERN = re.compile(r"^tb(\d+)r$")


class NetworkError(RuntimeError):
    """An ``ip`` command failed; the message carries the command and its stderr."""


def ip(*args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS``; raise :class:`NetworkError` naming the command when it fails and ``check``."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True, input=input, check=False)
    if check and result.returncode != 0:
        raise NetworkError(f"`ip {' '.join(args)}` failed: {result.stderr.strip() or result.stdout.strip()}")
    return result


@dataclasses.dataclass(frozen=True)
class BedAddresses:
    """Every name and address of bed ``bed_id``: pure arithmetic, nothing is created."""

    bed_id: int

    def __post_init__(self) -> None:
        if not 1 <= self.bed_id <= MAX_BED_ID:
            raise ValueError(f"bed id must be in 1..{MAX_BED_ID}, got {self.bed_id}")

    @property
    def apiserver_ip(self) -> str:
        """The root netns end: the apiserver (and anything on the host) is reached here."""
        return f"172.29.{self.bed_id}.1"

    @property
    def node_ip(self) -> str:
        """The bed netns end: every node's InternalIP (the nodes share one host network)."""
        return f"172.29.{self.bed_id}.2"

    @property
    def transfer_prefix_len(self) -> int:
        return 24

    @property
    def pod_cidr(self) -> str:
        """All pods of the bed; split among the nodes by :func:`split_pod_cidr`."""
        return f"10.244.{self.bed_id}.0/24"

    @property
    def gateway(self) -> str:
        """cbr0's address: every pod's default route."""
        return f"10.244.{self.bed_id}.1"

    @property
    def netns(self) -> str:
        return f"trainop-b{self.bed_id}"

    @property
    def root_veth(self) -> str:
        return f"tb{self.bed_id}r"

    def pod_netns(self, pod_uid: str) -> str:
        return f"{self.netns}-{_uid_hex(pod_uid)}"

    def pod_host_veth(self, pod_uid: str) -> str:
        """The pod veth's end in the bed netns (on cbr0); 9 characters, well under IFNAMSIZ."""
        return f"v{_uid_hex(pod_uid)}"


def _uid_hex(pod_uid: str) -> str:
    digits = pod_uid.replace("-", "").lower()
    if len(digits) < 8 or not re.fullmatch(r"[0-9a-f]+", digits):
        raise ValueError(f"not a pod uid: {pod_uid!r}")
    return digits[:8]


def split_pod_cidr(cidr: str, num_nodes: int) -> list[str]:
    """Split the bed's pod CIDR into one equal, power-of-two block per node (a /24 for 4 nodes: /26s).

    At most 16 nodes (/28 blocks, 13 usable pod IPs on the first node, 14 on the others).
    """
    if num_nodes < 1:
        raise ValueError("at least one node")
    network = ipaddress.ip_network(cidr)
    extra_bits = math.ceil(math.log2(num_nodes)) if num_nodes > 1 else 0
    new_prefix = network.prefixlen + extra_bits
    if new_prefix > 28:
        raise ValueError(f"{cidr} cannot give {num_nodes} nodes a /28 or larger each")
    return [str(block) for block in list(network.subnets(new_prefix=new_prefix))[:num_nodes]]


def pod_ips(node_cidr: str, *, gateway: str) -> Iterator[str]:
    """The pod IPs of one node's block: every host address except the bridge's (the gateway)."""
    for address in ipaddress.ip_network(node_cidr).hosts():
        if str(address) != gateway:
            yield str(address)


# ------------------------------------------------------------------------------------------- locks
def _lock_path(bed_id: int) -> Path:
    return BED_DIR / f"{bed_id}.lock"


def _try_lock(bed_id: int) -> int | None:
    """An fd holding bed ``bed_id``'s lock, or None when another holder (any process) has it."""
    BED_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(_lock_path(bed_id), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def bed_is_live(bed_id: int) -> bool:
    """True while some process holds bed ``bed_id``'s lock (its owner is running)."""
    fd = _try_lock(bed_id)
    if fd is None:
        return True
    os.close(fd)
    return False


# ------------------------------------------------------------------------------------- leftovers
def netns_names() -> list[str]:
    """Names of the named network namespaces (``ip netns list``, without the ``(id: N)`` suffix)."""
    return [line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line.strip()]


def _root_links() -> list[str]:
    names = []
    for line in ip("-o", "link", "show").stdout.splitlines():
        # "12: tb3r@if11: <BROADCAST,...": the name is the second field, up to '@' or ':'.
        fields = line.split(":", 2)
        if len(fields) >= 2:
            names.append(fields[1].strip().split("@")[0])
    return names


def kill_netns_processes(netns: str) -> None:
    """SIGKILL every process inside ``netns`` until none is left (they keep the namespace alive)."""
    for _ in range(50):
        result = ip("netns", "pids", netns, check=False)
        pids = [int(pid) for pid in result.stdout.split()] if result.returncode == 0 else []
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    raise NetworkError(f"processes in netns {netns} survive SIGKILL")


def _remove_bed(bed_id: int) -> None:
    """Remove bed ``bed_id``'s namespaces (pods first), their processes and the root veth and route."""
    addresses = BedAddresses(bed_id)
    names = [name for name in netns_names() if _bed_of(name) == bed_id]
    for name in sorted(names, key=len, reverse=True):  # pod netns (longer names) before the bed's
        kill_netns_processes(name)
        ip("netns", "del", name, check=False)
    # Deleting the bed netns destroys the veth pair with it; remove the root end explicitly in case the
    # namespace was already gone and the link was left behind in the root netns (it cannot be, but a
    # half-made bed may have the root end only).
    if addresses.root_veth in _root_links():
        ip("link", "del", addresses.root_veth, check=False)
    ip("route", "del", addresses.pod_cidr, check=False)


def _bed_of(netns: str) -> int | None:
    match = _NETNS_PATTERN.match(netns)
    return int(match.group(1)) if match else None


def leftover_bed_ids() -> set[int]:
    """Ids of beds that have namespaces or root veths on this machine (live or not)."""
    ids = {bed for bed in (_bed_of(name) for name in netns_names()) if bed is not None}
    for link in _root_links():
        if match := _ROOT_VETH_PATTERN.match(link):
            ids.add(int(match.group(1)))
    return {bed for bed in ids if 1 <= bed <= MAX_BED_ID}


def cleanup_leftovers() -> list[int]:
    """Remove everything of every bed whose lock nobody holds; return the ids cleaned (sorted)."""
    cleaned = []
    for bed_id in sorted(leftover_bed_ids()):
        fd = _try_lock(bed_id)
        if fd is None:
            continue
        try:
            _remove_bed(bed_id)
            cleaned.append(bed_id)
        finally:
            os.close(fd)
    return cleaned


# ------------------------------------------------------------------------------------------- a bed
class BedNetwork:
    """One bed's network, created by :meth:`create` and removed by :meth:`destroy` (or ``with``)."""

    def __init__(self, addresses: BedAddresses, lock_fd: int, *, service_cidr: str | None = None) -> None:
        self.addresses = addresses
        self.service_cidr = service_cidr
        self._lock_fd: int | None = lock_fd

    @classmethod
    def create(cls, *, bed_id: int | None = None, service_cidr: str | None = None) -> BedNetwork:
        """Clean leftovers of dead beds, take the first free id (or ``bed_id``) and build the network.

        ``service_cidr``: also route the cluster's Service CIDR from the root netns into the bed, so
        ClusterIPs (kube-proxy's rules live in the bed netns) answer from the host too. Every bed uses the
        same Service CIDR, so only one bed on a machine can have this route; a second one fails saying so
        (``run_in_bed_netns`` reaches ClusterIPs without it).
        """
        cleanup_leftovers()
        candidates: Sequence[int] = (bed_id,) if bed_id is not None else range(1, MAX_BED_ID + 1)
        for candidate in candidates:
            fd = _try_lock(candidate)
            if fd is None:
                continue
            bed = cls(BedAddresses(candidate), fd, service_cidr=service_cidr)
            try:
                _remove_bed(candidate)  # a leftover created between cleanup and our lock
                bed._build()
            except BaseException:
                bed.destroy()
                raise
            return bed
        raise NetworkError(
            f"bed {bed_id} is in use" if bed_id is not None else f"all {MAX_BED_ID} bed ids are in use"
        )

    def _build(self) -> None:
        a = self.addresses
        ip("netns", "add", a.netns)
        ip("link", "add", a.root_veth, "type", "veth", "peer", "name", NODE_INTERFACE, "netns", a.netns)
        ip("addr", "add", f"{a.apiserver_ip}/{a.transfer_prefix_len}", "dev", a.root_veth)
        ip("link", "set", a.root_veth, "up")
        ip(
            "-n",
            a.netns,
            "-batch",
            "-",
            input="\n".join(
                [
                    "link set lo up",
                    f"addr add {a.node_ip}/{a.transfer_prefix_len} dev {NODE_INTERFACE}",
                    f"link set {NODE_INTERFACE} up",
                    f"link add {BRIDGE} type bridge",
                    f"addr add {a.gateway}/24 dev {BRIDGE}",
                    f"link set {BRIDGE} up",
                ]
            )
            + "\n",
        )
        # Per-netns sysctls: written from inside the bed netns (/proc/sys/net is the reader's netns).
        self.run_in_bed_netns(
            [
                "sh",
                "-c",
                "echo 1 > /proc/sys/net/ipv4/ip_forward && "
                "echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables",
            ],
            check=True,
        )
        ip("route", "add", a.pod_cidr, "via", a.node_ip, "dev", a.root_veth)
        if self.service_cidr is not None:
            result = ip("route", "add", self.service_cidr, "via", a.node_ip, "dev", a.root_veth, check=False)
            if result.returncode != 0:
                raise NetworkError(
                    f"cannot route the Service CIDR {self.service_cidr} into bed {a.bed_id}: "
                    f"{result.stderr.strip()} (another bed has it; create this bed without service_cidr)"
                )

    def destroy(self) -> None:
        """Remove the bed's namespaces (with the processes inside), veths and route; release the id."""
        if self._lock_fd is None:
            return
        try:
            _remove_bed(self.addresses.bed_id)
        finally:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> BedNetwork:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.destroy()

    # ------------------------------------------------------------------------------------ facts
    @property
    def bed_id(self) -> int:
        return self.addresses.bed_id

    @property
    def apiserver_ip(self) -> str:
        return self.addresses.apiserver_ip

    @property
    def node_ip(self) -> str:
        return self.addresses.node_ip

    @property
    def netns(self) -> str:
        return self.addresses.netns

    @property
    def pod_cidr(self) -> str:
        return self.addresses.pod_cidr

    def node_pod_cidrs(self, num_nodes: int) -> list[str]:
        return split_pod_cidr(self.pod_cidr, num_nodes)

    # ---------------------------------------------------------------------------------- helpers
    def bed_netns_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed to run inside the bed netns (``ip netns exec``)."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def run_in_bed_netns(
        self, argv: Sequence[str], *, check: bool = False, timeout_s: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the bed netns, capturing text output."""
        return subprocess.run(
            self.bed_netns_argv(argv), capture_output=True, text=True, check=check, timeout=timeout_s
        )


# -------------------------------------------------------------------------------------- pod netns
@dataclasses.dataclass(frozen=True, kw_only=True)
class PodNetwork:
    netns: str
    ip: str
    host_veth: str

    @property
    def netns_path(self) -> Path:
        return Path("/run/netns") / self.netns


def create_pod_network(addresses: BedAddresses, *, pod_uid: str, pod_ip: str) -> PodNetwork:
    """A pod's netns with ``eth0`` = ``pod_ip`` on the bed's bridge; replaces a leftover of the same uid."""
    netns, veth = addresses.pod_netns(pod_uid), addresses.pod_host_veth(pod_uid)
    destroy_pod_network(addresses, pod_uid=pod_uid)
    ip("netns", "add", netns)
    try:
        ip(
            "-n",
            addresses.netns,
            "-batch",
            "-",
            input=f"link add {veth} type veth peer name eth0 netns {netns}\n"
            f"link set {veth} master {BRIDGE} up\n",
        )
        ip(
            "-n",
            netns,
            "-batch",
            "-",
            input="link set lo up\n"
            f"addr add {pod_ip}/24 dev eth0\n"
            "link set eth0 up\n"
            f"route add default via {addresses.gateway}\n",
        )
    except NetworkError:
        destroy_pod_network(addresses, pod_uid=pod_uid)
        raise
    return PodNetwork(netns=netns, ip=pod_ip, host_veth=veth)


def destroy_pod_network(addresses: BedAddresses, *, pod_uid: str) -> None:
    """Remove a pod's netns (killing anything left inside) and its veth. Idempotent."""
    netns = addresses.pod_netns(pod_uid)
    if netns in netns_names():
        kill_netns_processes(netns)
        ip("netns", "del", netns, check=False)
    # The veth pair goes with the netns; deleting the host end explicitly frees it at once.
    ip("-n", addresses.netns, "link", "del", addresses.pod_host_veth(pod_uid), check=False)
