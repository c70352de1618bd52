"""The requests one reconcile makes, in order: the write-order and crash-safety contract, in milliseconds.

Runs ``reconcile.Reconciler`` unchanged against ``fake_apiserver.FakeKube`` -- a MOCK of the apiserver
(in-memory store behind the client's one HTTP method; see its docstring for what it does not do) -- and
``fake_apiserver.Watches``, which plays kopf's watches into the real ``cache`` indexes. What needs a real
apiserver (schemas, RBAC, admission, garbage collection, real watches) stays in tests/operator/integration.
"""

from __future__ import annotations

import datetime
from typing import Any

import operator_factories as factories
import pytest
from fake_apiserver import FakeKube, Request, Watches

from trainop.controller import kinds, kube, reconcile

NOW = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.UTC)
KEY = reconcile.OwnerKey("TrainingJob", "team-a", "mlp")
FIRST_WAVE = {
    "create PersistentVolumeClaim mlp-ckpt",
    "apply ConfigMap mlp-trainer",
    "apply ServiceAccount mlp-trainer",
    "apply Role mlp-trainer",
}


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime.datetime:
        return self.now


@pytest.fixture
def fake() -> FakeKube:
    return FakeKube()


@pytest.fixture
def watches(fake: FakeKube) -> Watches:
    return Watches(fake)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def reconciler(fake: FakeKube, watches: Watches, clock: Clock) -> reconcile.Reconciler:
    return reconcile.Reconciler(fake, watches.cache, clock=clock)


def new_job(fake: FakeKube, **spec: Any) -> dict[str, Any]:
    body = factories.job(spec=spec or None, uid=None)
    return fake.put(body)


def kuberay(fake: FakeKube, name: str, job_status: str, deployment: str) -> None:
    """What KubeRay writes on a RayJob's status (the only other writer here)."""
    ray_job = fake.get_object("RayJob", name)
    assert ray_job is not None
    fake.put({**ray_job, "status": {"jobStatus": job_status, "jobDeploymentStatus": deployment}})


async def test_a_new_job_writes_its_status_then_its_children_in_waves_and_the_rayjob_last(
    fake: FakeKube, watches: Watches, clock: Clock
) -> None:
    new_job(fake)
    watches.sync()
    await reconciler(fake, watches, clock).reconcile(KEY)
    writes = fake.writes()
    # The owner is read fresh; the children are not read at all (the watches hold them).
    assert [str(r) for r in fake.requests if r.verb in ("get", "list")] == ["get TrainingJob mlp"]
    assert writes[0] == "patch-status TrainingJob mlp"  # the record of intent comes first
    assert set(writes[1:5]) == FIRST_WAVE
    assert writes[5:] == ["apply RoleBinding mlp-trainer", "create RayJob mlp-a1"]
    owner = fake.get_object("TrainingJob", "mlp")
    assert owner is not None and owner["status"]["children"]["rayJob"] == "mlp-a1"
    assert owner["status"]["appliedSpec"]  # the accepted spec, in the same write


async def test_a_reconcile_that_finds_everything_in_place_reads_the_owner_and_writes_nothing(
    fake: FakeKube, watches: Watches, clock: Clock
) -> None:
    new_job(fake)
    watches.sync()
    reconcile_ = reconciler(fake, watches, clock)
    await reconcile_.reconcile(KEY)
    watches.sync()
    fake.clear()
    await reconcile_.reconcile(KEY)
    assert [str(r) for r in fake.requests] == ["get TrainingJob mlp"]


async def test_a_restarted_operator_applies_the_rbac_children_once_and_leaves_the_attempts_config(
    fake: FakeKube, watches: Watches, clock: Clock
) -> None:
    new_job(fake)
    watches.sync()
    await reconciler(fake, watches, clock).reconcile(KEY)
    watches.sync()
    fake.clear()
    restarted = reconciler(fake, watches, clock)  # a new process: it never applied anything
    await restarted.reconcile(KEY)
    assert sorted(fake.writes()) == [
        "apply Role mlp-trainer",
        "apply RoleBinding mlp-trainer",
        "apply ServiceAccount mlp-trainer",
    ]
    watches.sync()
    fake.clear()
    await restarted.reconcile(KEY)
    assert fake.writes() == []


