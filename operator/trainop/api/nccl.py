"""NCCL environment for a network profile: the static part, shared by the operator and the trainer.

The operator puts ``profile_env(spec.network)`` into every worker pod's env; local mode passes the same
dict through Ray's runtime_env. For ``auto`` nothing is fixed here: the trainer inspects the node it
runs on (NVLink through pynvml, /sys/class/infiniband, EFA) and picks a profile at start-up, so the
static env of ``auto`` is only the user's overrides plus the always-on safety settings.

Explicit ``ncclEnv`` overrides always win. Nothing here turns NVLink SHARP/multicast (NVLS) on: it is
left at NCCL's default, off on machines without NVSwitch multicast support.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainop.api import trainingjob

# Settings every profile gets: fail fast and loudly instead of hanging for NCCL's default 30 minutes.
_COMMON: dict[str, str] = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "NCCL_DEBUG": "WARN",
}

_PROFILES: dict[trainingjob.NetworkProfile, dict[str, str]] = {
    trainingjob.NetworkProfile.AUTO: {},
    # Single node, GPUs joined by NVLink/NVSwitch: peer-to-peer over NVLink, no network transport.
    trainingjob.NetworkProfile.NVLINK: {
        "NCCL_P2P_LEVEL": "NVL",
        "NCCL_IB_DISABLE": "1",
    },
    # InfiniBand with GPUDirect RDMA.
    trainingjob.NetworkProfile.INFINIBAND: {
        "NCCL_IB_DISABLE": "0",
        "NCCL_NET_GDR_LEVEL": "PHB",
        "NCCL_SOCKET_IFNAME": "^lo,docker",
    },
    # RoCE v2: IB verbs over Ethernet; GID index 3 is RoCE v2 on most NICs, traffic class for lossless.
    trainingjob.NetworkProfile.ROCE: {
        "NCCL_IB_DISABLE": "0",
        "NCCL_IB_GID_INDEX": "3",
        "NCCL_IB_TC": "106",
        "NCCL_NET_GDR_LEVEL": "PHB",
        "NCCL_SOCKET_IFNAME": "^lo,docker",
    },
    # AWS EFA through the aws-ofi-nccl plugin (libfabric).
    trainingjob.NetworkProfile.EFA: {
        "FI_PROVIDER": "efa",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "NCCL_PROTO": "simple",
        "NCCL_SOCKET_IFNAME": "^lo,docker",
    },
    # Plain TCP sockets: no RDMA transport.
    trainingjob.NetworkProfile.TCP: {
        "NCCL_IB_DISABLE": "1",
        "NCCL_SOCKET_IFNAME": "^lo,docker",
        "NCCL_NSOCKS_PERTHREAD": "4",
        "NCCL_SOCKET_NTHREADS": "2",
    },
}


def profile_env(
    profile: trainingjob.NetworkProfile, overrides: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The NCCL env for ``profile`` with ``overrides`` applied last (they always win)."""
    env = dict(_COMMON)
    env.update(_PROFILES[profile])
    env.update(overrides or {})
    return env


def env_for(network: trainingjob.Network) -> dict[str, str]:
    """The static NCCL env a job's workers get from its spec.network."""
    env = profile_env(network.profile, network.nccl_env)
    env["TRAINOP_NETWORK_PROFILE"] = network.profile.value
    return env
