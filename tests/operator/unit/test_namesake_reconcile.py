"""A job deleted and created again under its name is another job: nothing decided from the deleted one is
written onto it, and nothing this process kept of the deleted one (what it wrote, the refusals it met) is
taken for its own.

Runs ``reconcile.Reconciler`` unchanged against ``fake_apiserver.FakeKube`` -- a MOCK of the apiserver
(see its docstring; it refuses a patch of another uid as the real one does, which
tests/operator/integration/test_owner_incarnations.py checks against kube-apiserver) -- and
``fake_apiserver.Watches``, which plays kopf's watches into the real ``cache`` indexes.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import jsonpatch
import operator_factories as factories
import pytest
from fake_apiserver import FakeKube, merge
from test_reconcile_requests import KEY, Operator, claims_over_quota, new_job, storage_ready

from trainop.controller import acceptance, incarnation, kinds, reconcile

OLD_UID = "0f0e0d0c-0000-4000-8000-0000000000aa"


class DeletedWhileReconciling(FakeKube):
    """The user deletes the job -- and, unless ``recreate`` is False, creates it again under its name --
    right after a reconcile read it: the reconcile goes on with the deleted one's body."""

    def __init__(self, *, recreate: bool = True) -> None:
        super().__init__()
        self.armed = False
        self.recreate = recreate
        self.namesake: dict[str, Any] | None = None

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        answer = await super().request(method, path, **kwargs)
        if self.armed and method == "GET" and path.endswith("/trainingjobs/mlp"):
            self.armed = False
            del self.objects[path.strip("/")]
            if self.recreate:
                self.namesake = self.put(factories.job(uid=None))
        return answer


def with_accepted_spec(body: dict[str, Any]) -> dict[str, Any]:
    """A job whose accepted spec is recorded already: a reconcile of it writes only its status."""
    accepted = acceptance.serialise(kinds.parse(body).spec.to_wire())
    body["metadata"]["annotations"] = {kinds.ANNOTATION_APPLIED_SPEC: accepted}
    return body


@pytest.mark.parametrize("accepted_before", [False, True], ids=["annotation-and-status", "status-only"])
async def test_a_reconcile_decided_from_a_deleted_job_writes_nothing_onto_its_namesake(
    accepted_before: bool,
) -> None:
    fake = DeletedWhileReconciling()
    operator = Operator(fake)
    old = factories.job(uid=OLD_UID)
    fake.put(with_accepted_spec(old) if accepted_before else old)
    fake.armed = True

    result = await operator.reconciler.reconcile(KEY)

    namesake = fake.get_object("TrainingJob", "mlp")
    assert namesake is not None and fake.namesake is not None
    assert namesake["metadata"]["uid"] == fake.namesake["metadata"]["uid"]
    assert "status" not in namesake
    assert kinds.ANNOTATION_APPLIED_SPEC not in (namesake["metadata"].get("annotations") or {})
    assert fake.get_object("RayJob", "mlp-a1") is None  # nothing that depends on the record
    assert result.requeue_after == 0.0  # not an error: the namesake is reconciled at once, from scratch

    await operator.reconcile()
    recorded = fake.get_object("TrainingJob", "mlp")
    assert recorded is not None and recorded["status"]["attempt"] == 1
    assert recorded["metadata"]["annotations"][kinds.ANNOTATION_APPLIED_SPEC]


async def test_a_reconcile_of_a_job_deleted_meanwhile_ends_quietly_and_the_next_finds_nothing() -> None:
    fake = DeletedWhileReconciling(recreate=False)
    operator = Operator(fake)
    fake.put(factories.job(uid=OLD_UID))
    fake.armed = True

    assert (await operator.reconciler.reconcile(KEY)).requeue_after == 0.0
    assert await operator.reconciler.reconcile(KEY) == reconcile.Result()


