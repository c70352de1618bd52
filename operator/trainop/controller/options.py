"""The operator's command-line flags, shared by ``trainop operator`` and ``python -m trainop.controller``.

Light on purpose (argparse only): the ``trainop`` CLI builds its parser without importing kopf.
"""

from __future__ import annotations

import argparse
from typing import Any

#: Concurrent reconciles. Each is an asyncio task that mostly waits on the apiserver, so more workers
#: buy throughput until the apiserver's CPU is the limit (bench/operator_scale: 4 workers brought 1,000
#: jobs to Succeeded in 133 s on 2 cores, 16 in 87 s; docs/reliability.md).
DEFAULT_WORKERS = 16


def port(value: str) -> int | None:
    """A port number; ``0``, ``off`` or empty disables the endpoint."""
    return None if value in ("0", "", "off") else int(value)


def positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def add_arguments(parser: argparse.ArgumentParser, *, default_log_format: str) -> None:
    parser.add_argument(
        "--namespace",
        "-n",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="watch this namespace or kopf glob pattern (repeatable); default: every namespace",
    )
    parser.add_argument(
        "--liveness-port", type=port, default=8080, help="kopf liveness endpoint (/healthz); 0 disables"
    )
    parser.add_argument("--metrics-port", type=port, default=9100, help="Prometheus /metrics; 0 disables")
    parser.add_argument(
        "--listen-address",
        default="0.0.0.0",
        help="address the liveness and metrics endpoints listen on (default 0.0.0.0, every interface; "
        "127.0.0.1 keeps them to this machine)",
    )
    parser.add_argument("--kubeconfig", default=None, help="default: in-cluster, else $KUBECONFIG")
    parser.add_argument("--log-format", choices=("plain", "full", "json"), default=default_log_format)
    parser.add_argument("--verbose", action="store_true", help="log every watch event and API call")
    parser.add_argument(
        "--workers",
        type=positive,
        default=DEFAULT_WORKERS,
        help=f"concurrent reconciles of different owners (default {DEFAULT_WORKERS})",
    )
    parser.add_argument(
        "--watch-inactivity-timeout",
        type=float,
        default=None,
        help="seconds without any watch event (bookmarks included) before a watch is re-established; "
        "default: kopf's 70",
    )


def run_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``main.run``'s keyword arguments from parsed flags."""
    return {
        "namespaces": args.namespaces,
        "liveness_port": args.liveness_port,
        "metrics_port": args.metrics_port,
        "listen_address": args.listen_address,
        "kubeconfig": args.kubeconfig,
        "log_format": args.log_format,
        "verbose": args.verbose,
        "workers": args.workers,
        "watch_inactivity_timeout": args.watch_inactivity_timeout,
    }
