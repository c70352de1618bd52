"""``relist``: which entries a sweep after a listing drops, and what the engine does for each.

The apiserver here is a dict answering the sweep's LIST and GET (the real one: the control-plane test
tests/reliability/test_relist_ghosts.py); the indexes are stand-ins with kopf's ``_discard``, keyed as
kopf keys an object's entries.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from trainop.controller import cache, engine, kinds, kube, metrics, own_writes, reconcile, relist

NS = "team-a"
OWNER_UID = "job-uid-1"  # the incarnation of job mlp the records are for


class Index(dict[Any, list[Any]]):
    """A kopf index: key -> records, each filed under the (namespace, name, uid) of its object."""

    def __init__(self) -> None:
        super().__init__()
        self.owners: dict[tuple[str, str, str], list[Any]] = {}

    def put(self, identity: tuple[str, str, str], key: Any, record: Any) -> None:
        self.setdefault(key, []).append(record)
        self.owners.setdefault(identity, []).append((key, record))

    def _discard(self, identity: tuple[str, str, str]) -> None:
        for key, record in self.owners.pop(identity, []):
            self[key].remove(record)
            if not self[key]:
                del self[key]


class Apiserver:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}  # (plural, name) -> object
        self.requests: list[tuple[str, str]] = []
        self.lists: list[tuple[str, str | None]] = []  # (plural, namespace or None: every namespace)
        self.after_list: list[tuple[str, dict[str, Any]]] = []  # created between the LIST and the GET

    def add(self, plural: str, name: str, uid: str) -> None:
        self.objects[(plural, name)] = {"metadata": {"name": name, "namespace": NS, "uid": uid}}

    async def list(
        self, resource: kube.Resource, namespace: str, *, label_selector: str | None = None
    ) -> Any:
        self.requests.append(("list", resource.plural))
        self.lists.append((resource.plural, namespace))
        found = [obj for (plural, _), obj in self.objects.items() if plural == resource.plural]
        for plural, obj in self.after_list:
            self.objects[(plural, obj["metadata"]["name"])] = obj
        self.after_list = []
        return found

    async def get(self, resource: kube.Resource, namespace: str, name: str) -> Any:
        self.requests.append(("get", name))
        return self.objects.get((resource.plural, name))


def ray_job(name: str, uid: str, owner: str) -> tuple[tuple[str, str, str], Any, Any]:
    seen = cache.Seen("RayJob", name, uid, "1", ("uid-" + owner,))
    return (NS, name, uid), (NS, "TrainingJob", owner), cache.RayJobRecord(seen, None)  # type: ignore[arg-type]


def build(*, clusterwide: bool = False) -> tuple[Apiserver, dict[str, Index], engine.Engine, relist.Relists]:
    apiserver = Apiserver()
    indexes = {
        cache.handler_id(cache.RAY_JOBS, "rayjobs"): Index(),
        cache.handler_id(cache.OWNERS_BY_CLAIM, "trainingjobs"): Index(),
    }
    children = cache.Cache(indexes)
    reconciler = reconcile.Reconciler(apiserver, children)  # type: ignore[arg-type]
    runtime = engine.Engine(reconciler, children)
    watched = [
        relist.watched_owner(kinds.TRAINING_JOB),
        relist.Watched(kube.RAY_JOBS, "RayJob", cache.RAY_JOBS, kinds.MANAGED_SELECTOR),
        relist.Watched(kube.SERVICE_ACCOUNTS, "ServiceAccount", None, kinds.MANAGED_SELECTOR),
    ]
    relists = relist.Relists(
        apiserver,  # type: ignore[arg-type]
        children,
        reconciler.own_writes,
        watched=watched,
        on_gone=runtime.gone,
        quiet_s=0.05,
        clusterwide=clusterwide,
    )
    runtime.relists = relists
    return apiserver, indexes, runtime, relists


def owner(index: Index, name: str, uid: str) -> None:
    index.put((NS, name, uid), (NS, f"{name}-ckpt"), cache.OwnerRecord("TrainingJob", name, uid))


async def queued(runtime: engine.Engine) -> set[reconcile.OwnerKey]:
    keys = set()
    while len(runtime.queue):
        key = await runtime.queue.get()
        keys.add(key)
        runtime.queue.done(key)
    return keys


async def test_a_sweep_drops_only_what_a_get_confirms_gone_and_queues_its_owner() -> None:
    apiserver, indexes, runtime, relists = build()
    jobs = indexes[cache.handler_id(cache.RAY_JOBS, "rayjobs")]
    for name, uid, job in (("mlp-a1", "r1", "mlp"), ("vit-a1", "r2", "vit"), ("new-a1", "r3", "new")):
        jobs.put(*ray_job(name, uid, job))
    apiserver.add("rayjobs", "mlp-a1", "r1")  # listed: kept without a GET
    # vit-a1 was deleted while no watch was open; new-a1 was created after the LIST and indexed already.
    apiserver.after_list = [("rayjobs", {"metadata": {"name": "new-a1", "namespace": NS, "uid": "r3"}})]

    gone = await relists.sweep({NS})

    assert [(g.kind, g.identity.name, g.owners, g.replaced) for g in gone] == [
        ("RayJob", "vit-a1", (("TrainingJob", "vit"),), False)
    ]
    assert set(jobs) == {(NS, "TrainingJob", "mlp"), (NS, "TrainingJob", "new")}
    assert ("get", "mlp-a1") not in apiserver.requests and ("get", "new-a1") in apiserver.requests
    assert await queued(runtime) == {reconcile.OwnerKey("TrainingJob", NS, "vit")}


def phase_value(name: str) -> float | None:
    labels = {"namespace": NS, "name": name, "kind": "TrainingJob", "phase": "Running"}
    return metrics.REGISTRY.get_sample_value("trainop_job_phase", labels)


async def test_an_owner_gone_is_forgotten_as_on_deleted_but_a_replaced_ones_namesake_is_left_alone() -> None:
    apiserver, indexes, runtime, relists = build()
    owners = indexes[cache.handler_id(cache.OWNERS_BY_CLAIM, "trainingjobs")]
    owner(owners, "gone", "u-gone")
    owner(owners, "mlp", "u-old")
    apiserver.add("trainingjobs", "mlp", "u-new")  # deleted and created again while no watch was open
    for name in ("gone", "mlp"):
        body = {"metadata": {"namespace": NS, "name": name}, "status": {"phase": "Running"}}
        runtime.owner_event(kinds.TRAINING_JOB, None, body)  # listed: queued, metrics set
    assert phase_value("gone") == 1 and phase_value("mlp") == 1

    gone = await relists.sweep({NS})

    assert sorted((g.identity.name, g.replaced) for g in gone) == [("gone", False), ("mlp", True)]
    assert not owners  # both stale entries dropped; the namesake's own listing files it again
    assert phase_value("gone") is None  # forgotten as on its DELETED event
    assert phase_value("mlp") == 1  # the namesake's series (same name) stays
    assert reconcile.OwnerKey("TrainingJob", NS, "mlp") in await queued(runtime)


async def test_an_own_write_of_a_child_gone_is_forgotten_so_the_next_reconcile_applies_it() -> None:
    _, _, runtime, relists = build()
    own = runtime._reconciler.own_writes
    key = reconcile.OwnerKey("TrainingJob", NS, "mlp")
    own.record(key, "ServiceAccount", "mlp-trainer", own_writes.Record("sa-1", "7", "f"), owner_uid=OWNER_UID)
    own.record(key, "Role", "mlp-trainer", own_writes.Record("role-1", "7", "f"), owner_uid=OWNER_UID)

    gone = await relists.sweep({NS})

    assert [(g.kind, g.identity.name) for g in gone] == [("ServiceAccount", "mlp-trainer")]
    assert not own.current(key, "ServiceAccount", "mlp-trainer", owner_uid=OWNER_UID, fingerprint="f")
    assert own.current(
        key, "Role", "mlp-trainer", owner_uid=OWNER_UID, fingerprint="f"
    )  # Role is not swept in this bed
    assert await queued(runtime) == {key}


async def test_only_a_listing_opens_a_wave_and_its_sweep_waits_until_the_listing_is_quiet() -> None:
    apiserver, _, runtime, relists = build()
    body = {"metadata": {"name": "x", "namespace": NS, "uid": "u"}}
    runtime.listed(None, body)  # the start's listing: it filled empty indexes, there is nothing to sweep
    await asyncio.sleep(0.15)
    assert (relists.waves, relists.sweeps, apiserver.requests) == (1, 0, [])

    for event_type in ("ADDED", "MODIFIED", "DELETED"):  # watching: none of these opens a wave
        runtime.listed(event_type, body)
    await asyncio.sleep(0.15)
    assert relists.waves == 1

    runtime.listed(None, body)  # a re-list
    await asyncio.sleep(0.02)
    runtime.listed(None, body)  # still listing: the sweep waits
    await asyncio.sleep(0.02)
    assert relists.sweeps == 0
    await asyncio.sleep(0.2)
    assert (relists.waves, relists.sweeps) == (2, 1)
    await runtime.stop()


async def test_a_listing_after_a_start_that_listed_nothing_is_swept() -> None:
    _, _, runtime, relists = build()
    body = {"metadata": {"name": "x", "namespace": NS, "uid": "u"}}
    runtime.listed("ADDED", body)  # the start listed nothing; a job was created since
    runtime.listed(None, body)  # then a re-list
    await asyncio.sleep(0.15)
    assert (relists.waves, relists.sweeps) == (1, 1)
    await runtime.stop()


def pod(name: str, attempt: int, owner_uid: str | None, phase: str = "Running") -> dict[str, Any]:
    labels = {"trainop.dev/job": "mlp", "trainop.dev/attempt": str(attempt)}
    if owner_uid is not None:
        labels["trainop.dev/owner-uid"] = owner_uid
    status = {"phase": phase}
    if phase == "Failed":
        terminated = {"reason": "OOMKilled", "exitCode": 137}
        status["containerStatuses"] = [{"name": "ray-worker", "state": {"terminated": terminated}}]  # type: ignore[list-item]
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "uid": f"u-{name}", "labels": labels},
        "status": status,
    }


def test_pods_are_told_apart_by_the_owner_incarnation_that_made_them() -> None:
    """A deleted namesake's attempt-1 pods are not the new job's attempt 1: their facts and problems are not
    its own, and while they may run they hold its first RayJob back. A pod made before the owner-uid label
    existed counts as the asking incarnation's."""
    index: dict[Any, list[Any]] = {}
    for body in (
        pod("old-a1-w", 1, "u-old", phase="Failed"),
        pod("old-a2-w", 2, "u-old"),
        pod("new-a1-w", 1, "u-new"),
        pod("unlabelled-a1-w", 1, None),
    ):
        for key, record in (cache.index_pod(body) or {}).items():
            index.setdefault(key, []).append(record)
    children = cache.Cache({cache.PODS: index})
    lives = children.pod_lives(NS, kinds.TRAINING_JOB, "mlp", 1, owner_uid="u-new")
    assert [life.name for life in lives] == ["new-a1-w", "unlabelled-a1-w"]
    assert children.pod_facts(NS, kinds.TRAINING_JOB, "mlp", 1, owner_uid="u-new") == ()
    assert children.pod_facts(NS, kinds.TRAINING_JOB, "mlp", 1, owner_uid="u-old") != ()
    namesakes = children.namesake_pod_lives(NS, kinds.TRAINING_JOB, "mlp", "u-new")
    assert [life.name for life in namesakes] == ["old-a2-w"]  # old-a1-w Failed: nothing runs there


