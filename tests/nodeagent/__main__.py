"""``python -m tests.nodeagent``: run the node agent in the foreground until SIGTERM or Ctrl-C.

Parses the flags into an :class:`agent.AgentConfig`, sets up the agent log (timestamps, to stderr and
``<state-dir>/agent.log``), starts the agent, prints ``nodeagent ready`` on stdout once every node is
registered and its endpoints serve (callers wait for that line), and stops everything on exit.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from tests.clusterbed import network

from . import agent, context, kubelet_api, nodes


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.nodeagent",
        description="Play kubelet + container runtime for one or more Nodes: pods run as local processes "
        "in their own namespaces on a test bed's network (see docs/nodeagent.md).",
    )
    parser.add_argument(
        "--kubeconfig", required=True, help="kubeconfig; '{node}' in the path is replaced per node"
    )
    parser.add_argument(
        "--bed-id", type=int, required=True, help="the bed (tests.clusterbed.network) to run on"
    )
    nodes_group = parser.add_mutually_exclusive_group(required=True)
    nodes_group.add_argument("--nodes", help="comma-separated node names (capacity: this machine's)")
    nodes_group.add_argument(
        "--node-config", type=Path, help='JSON {"nodes": [{"name", "capacity", "labels", "taints"}]}'
    )
    parser.add_argument(
        "--state-dir", type=Path, required=True, help="pod dirs, logs, control.sock, agent.log"
    )
    parser.add_argument("--images", type=Path, help="image map JSON (added to the default trainop images)")
    parser.add_argument("--kubelet-port", type=int, default=10250, help="first node's port (node i: +i)")
    parser.add_argument(
        "--tls-cert-file", type=Path, help="kubelet endpoint serving certificate (for the node IP)"
    )
    parser.add_argument("--tls-private-key-file", type=Path)
    parser.add_argument(
        "--client-ca-file", type=Path, help="CA of the apiserver's kubelet client certificate"
    )
    parser.add_argument("--cluster-dns", default="10.0.0.10")
    parser.add_argument("--cluster-domain", default="cluster.local")
    parser.add_argument(
        "--backoff-initial", type=float, default=10.0, help="seconds (CrashLoopBackOff, image pulls)"
    )
    parser.add_argument("--backoff-max", type=float, default=60.0, help="seconds (the kubelet's cap is 300)")
    parser.add_argument(
        "--sync-frequency",
        type=float,
        default=15.0,
        help="seconds between refreshes of configMap/secret/token volumes",
    )
    parser.add_argument(
        "--lease-duration",
        type=int,
        default=40,
        help="node Lease seconds, renewed every quarter (kubelet: 40)",
    )
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def _setup_logging(state_dir: Path, level: str) -> None:
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s")
    handlers: list[logging.Handler] = [
        logging.StreamHandler(sys.stderr),
        logging.FileHandler(state_dir / "agent.log"),
    ]
    for handler in handlers:
        handler.setFormatter(formatter)
    logging.basicConfig(level=level.upper(), handlers=handlers)
    logging.getLogger("urllib3").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    args.state_dir.mkdir(parents=True, exist_ok=True)
    _setup_logging(args.state_dir, args.log_level)
    try:
        node_configs = nodes.load_node_configs(names=args.nodes, config_file=args.node_config)
        tls = None
        if args.tls_cert_file or args.tls_private_key_file or args.client_ca_file:
            if not (args.tls_cert_file and args.tls_private_key_file and args.client_ca_file):
                raise ValueError("--tls-cert-file, --tls-private-key-file and --client-ca-file go together")
            tls = kubelet_api.TLSFiles(
                cert=args.tls_cert_file, key=args.tls_private_key_file, client_ca=args.client_ca_file
            )
        config = agent.AgentConfig(
            settings=context.AgentSettings(
                state_dir=args.state_dir.resolve(),
                bed=network.BedAddresses(args.bed_id),
                cluster_dns=args.cluster_dns,
                cluster_domain=args.cluster_domain,
                backoff_initial_s=args.backoff_initial,
                backoff_max_s=args.backoff_max,
                volume_resync_s=args.sync_frequency,
            ),
            nodes=node_configs,
            kubeconfig=args.kubeconfig,
            images_file=args.images,
            kubelet_port=args.kubelet_port,
            tls=tls,
            lease_duration_s=args.lease_duration,
        )
    except (ValueError, KeyError, OSError) as error:
        print(f"nodeagent: {error}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    node_agent = agent.Agent(config)
    try:
        node_agent.start()
        print("nodeagent ready", flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        node_agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
