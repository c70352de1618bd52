"""The reconcile engine: routes watch events to owner keys, and runs reconciles from a work queue.

Every watch event becomes at most one queued key: an owner's own events (spec changes, its first
sighting after the operator starts), and its children's events (RayJob status changes, claims binding,
Ray pods failing to pull an image) routed to the owner through the owner label. Bursts collapse in the
queue; a fixed number of worker tasks reconcile, never two at once for one owner. There is no polling:
a reconcile runs when something changed, or when a time recorded in status (next restart, deadline,
TTL) comes due.

An owner's events whose only change is the trainer's status patch (progress every few seconds) do not
queue a reconcile: they only refresh the per-job metrics. This module must not talk to the API itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import aiohttp

from trainop.controller import apply, kinds, kube, metrics, options, reconcile, workqueue

log = logging.getLogger(__name__)
# Failures that are the world's, not a bug: logged without a traceback and retried. Transport errors
# (an apiserver restarting, a request past its deadline) are among them.
_EXPECTED_ERRORS = (
    kube.ApiError,
    apply.ChildBeingDeleted,
    apply.ChildNotOurs,
    aiohttp.ClientError,
    asyncio.TimeoutError,
)


class Engine:
    def __init__(
        self, reconciler: reconcile.Reconciler, *, num_workers: int = options.DEFAULT_WORKERS
    ) -> None:
        self.queue: workqueue.WorkQueue[reconcile.OwnerKey] = workqueue.WorkQueue()
        self.owner_metrics = metrics.OwnerMetrics()
        self._reconciler = reconciler
        self._num_workers = num_workers
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._work(), name=f"reconcile-{i}") for i in range(self._num_workers)
        ]

    async def stop(self) -> None:
        self.queue.shut_down()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def healthy(self) -> bool:
        return bool(self._tasks) and not any(task.done() for task in self._tasks)

    # ------------------------------------------------------------------------------------- routing
    def owner_event(self, kind: kinds.Kind, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = body["metadata"]
        key = reconcile.OwnerKey(kind.kind, meta["namespace"], meta["name"])
        if event_type == "DELETED":
            self.owner_metrics.forget(kind, key.namespace, key.name)
            self.queue.drop(key)
            self._reconciler.forget(key)
            return
        self.owner_metrics.observe(kind, body)
        if event_type is None or needs_reconcile(body):
            self.queue.add(key)

    def child_event(self, body: Mapping[str, Any]) -> None:
        meta = body["metadata"]
        owner = kinds.owner_of(meta.get("labels") or {})
        if owner is not None:
            kind, name = owner
            self.queue.add(reconcile.OwnerKey(kind.kind, meta["namespace"], name))

    # -------------------------------------------------------------------------------------- workers
    async def _work(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except workqueue.ShutDown:
                return
            kind = kinds.BY_KIND[key.kind]
            started = time.monotonic()
            try:
                outcome = await self._reconciler.reconcile(key)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                delay = self.queue.retry_delay(key)
                metrics.record_reconcile(kind, ok=False, seconds=time.monotonic() - started)
                expected = isinstance(error, _EXPECTED_ERRORS)  # no traceback for the API saying no
                log.warning(
                    "%s: reconcile failed (%s: %s); retrying in %.1fs",
                    key,
                    type(error).__name__,
                    error,
                    delay,
                    exc_info=not expected,
                )
                self.queue.add_after(key, delay)
            else:
                self.queue.forget(key)
                metrics.record_reconcile(kind, ok=True, seconds=time.monotonic() - started)
                decision = outcome.decision
                if decision is not None and decision.restarted:
                    metrics.record_restart(kind)
                if decision is not None and decision.time_to_running is not None:
                    metrics.record_time_to_running(kind, decision.time_to_running)
                if outcome.requeue_after is not None:
                    self.queue.add_after(key, outcome.requeue_after)
            finally:
                self.queue.done(key)


def needs_reconcile(body: Mapping[str, Any]) -> bool:
    """Whether an owner's watch event may need the operator: a new generation, or never reconciled."""
    status: Mapping[str, Any] = body.get("status") or {}
    return not status.get("phase") or status.get("observedGeneration") != body["metadata"].get("generation")
