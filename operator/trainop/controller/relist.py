"""After a watch listing, forget the objects that were deleted while no watch was open.

kopf lists a resource when its watch starts and again whenever the watch cannot resume (``410 Gone``: an
apiserver restarted, or the watch was away longer than etcd keeps history). It feeds every listed object to
the index functions, but it removes an object's index entries only on a DELETED event -- and an object
deleted while no watch was open gets none. Left alone, such a ghost stays in the ``cache`` for good: a claim
the operator never creates again, a RayJob it believes running, a pod that holds the next attempt
(``WaitingForPreviousAttempt``), a RayJob of a deleted namesake the owner waits for, a deleted owner's
metrics. The operator's record of its own server-side applied writes (``own_writes``) has the same blind
spot: it would skip applying a ServiceAccount that is gone.

**When.** A listing shows itself as events of type None (kopf's convention for listed objects). The first
one opens a *wave*; the wave closes once no listed object has come for ``quiet_s`` seconds (kopf yields a
listing's pages back to back). Then every namespace the wave listed objects in is *swept*, for every watched
resource: an apiserver restart re-lists every resource at once, and one wave covers them all; kopf re-lists
one resource alone when only its watch fell too far behind, which the sweep covers too. A wave that opens
before any watch event came is the operator's start: it filled empty indexes, so it left no ghost, and it is
not swept.

**How.** For each watched resource that the cache holds objects of in a swept namespace: a LIST (paged, with
the watch's label selector) of what exists now, as kopf watches -- across the cluster at once, or namespace
by namespace when the operator serves a list of namespaces; every index entry (and own-writes record) whose
uid the LIST lacks is a candidate, and a GET confirms it -- gone, or replaced by a namesake with another uid
-- before it is dropped: an object created after the LIST, already indexed, is never dropped. Then the
owners it concerned, where its index or own-writes record names them (a RayJob, a Ray pod, a claim, a
server-side applied child; not a RayCluster), are queued, as its DELETED event would have done. A failed
sweep is retried (``SWEEP_RETRY_DELAYS_S``) and the wave's namespaces are kept until it succeeds.

Cost: per wave, one LIST per watched resource (per served namespace, for an operator given a list of them)
-- what kopf's listing of every resource costs -- and a GET per candidate (normally only the ghosts),
however many resources the wave re-listed. Nothing runs between listings: no polling.

Not covered: a namespace whose every watched object was deleted in the gap lists nothing and opens no wave;
its ghosts concern no existing owner, and a namesake created later is swept at the next listing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import aiohttp

from trainop.controller import cache, kinds, kube, own_writes, reconcile

log = logging.getLogger(__name__)

#: Seconds without a listed object after which a listing is taken as over.
LISTING_QUIET_S = 5.0
#: Pauses before retrying a sweep that failed (the apiserver still coming back, typically).
SWEEP_RETRY_DELAYS_S = (5.0, 15.0, 30.0, 60.0)
#: GETs in flight at once while confirming candidates.
CONFIRM_CONCURRENCY = 8


Owner = tuple[str, str]  # (kind, name)
Held = dict[cache.Identity, set[Owner]]


@dataclasses.dataclass(frozen=True)
class Watched:
    """A watched resource: how to list it as its watch does, and where its objects are remembered."""

    resource: kube.Resource
    kind: str
    #: The cache index it fills (None: only ``own_writes`` remembers its objects, if anything does).
    index_id: str | None
    #: The watch's server-side label selector; None watches every object.
    label_selector: str | None


@dataclasses.dataclass(frozen=True)
class Gone:
    """An object the cache or ``own_writes`` held that no longer exists (or is another incarnation now)."""

    kind: str
    identity: cache.Identity
    #: (kind, name) of the owners it concerned, to be queued.
    owners: tuple[Owner, ...]
    #: A namesake (another uid) exists: only this incarnation is gone.
    replaced: bool


@dataclasses.dataclass
class _Wave:
    at_start: bool  # opened before any watch event: the start's listing
    namespaces: set[str] = dataclasses.field(default_factory=set)
    last_listed: float = 0.0


class Relists:
    def __init__(
        self,
        client: kube.Kube,
        children_cache: cache.Cache,
        own: own_writes.OwnWrites,
        *,
        watched: Sequence[Watched],
        on_gone: Callable[[Gone], None],
        clusterwide: bool = False,
        quiet_s: float = LISTING_QUIET_S,
        retry_delays_s: Sequence[float] = SWEEP_RETRY_DELAYS_S,
    ) -> None:
        self._kube = client
        self._cache = children_cache
        self._own = own
        self._watched = tuple(watched)
        self._on_gone = on_gone
        self._clusterwide = clusterwide
        self._quiet_s = quiet_s
        self._retry_delays_s = tuple(retry_delays_s)
        self._wave: _Wave | None = None
        self._watching = False  # a watch event (not a listed object) was seen
        self._task: asyncio.Task[None] | None = None
        #: Listings seen, sweeps done and objects dropped, for the logs and the tests.
        self.waves = 0
        self.sweeps = 0
        self.dropped = 0

    def event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """Every watch event of every watched resource; a listed one (type None) opens or extends a wave."""
        if event_type is not None:
            self._watching = True
            return
        if self._wave is None:
            self._wave = _Wave(at_start=not self._watching)
        self._wave.namespaces.add(str(body["metadata"].get("namespace")))
        self._wave.last_listed = time.monotonic()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._settle(), name="relist-sweep")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _settle(self) -> None:
        pending: set[str] = set()
        retries = iter(self._retry_delays_s)
        while True:
            wave = self._wave
            if wave is not None:
                quiet_for = time.monotonic() - wave.last_listed
                if quiet_for < self._quiet_s:
                    await asyncio.sleep(self._quiet_s - quiet_for)
                    continue
                self._wave = None
                self.waves += 1
                # The start's listing filled empty indexes: it left no ghost. Every later one may have: a
                # re-list on an operator that saw no watch event since its start included.
                self._watching = True
                if not wave.at_start:
                    pending |= wave.namespaces
            if not pending:
                return
            try:
                await self.sweep(pending)
            except (TimeoutError, kube.ApiError, aiohttp.ClientError, OSError) as error:
                delay = next(retries, None)
                if delay is None:
                    log.warning("gave up sweeping after a listing (%s); the next listing sweeps again", error)
                    return
                log.warning("sweeping after a listing failed (%s); retrying in %.0fs", error, delay)
                await asyncio.sleep(delay)
                continue
            pending = set()
            retries = iter(self._retry_delays_s)

    async def sweep(self, namespaces: Collection[str]) -> list[Gone]:
        """Drop what the cache and ``own_writes`` hold in these namespaces that no longer exists."""
        gone: list[Gone] = []
        limit = asyncio.Semaphore(CONFIRM_CONCURRENCY)
        for watched in self._watched:
            held = self._held(watched, namespaces)
            swept = sorted(n for n in namespaces if held.get(n))
            if not swept:
                continue
            live: set[str] = set()
            # Listed as kopf watches: across the cluster in one paged LIST, or namespace by namespace.
            for namespace in [None] if self._clusterwide else swept:
                selector = watched.label_selector
                found = await self._kube.list(watched.resource, namespace, label_selector=selector)
                live.update(str(obj["metadata"].get("uid")) for obj in found)
            candidates = [(i, owners) for n in swept for i, owners in held[n].items() if i.uid not in live]
            confirmed = await asyncio.gather(
                *(self._confirm(watched, identity, owners, limit) for identity, owners in candidates)
            )
            gone.extend(g for g in confirmed if g is not None)
        for ghost in gone:
            self._forget(ghost)
        self.sweeps += 1
        self.dropped += len(gone)
        if gone:
            log.info(
                "after a listing: %d object(s) deleted while no watch was open forgotten (%s)",
                len(gone),
                ", ".join(f"{g.kind} {g.identity.namespace}/{g.identity.name}" for g in gone[:10]),
            )
        return gone

    def _held(self, watched: Watched, namespaces: Collection[str]) -> dict[str, Held]:
        """What the cache and ``own_writes`` hold of this resource in these namespaces, with its owners."""
        held: dict[str, Held] = {}
        if watched.index_id is not None:
            for identity, owners in self._cache.identities(watched.index_id, watched.resource.plural).items():
                if identity.namespace in namespaces:
                    held.setdefault(identity.namespace, {}).setdefault(identity, set()).update(owners)
        for owner, name, uid in self._own.children_of_kind(watched.kind):
            namespace = str(getattr(owner, "namespace", ""))
            if namespace in namespaces:
                identity = cache.Identity(namespace, name, uid)
                held.setdefault(namespace, {}).setdefault(identity, set()).add((owner.kind, owner.name))
        return held

    async def _confirm(
        self, watched: Watched, identity: cache.Identity, owners: set[Owner], limit: asyncio.Semaphore
    ) -> Gone | None:
        async with limit:
            body = await self._kube.get(watched.resource, identity.namespace, identity.name)
        uid = None if body is None else str(body["metadata"].get("uid"))
        if uid == identity.uid:
            return None  # created after the LIST, or listed late: it exists
        if watched.kind == "PersistentVolumeClaim":
            owners = owners | set(self._cache.owners_of_claim(identity.namespace, identity.name))
        return Gone(watched.kind, identity, tuple(sorted(owners)), replaced=uid is not None)

    def _forget(self, ghost: Gone) -> None:
        for watched in self._watched:
            if watched.kind == ghost.kind and watched.index_id is not None:
                self._cache.drop(watched.index_id, watched.resource.plural, ghost.identity)
        namespace, name, uid = ghost.identity.namespace, ghost.identity.name, ghost.identity.uid
        owners = [reconcile.OwnerKey(kind, namespace, owner) for kind, owner in ghost.owners]
        self._own.forget_child(owners, ghost.kind, name, uid)
        self._on_gone(ghost)


def watched_owner(kind: kinds.Kind) -> Watched:
    return Watched(kube.Resource(kind.api_version, kind.plural), kind.kind, cache.OWNERS_BY_CLAIM, None)
