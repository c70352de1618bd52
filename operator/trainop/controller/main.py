"""Running the operator: ``run(namespaces, liveness_port=..., metrics_port=...)`` (``trainop operator``).

Wires the parts and hands control to kopf: a ``kube.Kube`` client, the children ``cache.Cache``, the
``reconcile.Reconciler``, the ``engine.Engine`` with its worker tasks, the kopf handlers and indexes on
a private registry (importing this package
registers nothing globally, so tests can run several operators in one process), kopf's liveness
endpoint, and prometheus-client's HTTP server for ``metrics.REGISTRY`` on its own port.

Scope: every namespace (``namespaces=None``) or the listed ones (kopf namespace patterns, e.g.
``["team-a", "ml-*"]``). The operator runs kopf standalone: one replica (the chart's Deployment, Recreate
strategy). kopf's peering, which lets several replicas take turns, is not offered: it needs kopf's peering
CRDs and RBAC the chart does not ship, and without them kopf pauses every handler without an error.
This module must not reconcile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import kopf
from kopf._core.engines import peering as kopf_peering  # Identity: kopf.operator's type, not re-exported

from trainop.controller import cache, engine, handlers, kube, metrics, options, reconcile, relist

log = logging.getLogger(__name__)


def run(
    namespaces: Sequence[str] | None = None,
    *,
    liveness_port: int | None = 8080,
    metrics_port: int | None = 9100,
    listen_address: str = "0.0.0.0",
    kubeconfig: str | None = None,
    log_format: str = "plain",
    verbose: bool = False,
    workers: int = options.DEFAULT_WORKERS,
    watch_inactivity_timeout: float | None = None,
) -> int:
    """Run the operator until SIGINT/SIGTERM; returns the process exit code (0).

    namespaces     None watches every namespace; otherwise the listed names or kopf glob patterns.
    liveness_port  kopf's liveness endpoint (http://<listen_address>:<port>/healthz); None disables it.
    metrics_port   Prometheus metrics (http://<listen_address>:<port>/metrics); None disables them.
    listen_address the address both listen on: every interface by default (a pod's probes and scrapes
                   come from outside it); 127.0.0.1 keeps them to the machine.
    kubeconfig     a kubeconfig path; default: in-cluster ServiceAccount, else $KUBECONFIG.
    log_format     "plain", "full" or "json" (one JSON object per line, for log pipelines).
    workers        concurrent reconciles (of different owners; one owner is never reconciled twice at once).
    watch_inactivity_timeout
                   seconds without any event (not even the apiserver's bookmarks, about one a minute) after
                   which a watch stream counts as dead and is re-established; None keeps kopf's 70 s.
    """
    formats = {"plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}
    kopf.configure(verbose=verbose, log_format=formats[log_format])
    if not verbose:  # kopf logs every handled watch event at INFO; ours are one-line enqueues
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if metrics_port is not None:
        metrics.serve(metrics_port, listen_address)
    asyncio.run(
        serve(
            namespaces,
            liveness_port=liveness_port,
            listen_address=listen_address,
            kubeconfig=kubeconfig,
            workers=workers,
            watch_inactivity_timeout=watch_inactivity_timeout,
        )
    )
    return 0


async def serve(
    namespaces: Sequence[str] | None,
    *,
    liveness_port: int | None,
    kubeconfig: str | None,
    listen_address: str = "0.0.0.0",
    workers: int,
    watch_inactivity_timeout: float | None = None,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    """The operator as a coroutine (embeddable: pass ``stop_flag`` to stop it)."""
    client = await kube.Kube.connect(kubeconfig)
    children = cache.Cache()
    reconciler = reconcile.Reconciler(client, children)
    runtime = engine.Engine(reconciler, children, num_workers=workers)
    runtime.relists = relist.Relists(
        client,
        children,
        reconciler.own_writes,
        watched=handlers.watched(),
        on_gone=runtime.gone,
        clusterwide=namespaces is None,
    )
    registry = kopf.OperatorRegistry()
    settings = kopf.OperatorSettings()
    settings.posting.enabled = False  # our own Events (events.py); kopf's would repeat log lines
    # kopf deep-copies every watched body into a "diff base" for change handlers; we register none (only
    # event handlers), so that copy -- the largest CPU cost per watch event -- would never be read.
    settings.persistence.diffbase_storage = NoDiffBase()
    # kopf runs one task per watched object while its events come in, and keeps it idle for this long
    # after the last one (default 5 s): in a burst of new jobs that is thousands of idle tasks at once
    # (each job has six watched children), most of the operator's peak memory. A task is cheap to start
    # again for the rare later event.
    settings.queueing.idle_timeout = 0.5
    # kopf's own requests (listings) get the same deadline as ours; a silent watch is re-established.
    settings.networking.request_timeout = kube.REQUEST_TIMEOUT_SECONDS
    if watch_inactivity_timeout is not None:
        settings.watching.inactivity_timeout = watch_inactivity_timeout
    handlers.register(registry, settings, runtime)
    _register_login(registry, kubeconfig)
    runtime.start()
    try:
        await kopf.operator(
            registry=registry,
            settings=settings,
            clusterwide=namespaces is None,
            namespaces=list(namespaces or ()),
            liveness_endpoint=f"http://{_host(listen_address)}:{liveness_port}/healthz"
            if liveness_port
            else None,
            # kopf would otherwise derive its identity from getpass.getuser(), which raises for a uid
            # without a passwd entry -- the chart's 65532 in a slim image (found on the cluster bed).
            identity=own_identity(),
            standalone=True,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        await runtime.stop()
        with contextlib.suppress(Exception):
            await client.close()


def own_identity() -> kopf_peering.Identity:
    """This operator's name among its peers: the pod's name (the chart's POD_NAME), else host and pid."""
    return kopf_peering.Identity(os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}")


def _register_login(registry: kopf.OperatorRegistry, kubeconfig: str | None) -> None:
    """kopf's watch streams authenticate exactly like ``kube.Kube``: the pod's ServiceAccount, else the
    kubeconfig (re-read at every login, so rotated ServiceAccount tokens and tokens from exec plugins are
    refreshed when kopf re-logs in).

    Not ``kopf.login_with_service_account``: it always connects to https://kubernetes.default.svc, while
    the operator's own client (the Kubernetes client's in-cluster loader) uses KUBERNETES_SERVICE_HOST and
    _PORT; one address for both (tests/security/test_in_cluster_credentials.py, with no cluster DNS).
    A private registry gets none of kopf's implicit login handlers, so the choice is explicit here.
    """

    @kopf.on.login(registry=registry)
    async def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        configuration = await kube.load_configuration(kubeconfig)
        header = configuration.api_key.get("BearerToken") or configuration.api_key.get("authorization") or ""
        scheme, _, token = header.partition(" ") if " " in header else ("", "", header)
        return kopf.ConnectionInfo(
            server=configuration.host,
            ca_path=configuration.ssl_ca_cert,
            insecure=not configuration.verify_ssl,
            scheme=scheme or None,
            token=token or None,
            certificate_path=configuration.cert_file,
            private_key_path=configuration.key_file,
        )


def _host(address: str) -> str:
    """An address as the host part of a URL (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address else address


class NoDiffBase(kopf.DiffBaseStorage):
    """A diff-base storage for an operator without change handlers: nothing is built, kept or written."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None
    ) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None