async def test_a_child_someone_else_changed_is_applied_again_and_only_that_one(
    fake: FakeKube, watches: Watches, clock: Clock
) -> None:
    new_job(fake)
    watches.sync()
    reconcile_ = reconciler(fake, watches, clock)
    await reconcile_.reconcile(KEY)
    role = fake.get_object("Role", "mlp-trainer")
    assert role is not None
    fake.put({**role, "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]})  # an edit
    watches.sync()
    fake.clear()
    await reconcile_.reconcile(KEY)
    assert fake.writes() == ["apply Role mlp-trainer"]
    repaired = fake.get_object("Role", "mlp-trainer")
    assert repaired is not None and repaired["rules"][0]["resourceNames"] == ["mlp"]


async def test_a_crash_after_the_status_write_is_finished_by_the_next_reconcile_without_duplicates(
    fake: FakeKube, watches: Watches, clock: Clock
) -> None:
    new_job(fake)
    watches.sync()

    def crash_at_children(request: Request) -> kube.ApiError | None:
        if request.kind != "TrainingJob":
            return kube.ApiError(503, "ServiceUnavailable", "the operator died here")
        return None

    fake.fail_on = crash_at_children
    with pytest.raises(kube.ApiError):
        await reconciler(fake, watches, clock).reconcile(KEY)
    assert fake.get_object("RayJob", "mlp-a1") is None
    fake.fail_on = lambda _: None
    watches.sync()
    fake.clear()
    await reconciler(fake, watches, clock).reconcile(KEY)  # a new process
    writes = fake.writes()
    assert "patch-status TrainingJob mlp" not in writes  # the intent was recorded already: nothing to add
    assert set(writes[:4]) == FIRST_WAVE and writes[4:] == [
        "apply RoleBinding mlp-trainer",
        "create RayJob mlp-a1",
    ]
    owner = fake.get_object("TrainingJob", "mlp")
    assert owner is not None and owner["status"]["attempt"] == 1


async def test_a_rayjob_the_watch_has_not_shown_yet_is_created_once_and_the_409_is_not_an_error(
    fake: FakeKube, watches: Watches, clock: Clock
) -> None:
    new_job(fake)
    watches.sync()
    reconcile_ = reconciler(fake, watches, clock)
    await reconcile_.reconcile(KEY)
    fake.clear()  # no sync: the cache has not seen the RayJob (or anything else) yet
    await reconcile_.reconcile(KEY)
    assert "create RayJob mlp-a1" in fake.writes()
    assert [o for o in fake.objects.values() if o["kind"] == "RayJob"].__len__() == 1


async def test_a_failed_attempt_records_the_failure_before_deleting_its_rayjob_by_uid(
    fake: FakeKube, watches: Watches, clock: Clock
) -> None:
    new_job(fake)
    watches.sync()
    reconcile_ = reconciler(fake, watches, clock)
    await reconcile_.reconcile(KEY)
    kuberay(fake, "mlp-a1", "FAILED", "Failed")
    watches.sync()
    fake.clear()
    await reconcile_.reconcile(KEY)
    assert fake.writes() == [
        "create Event mlp." + fake.writes()[0].rsplit(".", 1)[1],  # the Restarting Event, named by transition
        "patch-status TrainingJob mlp",
        "delete RayJob mlp-a1",
    ]
    owner = fake.get_object("TrainingJob", "mlp")
    assert owner is not None
    assert (owner["status"]["phase"], [f["attempt"] for f in owner["status"]["failures"]]) == (
        "Restarting",
        [1],
    )


async def test_the_next_attempt_rewrites_the_config_before_creating_its_rayjob(
    fake: FakeKube, watches: Watches, clock: Clock
) -> None:
    new_job(fake)
    watches.sync()
    reconcile_ = reconciler(fake, watches, clock)
    await reconcile_.reconcile(KEY)
    kuberay(fake, "mlp-a1", "FAILED", "Failed")
    watches.sync()
    await reconcile_.reconcile(KEY)  # Restarting; the backoff is 1 s
    watches.sync()
    clock.now = NOW + datetime.timedelta(seconds=5)
    fake.clear()
    await reconcile_.reconcile(KEY)
    writes = fake.writes()
    assert writes[0] == "patch-status TrainingJob mlp"
    assert writes.index("apply ConfigMap mlp-trainer") < writes.index("create RayJob mlp-a2")
    config = fake.get_object("ConfigMap", "mlp-trainer")
    assert config is not None and config["metadata"]["annotations"][kinds.ANNOTATION_ATTEMPT] == "2"


async def test_the_echoes_of_a_reconciles_own_writes_are_recognised_and_a_later_change_is_not(
    fake: FakeKube, watches: Watches, clock: Clock
) -> None:
    new_job(fake)
    watches.sync()
    reconcile_ = reconciler(fake, watches, clock)
    await reconcile_.reconcile(KEY)
    ray_job = fake.get_object("RayJob", "mlp-a1")
    assert ray_job is not None
    meta = ray_job["metadata"]
    own = reconcile_.own_writes
    assert own.is_echo(KEY, "RayJob", "mlp-a1", uid=meta["uid"], resource_version=meta["resourceVersion"])
    kuberay(fake, "mlp-a1", "", "Initializing")
    meta = fake.get_object("RayJob", "mlp-a1")["metadata"]  # type: ignore[index]
    assert not own.is_echo(KEY, "RayJob", "mlp-a1", uid=meta["uid"], resource_version=meta["resourceVersion"])


async def test_a_job_waiting_for_its_existing_claim_creates_no_rayjob_until_the_claim_exists(
    fake: FakeKube, watches: Watches, clock: Clock
) -> None:
    new_job(fake, checkpoint={"storage": {"existingClaim": "shared-data"}})
    watches.sync()
    reconcile_ = reconciler(fake, watches, clock)
    await reconcile_.reconcile(KEY)
    assert not any("RayJob" in w or "PersistentVolumeClaim" in w for w in fake.writes())
    fake.put(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "shared-data", "namespace": "team-a"},
            "status": {"phase": "Bound"},
        }
    )
    watches.sync()
    fake.clear()
    await reconcile_.reconcile(KEY)
    assert fake.writes()[-1] == "create RayJob mlp-a1"