async def test_a_re_list_on_an_operator_that_saw_no_watch_event_since_its_start_is_swept() -> None:
    """A quiet cluster: the start's listing, hours of nothing, an apiserver restart. The second listing
    is a re-list all the same."""
    _, _, runtime, relists = build()
    body = {"metadata": {"name": "x", "namespace": NS, "uid": "u"}}
    runtime.listed(None, body)
    await asyncio.sleep(0.15)
    runtime.listed(None, body)
    await asyncio.sleep(0.15)
    assert (relists.waves, relists.sweeps) == (2, 1)
    await runtime.stop()


@pytest.mark.parametrize(
    ("clusterwide", "lists"),
    [(True, [("rayjobs", None)]), (False, [("rayjobs", "team-a"), ("rayjobs", "team-b")])],
    ids=["cluster-wide: one LIST", "namespaced: one LIST per namespace"],
)
async def test_a_sweep_lists_each_resource_as_kopf_watches_it(
    clusterwide: bool, lists: list[tuple[str, str | None]]
) -> None:
    apiserver, indexes, _, relists = build(clusterwide=clusterwide)
    jobs = indexes[cache.handler_id(cache.RAY_JOBS, "rayjobs")]
    jobs.put(*ray_job("mlp-a1", "r1", "mlp"))
    _, _, record = ray_job("vit-a1", "r2", "vit")
    jobs.put(("team-b", "vit-a1", "r2"), ("team-b", "TrainingJob", "vit"), record)
    await relists.sweep({NS, "team-b"})
    assert apiserver.lists == lists  # resources the cache holds nothing of in those namespaces: no LIST
