"""NCCL environment on a node: ``auto`` resolved from what the node has, on top of the API's profile tables.

The static part — which variables each explicit profile sets — lives in ``trainop.api.nccl`` (the operator
renders it into pod env from there). This module adds what only a process on the node can know:

- ``detect_node_facts``: NVLink state through NVML (``pynvml``, imported lazily), RDMA ports under
  /sys/class/infiniband (link layer, state, driver: EFA devices are RDMA devices driven by ``efa``), and
  ``FI_PROVIDER``. It logs what it found.
- ``resolve_profile``: ``auto`` -> EFA devices or ``FI_PROVIDER=efa`` -> efa; an active InfiniBand port ->
  infiniband; an active RDMA port on Ethernet -> roce; otherwise a single node with several GPUs and active
  NVLink -> nvlink; otherwise tcp. Without facts (the operator, before a pod is scheduled) ``auto`` stays
  ``auto`` and adds nothing: the trainer resolves it on the node.
- ``nccl_env(profile, overrides, node_facts)``: the pure function used by everyone: the API's variables for
  the resolved profile, plus ``NCCL_IB_HCA`` naming the node's active ports when facts are known, with the
  user's ``ncclEnv`` overrides applied last (they always win).

No torch or ray here (the operator may import it); NVLink SHARP (NVLS) is never turned on.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
from collections.abc import Mapping

from trainop.api import nccl as api_nccl
from trainop.api import trainingjob

log = logging.getLogger(__name__)

PROFILES = tuple(p.value for p in trainingjob.NetworkProfile)


@dataclasses.dataclass(frozen=True)
class RdmaDevice:
    """One port of an RDMA device under /sys/class/infiniband."""

    name: str
    port: int
    link_layer: str  # "InfiniBand" or "Ethernet"
    active: bool
    driver: str = ""

    @property
    def is_efa(self) -> bool:
        return self.driver == "efa" or "efa" in self.name


@dataclasses.dataclass(frozen=True)
class NodeFacts:
    """What ``auto`` needs to know about the node a worker runs on."""

    gpu_count: int = 0
    nvlink_active_links: int = 0
    rdma_devices: tuple[RdmaDevice, ...] = ()
    fi_provider: str | None = None
    multi_node: bool = False

    def describe(self) -> str:
        rdma = ", ".join(
            f"{d.name}:{d.port}({d.link_layer}{'' if d.active else ', down'}{', efa' if d.is_efa else ''})"
            for d in self.rdma_devices
        )
        return (
            f"gpus={self.gpu_count} nvlink_active_links={self.nvlink_active_links} "
            f"rdma=[{rdma}] FI_PROVIDER={self.fi_provider or '-'} multi_node={self.multi_node}"
        )


@dataclasses.dataclass(frozen=True)
class NcclPlan:
    """The resolved profile, why it was chosen, and the variables to set."""

    requested: str
    resolved: str
    reason: str
    env: dict[str, str]


def resolve_profile(profile: str, node_facts: NodeFacts | None) -> tuple[str, str]:
    """``(resolved_profile, reason)``. ``auto`` without facts stays ``auto``."""
    if profile not in PROFILES:
        raise ValueError(f"unknown network profile {profile!r}: expected one of {', '.join(PROFILES)}")
    if profile != "auto":
        return profile, "set in spec.network.profile"
    if node_facts is None:
        return "auto", "no node facts: NCCL detects the fabric itself"
    facts = node_facts
    efa = [d.name for d in facts.rdma_devices if d.is_efa]
    if efa or (facts.fi_provider or "").lower() == "efa":
        return "efa", f"EFA devices {efa or '(FI_PROVIDER=efa)'}"
    ib = [d.name for d in facts.rdma_devices if d.active and not d.is_efa and d.link_layer == "InfiniBand"]
    if ib:
        return "infiniband", f"active InfiniBand ports on {sorted(set(ib))}"
    roce = [d.name for d in facts.rdma_devices if d.active and not d.is_efa and d.link_layer == "Ethernet"]
    if roce:
        return "roce", f"active RDMA-over-Ethernet ports on {sorted(set(roce))}"
    if not facts.multi_node and facts.gpu_count > 1 and facts.nvlink_active_links > 0:
        return (
            "nvlink",
            f"single node, {facts.gpu_count} GPUs, {facts.nvlink_active_links} active NVLink links",
        )
    return "tcp", "no RDMA device and no NVLink-only topology"


def _hca_list(devices: tuple[RdmaDevice, ...], link_layer: str) -> str | None:
    names = sorted(
        {f"{d.name}:{d.port}" for d in devices if d.active and not d.is_efa and d.link_layer == link_layer}
    )
    return ",".join(names) or None


def plan(profile: str, overrides: Mapping[str, str], node_facts: NodeFacts | None) -> NcclPlan:
    """Resolve the profile and build its environment (see the module docstring for the rules)."""
    resolved, reason = resolve_profile(profile, node_facts)
    env = api_nccl.profile_env(trainingjob.NetworkProfile(resolved))
    devices = node_facts.rdma_devices if node_facts else ()
    if resolved in ("infiniband", "roce"):
        hca = _hca_list(devices, "InfiniBand" if resolved == "infiniband" else "Ethernet")
        if hca:
            env["NCCL_IB_HCA"] = "=" + hca
    env.update(overrides)
    return NcclPlan(requested=profile, resolved=resolved, reason=reason, env=env)


def nccl_env(profile: str, overrides: Mapping[str, str], node_facts: NodeFacts | None) -> dict[str, str]:
    """The environment variables for ``profile`` on a node described by ``node_facts`` (None: unknown)."""
    return plan(profile, overrides, node_facts).env


def _read(path: pathlib.Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _rdma_devices(sys_root: pathlib.Path) -> tuple[RdmaDevice, ...]:
    base = sys_root / "class" / "infiniband"
    if not base.is_dir():
        return ()
    found: list[RdmaDevice] = []
    for dev in sorted(base.iterdir()):
        driver_link = dev / "device" / "driver"
        driver = os.path.basename(os.path.realpath(driver_link)) if driver_link.exists() else ""
        ports = dev / "ports"
        port_dirs = sorted(ports.iterdir()) if ports.is_dir() else []
        for port in port_dirs:
            state = _read(port / "state")  # e.g. "4: ACTIVE"
            found.append(
                RdmaDevice(
                    name=dev.name,
                    port=int(port.name) if port.name.isdigit() else 1,
                    link_layer=_read(port / "link_layer") or "InfiniBand",
                    active="ACTIVE" in state,
                    driver=driver,
                )
            )
    return tuple(found)


def _nvlink_facts() -> tuple[int, int]:
    """(gpu_count, active NVLink links summed over GPUs) via NVML; (0, 0) without a driver."""
    try:
        import pynvml
    except ImportError:
        return 0, 0
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0, 0
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        active = 0
        for index in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for link in range(int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))):
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED:
                        active += 1
                except pynvml.NVMLError:
                    break
        return count, active
    finally:
        pynvml.nvmlShutdown()


def detect_node_facts(
    *, multi_node: bool, sys_root: str | os.PathLike[str] = "/sys", environ: Mapping[str, str] | None = None
) -> NodeFacts:
    """Inspect this node: NVLink state through NVML, RDMA ports under /sys/class/infiniband, FI_PROVIDER."""
    env = os.environ if environ is None else environ
    gpus, links = _nvlink_facts()
    facts = NodeFacts(
        gpu_count=gpus,
        nvlink_active_links=links,
        rdma_devices=_rdma_devices(pathlib.Path(sys_root)),
        fi_provider=env.get("FI_PROVIDER"),
        multi_node=multi_node,
    )
    log.info("network facts: %s", facts.describe())
    return facts
