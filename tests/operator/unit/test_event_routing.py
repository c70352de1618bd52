"""Routing watch events to owner keys (``engine``), and what deserves a reconcile."""

from __future__ import annotations

import asyncio
from typing import Any

import operator_factories as factories
import pytest

from trainop.controller import cache, engine, kinds, own_writes, reconcile

# The owners-by-claim index as kopf would hold it: mlp uses the user's claim "shared-data".
CLAIM_USERS = {
    ("team-a", "shared-data"): [cache.OwnerRecord("TrainingJob", "mlp", "uid-mlp")],
    ("team-a", "mlp-ckpt"): [cache.OwnerRecord("TrainingJob", "mlp", "uid-mlp")],
}


class NoReconciler(reconcile.Reconciler):
    """The engine under test only routes; its workers are never started."""

    def __init__(self, children: cache.Cache) -> None:
        super().__init__(client=None, children_cache=children)  # type: ignore[arg-type]


@pytest.fixture
def runtime() -> engine.Engine:
    children = cache.Cache({f"{index_id}__x": {} for index_id in cache.INDEX_IDS})
    children.bind({f"{cache.OWNERS_BY_CLAIM}__trainingjobs": CLAIM_USERS})
    return engine.Engine(NoReconciler(children), children)


async def queued(runtime: engine.Engine) -> list[reconcile.OwnerKey]:
    keys = []
    while len(runtime.queue):
        key = await runtime.queue.get()
        runtime.queue.done(key)
        keys.append(key)
    return keys


KEY = reconcile.OwnerKey("TrainingJob", "team-a", "mlp")
OWNER_UID = "job-uid-1"  # the incarnation of KEY the records are for


@pytest.mark.parametrize(
    ("generation", "status", "needed"),
    [
        (1, None, True),  # never reconciled
        (1, {"observedGeneration": 1}, True),  # no phase yet
        (2, {"phase": "Running", "observedGeneration": 1}, True),  # spec changed
        (2, {"phase": "Running", "observedGeneration": 2}, False),  # e.g. the trainer's progress patch
        (2, {"phase": "Running", "observedGeneration": 2, "progress": {"step": 5}}, False),
    ],
)
def test_owner_events_need_a_reconcile_only_for_a_new_generation_or_no_phase(
    generation: int, status: dict[str, Any] | None, needed: bool
) -> None:
    assert engine.needs_reconcile(factories.job(generation=generation, status=status)) is needed


async def test_the_initial_listing_queues_every_owner_even_if_up_to_date(runtime: engine.Engine) -> None:
    body = factories.job(status={"phase": "Running", "observedGeneration": 1})
    runtime.owner_event(kinds.TRAINING_JOB, None, body)
    assert await queued(runtime) == [KEY]


async def test_an_owner_without_a_phase_is_queued_new_and_served_before_the_others(
    runtime: engine.Engine,
) -> None:
    runtime.owner_event(kinds.TRAINING_JOB, None, factories.job(status={"phase": "Running"}))
    runtime.owner_event(kinds.TRAINING_JOB, "ADDED", factories.job(name="fresh"))
    assert await queued(runtime) == [reconcile.OwnerKey("TrainingJob", "team-a", "fresh"), KEY]


async def test_a_trainer_progress_patch_queues_nothing(runtime: engine.Engine) -> None:
    body = factories.job(status={"phase": "Running", "observedGeneration": 1, "progress": {"step": 7}})
    runtime.owner_event(kinds.TRAINING_JOB, "MODIFIED", body)
    assert await queued(runtime) == []


async def test_a_deleted_owner_is_forgotten_with_its_scheduled_reconciles(runtime: engine.Engine) -> None:
    runtime.queue.add_after(KEY, 0.05)
    runtime.owner_event(kinds.TRAINING_JOB, "DELETED", factories.job())
    await asyncio.sleep(0.1)
    assert await queued(runtime) == []


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"trainop.dev/job": "mlp"}, [KEY]),
        ({"trainop.dev/sweep": "lr"}, [reconcile.OwnerKey("TuningSweep", "team-a", "lr")]),
        ({"app.kubernetes.io/managed-by": "trainop"}, []),
        ({}, []),
    ],
)
async def test_child_events_are_routed_to_their_owner_by_label(
    runtime: engine.Engine, labels: dict[str, str], expected: list[reconcile.OwnerKey]
) -> None:
    runtime.child_event({"metadata": {"name": "x", "namespace": "team-a", "labels": labels}})
    assert await queued(runtime) == expected


async def test_a_claim_without_our_labels_wakes_the_owner_that_names_it_as_existing_claim(
    runtime: engine.Engine,
) -> None:
    runtime.child_event(
        {"kind": "PersistentVolumeClaim", "metadata": {"name": "shared-data", "namespace": "team-a"}}
    )
    runtime.child_event(
        {"kind": "PersistentVolumeClaim", "metadata": {"name": "unrelated", "namespace": "team-a"}}
    )
    assert await queued(runtime) == [KEY]


async def test_the_echo_of_the_operators_own_write_queues_nothing_and_any_later_change_does(
    runtime: engine.Engine,
) -> None:
    def role(version: str) -> dict[str, Any]:
        meta = {"name": "mlp-trainer", "namespace": "team-a", "uid": "u1", "resourceVersion": version}
        return {"kind": "Role", "metadata": {**meta, "labels": {"trainop.dev/job": "mlp"}}}

    own = runtime._reconciler.own_writes
    own.record(KEY, "Role", "mlp-trainer", own_writes.Record("u1", "7", "f"), owner_uid=OWNER_UID)
    runtime.child_event(role("7"))
    assert await queued(runtime) == []
    assert own.current(KEY, "Role", "mlp-trainer", owner_uid=OWNER_UID, fingerprint="f")
    runtime.child_event(role("8"))  # someone edited it: queued, and applied again by the next reconcile
    assert await queued(runtime) == [KEY]
    assert not own.current(KEY, "Role", "mlp-trainer", owner_uid=OWNER_UID, fingerprint="f")


async def test_a_burst_of_child_events_queues_the_owner_once(runtime: engine.Engine) -> None:
    for i in range(50):
        runtime.child_event(
            {"metadata": {"name": f"pod-{i}", "namespace": "team-a", "labels": {"trainop.dev/job": "mlp"}}}
        )
    assert await queued(runtime) == [KEY]


def test_event_names_are_the_same_for_the_same_transition_and_differ_across_owners_and_transitions() -> None:
    from trainop.controller import events, state_machine

    owner = factories.job()
    other = factories.job(uid="another-uid")
    restarting = state_machine.Event("Warning", "Restarting", "at 12:00:01", key="phase/Restarting/1/0/1")
    again = state_machine.Event("Warning", "Restarting", "at 12:00:02", key="phase/Restarting/1/0/1")
    later = state_machine.Event("Warning", "Restarting", "at 12:00:01", key="phase/Restarting/2/1/2")
    assert events.name(owner, restarting) == events.name(owner, again)
    assert events.name(owner, restarting) != events.name(other, restarting)
    assert events.name(owner, restarting) != events.name(owner, later)
    assert events.name(owner, restarting).startswith("mlp.")
