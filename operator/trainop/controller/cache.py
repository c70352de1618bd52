"""What the watches hold about every owner's children, read by a reconcile without an API request.

The operator watches its children anyway, to learn when one changed; this module keeps what those watch
events carry, so that a reconcile reads its owner's RayJobs, claim, Ray pods, RayCluster, ConfigMap,
ServiceAccount, Role and RoleBinding from memory instead of listing or getting them.

**kopf indexes, not dicts of our own.** ``handlers.register`` installs one ``kopf.index`` per child
resource, whose function is :func:`index_function` of this module. kopf calls it on every watch event
(the initial listing included) and keeps its result until the object is deleted; and kopf runs no other
handler -- so queues no reconcile -- until every indexed resource has been listed completely. A reconcile
therefore never sees a half-listed cache after a start: that guarantee is why the children live in kopf
indexes.

**A re-list.** When a watch cannot resume (``410 Gone``: an apiserver restarted, or the operator's watch
was away longer than etcd keeps history), kopf lists the resource again and feeds every listed object to
the index functions -- but it removes an index entry only on a DELETED event, and an object deleted while
no watch was open gets none. Its entry would stay for good: a claim the operator never recreates, a RayJob
it believes running, a pod that holds the next attempt. ``relist`` finds such ghosts after every listing
(entries no listing event showed, confirmed gone by a GET) and drops them with :meth:`Cache.drop`.

**Slim records, not bodies.** Each index keeps only what a reconcile needs (``Seen`` and an observation
from ``observe``): a thousand jobs' children as whole bodies would be hundreds of megabytes of dicts.

Not everything watched is kept here. The ServiceAccount, Role and RoleBinding are watched only so that a
change someone makes to one is undone at once: their events go to ``own_writes`` (was it our own write
coming back?) and to the work queue, and nothing of them is stored -- a reconcile applies them unless this
process applied the same manifest and has seen no other change since. The trainer's ConfigMap is not
watched at all: that would take ``list`` on every ConfigMap of the cluster, which the operator must not
hold; ``reconcile`` reads it, once per owner and operator process.

**Where the cache is not trusted.** A watch is a little behind the apiserver, so a reconcile can see a
child it just deleted or miss one it just created. Every write that acts on the cache is safe against
that: a create of a child the cache missed answers 409 and counts as done (its ADDED event follows and
queues the owner again); deletes carry the uid the cache saw as a precondition; server-side apply needs
no prior read. The owner itself is not taken from a watch: ``reconcile`` reads it fresh, because its
status is the record of intent that each reconcile extends, and acting twice on a stale copy of it
could repeat a transition. Nothing else is read.

Claims are watched without a label selector: a claim named by ``checkpoint.storage.existingClaim`` is
the user's, carries no label of ours, and must still wake its owner when it appears or binds. The
``owners-by-claim`` index maps a claim's name to the owners that use it.

This module must not talk to the API or decide anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from trainop.controller import failures, kinds, observe

#: ``kopf.index`` ids, one per watched child resource, and the one index over owners.
RAY_JOBS = "trainop_rayjobs"
RAY_CLUSTERS = "trainop_rayclusters"
CLAIMS = "trainop_claims"
PODS = "trainop_pods"
OWNERS_BY_CLAIM = "trainop_owners_by_claim"
INDEX_IDS = (RAY_JOBS, RAY_CLUSTERS, CLAIMS, PODS, OWNERS_BY_CLAIM)


def handler_id(index_id: str, plural: str) -> str:
    """The ``kopf.index`` handler id of one cache index filled from one resource.

    One kopf index per handler id. Several resources may fill one cache index (OWNERS_BY_CLAIM): each gets
    its own kopf index, and the cache reads them together."""
    return f"{index_id}__{plural}"


@dataclasses.dataclass(frozen=True, slots=True)
class Identity:
    """Which object an index entry came from (kopf keys its entries by the same three)."""

    namespace: str
    name: str
    uid: str


@dataclasses.dataclass(frozen=True, slots=True)
class Seen:
    """A child as its last watch event showed it: identity, ownership and whether it is going away."""

    kind: str
    name: str
    uid: str
    resource_version: str
    owner_uids: tuple[str, ...] = ()
    being_deleted: bool = False

    def ownership(self, owner_uid: str) -> observe.Ownership:
        if not self.owner_uids:
            return observe.Ownership.NONE
        return observe.Ownership.THIS if owner_uid in self.owner_uids else observe.Ownership.OTHER

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


@dataclasses.dataclass(frozen=True, slots=True)
class RayJobRecord:
    seen: Seen
    observation: observe.RayJobObservation


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimRecord:
    seen: Seen
    observation: observe.ClaimObservation  # ownership not set: it depends on who asks

    def for_owner(self, owner_uid: str) -> observe.ClaimObservation:
        return dataclasses.replace(
            self.observation,
            being_deleted=self.seen.being_deleted,
            ownership=self.seen.ownership(owner_uid),
        )


def seen(body: Mapping[str, Any]) -> Seen:
    meta = body["metadata"]
    return Seen(
        kind=str(body.get("kind") or ""),
        name=str(meta["name"]),
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        owner_uids=tuple(str(r.get("uid")) for r in meta.get("ownerReferences") or ()),
        being_deleted=bool(meta.get("deletionTimestamp")),
    )


# --------------------------------------------------------------------------------- index functions
def _owner_key(body: Mapping[str, Any]) -> tuple[str, str, str] | None:
    meta = body["metadata"]
    owner = kinds.owner_of(meta.get("labels") or {})
    if owner is None:
        return None
    return (str(meta.get("namespace")), owner[0].kind, owner[1])


def index_ray_job(body: Mapping[str, Any]) -> dict[Any, RayJobRecord] | None:
    key = _owner_key(body)
    if key is None:
        return None
    return {key: RayJobRecord(seen(body), observe.ray_job(body))}


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterRecord:
    name: str
    uid: str
    problems: tuple[observe.Problem, ...]


def index_ray_cluster(body: Mapping[str, Any]) -> dict[Any, ClusterRecord]:
    meta = body["metadata"]
    name = str(meta["name"])
    problems = observe.cluster_problems(body.get("status") or {})
    record = ClusterRecord(name, str(meta.get("uid") or ""), problems)
    return {(str(meta.get("namespace")), name): record}


def index_claim(body: Mapping[str, Any]) -> dict[Any, ClaimRecord]:
    meta = body["metadata"]
    name = str(meta["name"])
    return {(str(meta.get("namespace")), name): ClaimRecord(seen(body), observe.claim(name, body))}


@dataclasses.dataclass(frozen=True, slots=True)
class PodRecord:
    name: str
    uid: str
    owner_uid: str  # the owner incarnation whose attempt made it ("": made before the label existed)
    problems: tuple[observe.Problem, ...]
    facts: tuple[failures.PodFact, ...]  # what would explain a failure of its attempt
    life: observe.PodLife  # whether its processes may still run, and until when


def index_pod(body: Mapping[str, Any]) -> dict[Any, PodRecord] | None:
    """A Ray pod under its owner's attempt, and under its owner's name (every attempt, every incarnation:
    a new incarnation waits for a deleted namesake's pods)."""
    key = _owner_key(body)
    labels = body["metadata"].get("labels") or {}
    attempt = labels.get(kinds.LABEL_ATTEMPT)
    if key is None or attempt is None:
        return None
    record = PodRecord(
        str(body["metadata"]["name"]),
        str(body["metadata"].get("uid") or ""),
        str(labels.get(kinds.LABEL_OWNER_UID) or ""),
        observe.pod_problems([body]),
        failures.pod_facts(body),
        observe.pod_life(body),
    )
    return {(*key, str(attempt)): record, key: record}


@dataclasses.dataclass(frozen=True, slots=True)
class OwnerRecord:
    kind: str
    name: str
    uid: str


def index_owner_claims(body: Mapping[str, Any]) -> dict[Any, OwnerRecord] | None:
    """An owner under every claim name it may use: the one it creates, and an ``existingClaim``."""
    kind = kinds.BY_KIND.get(str(body.get("kind")))
    if kind is None:
        return None
    meta = body["metadata"]
    namespace, name = str(meta.get("namespace")), str(meta["name"])
    names = {kind.created_claim_name(name)}
    existing = kinds.existing_claim_of(body)
    if existing:
        names.add(existing)
    record = OwnerRecord(kind.kind, name, str(meta.get("uid") or ""))
    return {(namespace, claim): record for claim in names}


def _name_and_uid(record: Any, key: tuple[Any, ...]) -> tuple[str, str]:
    if isinstance(record, (RayJobRecord, ClaimRecord)):
        return record.seen.name, record.seen.uid
    if isinstance(record, (PodRecord, ClusterRecord, OwnerRecord)):
        return record.name, record.uid
    raise TypeError(f"no identity in a {type(record).__name__} under {key}")


INDEX_FUNCTIONS: Mapping[str, Callable[[Mapping[str, Any]], Mapping[Any, Any] | None]] = {
    RAY_JOBS: index_ray_job,
    RAY_CLUSTERS: index_ray_cluster,
    CLAIMS: index_claim,
    PODS: index_pod,
}


# ------------------------------------------------------------------------------------------ reads
class Cache:
    """Read access to the indexes. kopf hands them to every handler; ``bind`` takes them from there.

    Each index maps a key to the records of the objects under it (a ``kopf.Store``; any iterable of
    records will do, which is how the unit tests fill one). kopf keeps one index per handler, and one
    cache index may be filled by several handlers (one per watched resource): their ids are
    ``<cache index id>__<plural>``, and a lookup reads all of them.
    """

    def __init__(self, indexes: Mapping[str, Mapping[Any, Iterable[Any]]] | None = None) -> None:
        self._indexes: dict[str, list[Mapping[Any, Iterable[Any]]]] = {}
        self._by_handler: dict[str, Mapping[Any, Iterable[Any]]] = {}
        if indexes is not None:
            self.bind(indexes)

    def bind(self, indexes: Mapping[str, Any]) -> None:
        """Take the indexes from a handler's keyword arguments (the same live objects every time)."""
        for handler_id, index in indexes.items():
            index_id = handler_id.split("__", 1)[0]
            if index_id in INDEX_IDS:
                bound = self._indexes.setdefault(index_id, [])
                if all(index is not other for other in bound):
                    bound.append(index)
                self._by_handler[handler_id] = index

    def identities(self, index_id: str, plural: str) -> dict[Identity, set[tuple[str, str]]]:
        """Every object the index filled from this resource holds entries of, with the owners (kind,
        name) its entries are filed under, where its key names them (for ``relist``)."""
        index = self._by_handler.get(handler_id(index_id, plural))
        found: dict[Identity, set[tuple[str, str]]] = {}
        for key in list(index or ()):
            for record in list(index[key]) if index is not None else ():
                name, uid = _name_and_uid(record, key)
                owners = found.setdefault(Identity(str(key[0]), name, uid), set())
                if index_id in (RAY_JOBS, PODS):  # (namespace, owner kind, owner name, ...)
                    owners.add((str(key[1]), str(key[2])))
        return found

    def drop(self, index_id: str, plural: str, identity: Identity) -> None:
        """Forget an object that is gone although no DELETED event said so (``relist``), as kopf forgets
        one on DELETED. kopf keys an object's entries by (namespace, name, uid) and removes them with its
        indexes' ``_discard``, an internal protocol of kopf 1.45 (pinned in pyproject.toml; the
        control-plane test of ``relist`` fails if it changes)."""
        index = self._by_handler.get(handler_id(index_id, plural))
        if index is not None:
            index._discard((identity.namespace, identity.name, identity.uid))  # type: ignore[attr-defined]

    @property
    def bound(self) -> bool:
        return len(self._indexes) == len(INDEX_IDS)

    def _get(self, index_id: str, key: Any) -> list[Any]:
        indexes = self._indexes.get(index_id)
        if indexes is None:
            raise RuntimeError(f"index {index_id} is not bound: no watch event was handled yet")
        return [record for index in indexes if key in index for record in index[key]]

    def ray_jobs(self, namespace: str, kind: kinds.Kind, owner: str) -> list[RayJobRecord]:
        """Every RayJob labelled with this owner's name, whichever owner incarnation made it."""
        return self._get(RAY_JOBS, (namespace, kind.kind, owner))

    def ray_cluster_problems(self, namespace: str, name: str) -> tuple[observe.Problem, ...] | None:
        found: list[ClusterRecord] = self._get(RAY_CLUSTERS, (namespace, name))
        return found[0].problems if found else None

    def claim(self, namespace: str, name: str) -> ClaimRecord | None:
        found: list[ClaimRecord] = self._get(CLAIMS, (namespace, name))
        # Two incarnations share a name only while one is being deleted: the live one is the claim.
        found.sort(key=lambda r: r.seen.being_deleted)
        return found[0] if found else None

    def _pods(
        self, namespace: str, kind: kinds.Kind, owner: str, attempt: int, *, owner_uid: str
    ) -> list[PodRecord]:
        pods: list[PodRecord] = self._get(PODS, (namespace, kind.kind, owner, str(attempt)))
        return sorted((p for p in pods if p.owner_uid in ("", owner_uid)), key=lambda p: p.name)

    def pod_problems(
        self, namespace: str, kind: kinds.Kind, owner: str, attempt: int, *, owner_uid: str
    ) -> tuple[observe.Problem, ...]:
        """Of this owner incarnation's attempt: its Ray pods' problems (a pod without the owner-uid label,
        made before there was one, counts as this incarnation's)."""
        pods = self._pods(namespace, kind, owner, attempt, owner_uid=owner_uid)
        return tuple(problem for pod in pods for problem in pod.problems)

    def pod_facts(
        self, namespace: str, kind: kinds.Kind, owner: str, attempt: int, *, owner_uid: str
    ) -> tuple[failures.PodFact, ...]:
        pods = self._pods(namespace, kind, owner, attempt, owner_uid=owner_uid)
        return tuple(fact for pod in pods for fact in pod.facts)

    def pod_lives(
        self, namespace: str, kind: kinds.Kind, owner: str, attempt: int, *, owner_uid: str
    ) -> tuple[observe.PodLife, ...]:
        """The attempt's Ray pods whose processes may still run (``observe.PodLife``), by name."""
        pods = self._pods(namespace, kind, owner, attempt, owner_uid=owner_uid)
        return tuple(pod.life for pod in pods if not pod.life.ended)

    def namesake_pod_lives(
        self, namespace: str, kind: kinds.Kind, owner: str, owner_uid: str
    ) -> tuple[observe.PodLife, ...]:
        """Ray pods labelled with this owner's name that another (deleted) incarnation made, and whose
        processes may still run, by name."""
        pods: list[PodRecord] = self._get(PODS, (namespace, kind.kind, owner))
        others = (p for p in pods if p.owner_uid not in ("", owner_uid) and not p.life.ended)
        return tuple(sorted((p.life for p in others), key=lambda life: life.name))

    def owners_of_claim(self, namespace: str, claim: str) -> list[tuple[str, str]]:
        """(kind, name) of every owner that creates or names this claim."""
        owners: list[OwnerRecord] = self._get(OWNERS_BY_CLAIM, (namespace, claim))
        return [(owner.kind, owner.name) for owner in owners]
