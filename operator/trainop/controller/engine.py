"""The reconcile engine: routes watch events to owner keys, and runs reconciles from a work queue.

Every watch event becomes at most one queued key: an owner's own events (spec changes, its first
sighting after the operator starts), and its children's events (RayJob status changes, claims binding,
Ray pods failing to pull an image) routed to the owner through the owner label -- or, for a claim that
carries none (the user's ``existingClaim``), through the cache's index of owners by claim name. Bursts
collapse in the queue; a fixed number of worker tasks reconcile, never two at once for one owner. There
is no polling: a reconcile runs when something changed, or when a time recorded in status (next
restart, deadline, TTL) comes due.

Events that tell the operator nothing new queue nothing: an owner's whose only change is the trainer's
status patch (progress every few seconds) only refreshes the per-job metrics, and a child's that is the
echo of the operator's own write (``own_writes``) is dropped. This module must not talk to the API itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import aiohttp

from trainop.controller import (
    apply,
    cache,
    conditions,
    kinds,
    kube,
    metrics,
    options,
    reconcile,
    relist,
    workqueue,
)

log = logging.getLogger(__name__)
# Failures that are the world's, not a bug: logged without a traceback and retried. Transport errors
# (an apiserver restarting, a request past its deadline) are among them.
_EXPECTED_ERRORS = (
    kube.ApiError,
    apply.ChildBeingDeleted,
    aiohttp.ClientError,
    asyncio.TimeoutError,
)


# New owners' first reconciles (which create their children) are served before the others; those wait
# at most NEW_OWNERS_HOLD_S seconds in a row while the last new ones run, and are served first once they
# have waited NEW_OWNERS_MAX_WAIT_S (``workqueue``).
NEW_OWNERS_HOLD_S = 5.0
NEW_OWNERS_MAX_WAIT_S = 30.0

# Watched children whose events only route (nothing of them is cached: see ``cache``).
SERVER_SIDE_APPLIED = frozenset({"ServiceAccount", "Role", "RoleBinding"})


class Engine:
    def __init__(
        self,
        reconciler: reconcile.Reconciler,
        children_cache: cache.Cache,
        *,
        num_workers: int = options.DEFAULT_WORKERS,
    ) -> None:
        self.queue: workqueue.WorkQueue[reconcile.OwnerKey] = workqueue.WorkQueue(
            hold=NEW_OWNERS_HOLD_S, max_wait=NEW_OWNERS_MAX_WAIT_S
        )
        self.owner_metrics = metrics.OwnerMetrics()
        self.cache = children_cache
        self._reconciler = reconciler
        self._num_workers = num_workers
        self._tasks: list[asyncio.Task[None]] = []
        #: Sweeps after every watch listing (``relist``); set by ``main`` once built with this engine.
        self.relists: relist.Relists | None = None

    # ------------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._work(), name=f"reconcile-{i}") for i in range(self._num_workers)
        ]

    async def stop(self) -> None:
        if self.relists is not None:
            await self.relists.stop()
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
            self.queue.add(key, new=never_reconciled(body))

    def listed(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """Every watch event, for ``relist`` (a listed object's has type None)."""
        if self.relists is not None:
            self.relists.event(event_type, body)

    def gone(self, ghost: relist.Gone) -> None:
        """An object deleted while no watch was open (``relist``): what its DELETED event would have done."""
        namespace, name = ghost.identity.namespace, ghost.identity.name
        kind = kinds.BY_KIND.get(ghost.kind)
        if kind is not None:
            if not ghost.replaced:  # a namesake was listed, and queued, as itself
                self.owner_event(kind, "DELETED", {"metadata": {"namespace": namespace, "name": name}})
            return
        for owner_kind, owner_name in ghost.owners:
            self.queue.add(reconcile.OwnerKey(owner_kind, namespace, owner_name))

    def child_event(self, body: Mapping[str, Any], *, deleted: bool = False) -> None:
        meta = body["metadata"]
        namespace, child_kind, name = str(meta.get("namespace")), str(body.get("kind")), str(meta["name"])
        owners: set[tuple[str, str]] = set()
        owner = kinds.owner_of(meta.get("labels") or {})
        if owner is not None:
            owners.add((owner[0].kind, owner[1]))
        if child_kind == "PersistentVolumeClaim" and self.cache.bound:
            owners.update(self.cache.owners_of_claim(namespace, name))
        own = self._reconciler.own_writes
        for kind, owner_name in owners:
            key = reconcile.OwnerKey(kind, namespace, owner_name)
            identity = {"uid": str(meta.get("uid")), "resource_version": str(meta.get("resourceVersion"))}
            if child_kind in SERVER_SIDE_APPLIED:
                echo = own.observe(
                    key,
                    child_kind,
                    name,
                    being_deleted=bool(meta.get("deletionTimestamp")),
                    deleted=deleted,
                    **identity,
                )
            else:
                echo = not deleted and own.is_echo(key, child_kind, name, **identity)
            if not echo:
                self.queue.add(key)

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
                result = await self._reconciler.reconcile(key)
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
                if result.requeue_after is not None:
                    self.queue.add_after(key, result.requeue_after)
            finally:
                self.queue.done(key)


def needs_reconcile(body: Mapping[str, Any]) -> bool:
    """Whether an owner's watch event may need the operator: a new generation, never reconciled, or the
    trainer's start-up check of a checkpoint bucket for this attempt that StorageReady does not show yet
    (the trainer's status writes are otherwise none of the operator's business)."""
    status: Mapping[str, Any] = body.get("status") or {}
    return (
        never_reconciled(body)
        or status.get("observedGeneration") != body["metadata"].get("generation")
        or _storage_check_unseen(status)
    )


def never_reconciled(body: Mapping[str, Any]) -> bool:
    """No reconcile has recorded a phase on this owner yet (its first one creates its children)."""
    return not (body.get("status") or {}).get("phase")


def _storage_check_unseen(status: Mapping[str, Any]) -> bool:
    """status.storage reports on the current attempt while StorageReady still says the bucket is unchecked."""
    reported = status.get("storage") or {}
    if not reported or reported.get("attempt") != status.get("attempt"):
        return False
    return any(
        c.get("type") == conditions.STORAGE_READY and c.get("reason") == conditions.OBJECT_STORAGE_UNCHECKED
        for c in status.get("conditions") or ()
    )