def delete_unseen(fake: FakeKube, owner_uid: str) -> None:
    """The job and what the garbage collector deletes with it (its children that it owns), deleted while
    the operator's watch of jobs was away: no DELETED event made the reconciler forget it."""
    fake.objects = {
        path: obj
        for path, obj in fake.objects.items()
        if obj["metadata"]["uid"] != owner_uid
        and owner_uid not in [r["uid"] for r in obj["metadata"].get("ownerReferences") or ()]
    }


async def test_a_namesake_writes_the_config_its_deleted_predecessor_had_written_for_the_same_attempt(
    fake: FakeKube,
) -> None:
    operator = Operator(fake)
    old = new_job(fake)
    assert "apply ConfigMap mlp-trainer" in await operator.reconcile()
    delete_unseen(fake, old["metadata"]["uid"])
    assert fake.get_object("ConfigMap", "mlp-trainer") is None
    namesake = new_job(fake)

    assert "apply ConfigMap mlp-trainer" in await operator.reconcile()
    config = fake.get_object("ConfigMap", "mlp-trainer")
    assert config is not None
    assert [r["uid"] for r in config["metadata"]["ownerReferences"]] == [namesake["metadata"]["uid"]]


async def test_a_namesake_does_not_report_the_claim_refusal_its_deleted_predecessor_met(
    fake: FakeKube,
) -> None:
    operator = Operator(fake)
    old = new_job(fake)
    fake.fail_on = claims_over_quota
    for _ in range(2):  # the second one records the refusal on the status
        with pytest.raises(Exception, match="exceeded quota"):
            await operator.reconcile()
    assert storage_ready(fake) == ("False", "QuotaExceeded")
    delete_unseen(fake, old["metadata"]["uid"])
    fake.fail_on = lambda _: None  # the quota allows it now
    new_job(fake)

    await operator.reconcile()
    assert storage_ready(fake) == ("False", "ClaimPending")


@pytest.fixture
def fake() -> FakeKube:
    return FakeKube()


STATUS_CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "a phase changes, the trainer's keys stay",
        {"phase": "Pending", "attempt": 1, "progress": {"step": 7}},
        {"phase": "Running"},
    ),
    (
        "a nested object is merged, not replaced",
        {"children": {"rayJob": "mlp-a1", "configMap": "mlp-trainer"}, "checkpoint": {"step": 10}},
        {"children": {"rayJob": "mlp-a2"}},
    ),
    (
        "a null removes a key",
        {"phase": "Restarting", "nextRestartTime": "2026-03-01T12:00:05Z"},
        {"nextRestartTime": None},
    ),
    (
        "a null of an absent key is nothing",
        {"phase": "Running"},
        {"nextRestartTime": None, "phase": "Failed"},
    ),
    (
        "an object replaces a scalar, its nulls set nothing",
        {"goodput": 3},
        {"goodput": {"ratio": 0.9, "lost": None}},
    ),
    (
        "a list is replaced whole",
        {"conditions": [{"type": "A"}, {"type": "B"}]},
        {"conditions": [{"type": "C"}]},
    ),
    ("a key with a slash and a tilde", {"a/b~c": 1, "x": 2}, {"a/b~c": 3}),
    ("a new object under a missing key", {"phase": "Pending"}, {"restartsByReason": {"Preempted": 1}}),
]


@pytest.mark.parametrize(
    ("stored", "patch"), [case[1:] for case in STATUS_CASES], ids=[c[0] for c in STATUS_CASES]
)
def test_the_status_json_patch_makes_the_change_the_merge_patch_makes(
    stored: Mapping[str, Any], patch: Mapping[str, Any]
) -> None:
    owner = {"metadata": {"name": "mlp", "uid": "u-1"}, "status": copy.deepcopy(dict(stored))}
    operations = incarnation.status_operations(patch, stored, uid="u-1")
    assert jsonpatch.apply_patch(owner, operations)["status"] == merge(stored, patch)


def test_the_status_json_patch_is_refused_by_another_incarnation() -> None:
    namesake = {"metadata": {"name": "mlp", "uid": "u-2"}, "status": {"phase": "Pending"}}
    operations = incarnation.status_operations({"phase": "Running"}, {"phase": "Pending"}, uid="u-1")
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(namesake, operations)
