"""``python -m trainop.controller``: the operator process (what ``trainop operator`` runs, and the tests).

This module must not do anything but parse arguments and call ``main.run``.
"""

from __future__ import annotations

import argparse
import os

from trainop.controller import main


def _port(value: str) -> int | None:
    return None if value in ("0", "", "off") else int(value)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainop.controller", description="Run the trainop operator."
    )
    parser.add_argument(
        "--namespace",
        "-n",
        action="append",
        dest="namespaces",
        help="watch this namespace or kopf glob pattern (repeatable); default: every namespace",
    )
    parser.add_argument(
        "--liveness-port", type=_port, default=8080, help="kopf liveness endpoint; 0 disables"
    )
    parser.add_argument("--metrics-port", type=_port, default=9100, help="Prometheus metrics; 0 disables")
    parser.add_argument("--kubeconfig", default=None, help="default: in-cluster, else $KUBECONFIG")
    parser.add_argument(
        "--log-format",
        choices=("plain", "full", "json"),
        default=os.environ.get("TRAINOP_LOG_FORMAT", "full"),
    )
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--workers", type=int, default=4, help="concurrent reconciles")
    parser.add_argument("--peering", default=None, help="kopf peering name for several replicas")
    parser.add_argument(
        "--watch-inactivity-timeout",
        type=float,
        default=None,
        help="seconds without any watch event (bookmarks included) before a watch is re-established; "
        "default: kopf's 70",
    )
    return parser.parse_args(argv)


def cli(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return main.run(
        args.namespaces,
        liveness_port=args.liveness_port,
        metrics_port=args.metrics_port,
        kubeconfig=args.kubeconfig,
        log_format=args.log_format,
        verbose=args.verbose,
        workers=args.workers,
        peering=args.peering,
        watch_inactivity_timeout=args.watch_inactivity_timeout,
    )


if __name__ == "__main__":
    raise SystemExit(cli())
