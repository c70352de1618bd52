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

from trainop.controller import engine, kinds, kube, reconcile

NOW = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.UTC)
KEY = reconcile.OwnerKey("TrainingJob", "team-a", "mlp")
#: Written beside the owner's status: they depend on nothing it records.
BESIDE_STATUS = {"apply ServiceAccount mlp-trainer", "apply Role mlp-trainer"}
#: Written beside the owner's other writes too, but before its status, which says the claim is there.
BEFORE_STATUS = {"create PersistentVolumeClaim mlp-ckpt"}
#: Written after the status: they depend on the attempt it records.
AFTER_STATUS = {"apply ConfigMap mlp-trainer", "apply RoleBinding mlp-trainer"}


class Operator:
    """One operator process over the fake apiserver: its reconciler, a clock, and the watches."""

    def __init__(self, fake: FakeKube) -> None:
        self.fake = fake
        self.now = NOW
        self.restart()

    def restart(self) -> None:
        """A new process: nothing in memory, the watches listed afresh."""
        self.watches = Watches(self.fake)
        self.reconciler = reconcile.Reconciler(self.fake, self.watches.cache, clock=lambda: self.now)
        routing = engine.Engine(self.reconciler, self.watches.cache)
        self.watches.deliver = lambda body, deleted: routing.child_event(body, deleted=deleted)

    async def reconcile(self, *, sync: bool = True) -> list[str]:
        """One reconcile after the watches delivered everything (unless ``sync=False``); its writes."""
        if sync:
            self.watches.sync()
        self.fake.clear()
        await self.reconciler.reconcile(KEY)
        return self.fake.writes()


@pytest.fixture
def fake() -> FakeKube:
    return FakeKube()


@pytest.fixture
def operator(fake: FakeKube) -> Operator:
    return Operator(fake)


def new_job(fake: FakeKube, **spec: Any) -> dict[str, Any]:
    return fake.put(factories.job(spec=spec or None, uid=None))


def kuberay(fake: FakeKube, name: str, job_status: str, deployment: str) -> None:
    """What KubeRay writes on a RayJob's status (the only other writer here)."""
    ray_job = fake.get_object("RayJob", name)
    assert ray_job is not None
    fake.put({**ray_job, "status": {"jobStatus": job_status, "jobDeploymentStatus": deployment}})


async def test_a_new_job_records_its_intent_before_every_child_that_depends_on_it_and_the_rayjob_last(
    fake: FakeKube, operator: Operator
) -> None:
    new_job(fake)
    writes = await operator.reconcile()
    # The owner is read fresh; the children are not read at all (the watches hold them).
    assert [str(r) for r in fake.requests if r.verb in ("get", "list")] == ["get TrainingJob mlp"]
    assert sorted(writes) == sorted(
        [
            "patch TrainingJob mlp",
            "patch-status TrainingJob mlp",
            *BESIDE_STATUS,
            *BEFORE_STATUS,
            *AFTER_STATUS,
            "create RayJob mlp-a1",
        ]
    )
    # The accepted spec and the claim the status reports on, then the record of intent...
    assert fake.before("patch TrainingJob mlp", "patch-status TrainingJob mlp")
    assert all(fake.before(child, "patch-status TrainingJob mlp") for child in BEFORE_STATUS)
    # ...before what depends on them; the RoleBinding after its Role (RBAC's escalation check reads it).
    assert all(fake.before("patch-status TrainingJob mlp", child) for child in AFTER_STATUS)
    assert fake.before("apply Role mlp-trainer", "apply RoleBinding mlp-trainer")
    # The RayJob last, once everything its pods need is in place.
    assert all(fake.before(w, "create RayJob mlp-a1") for w in writes if w != "create RayJob mlp-a1")
    # What depends on nothing the status records does not wait for it: read, owner writes (the
    # ServiceAccount, Role and claim beside them), the status, the ConfigMap/RoleBinding, the RayJob.
    assert not any(fake.before("patch TrainingJob mlp", child) for child in BESIDE_STATUS | BEFORE_STATUS)
    assert fake.round_trips() == 5
    owner = fake.get_object("TrainingJob", "mlp")
    assert owner is not None and owner["status"]["children"]["rayJob"] == "mlp-a1"
    assert owner["metadata"]["annotations"][kinds.ANNOTATION_APPLIED_SPEC]


async def test_a_status_write_that_fails_leaves_every_child_that_depends_on_it_unwritten(
    fake: FakeKube, operator: Operator
) -> None:
    new_job(fake)

    def status_refused(request: Request) -> kube.ApiError | None:
        if request.verb == "patch-status":
            return kube.ApiError(503, "ServiceUnavailable", "the status was not written")
        return None

    fake.fail_on = status_refused
    with pytest.raises(kube.ApiError):
        await operator.reconcile()
    assert not set(fake.writes()) & (AFTER_STATUS | {"create RayJob mlp-a1"})
    # Only what is the same whatever the status says was written beside it.
    assert set(fake.writes()) == {
        "patch TrainingJob mlp",
        "patch-status TrainingJob mlp",
        *BESIDE_STATUS,
        *BEFORE_STATUS,
    }


async def test_a_reconcile_that_finds_everything_in_place_reads_the_owner_and_writes_nothing(
    fake: FakeKube, operator: Operator
) -> None:
    new_job(fake)
    await operator.reconcile()
    await operator.reconcile()
    assert [str(r) for r in fake.requests] == ["get TrainingJob mlp"]


async def test_a_restarted_operator_applies_the_rbac_children_once_and_leaves_the_attempts_config(
    fake: FakeKube, operator: Operator
) -> None:
    new_job(fake)
    await operator.reconcile()
    operator.restart()  # it never applied anything
    assert sorted(await operator.reconcile()) == [
        "apply Role mlp-trainer",
        "apply RoleBinding mlp-trainer",
        "apply ServiceAccount mlp-trainer",
    ]
    # The ConfigMap is not watched: read once, found written for this attempt, left alone.
    assert [str(r) for r in fake.requests if r.verb == "get"] == [
        "get TrainingJob mlp",
        "get ConfigMap mlp-trainer",
    ]
    assert await operator.reconcile() == []
    assert [str(r) for r in fake.requests] == ["get TrainingJob mlp"]


async def test_a_child_someone_else_changed_is_applied_again_and_only_that_one(
    fake: FakeKube, operator: Operator
) -> None:
    new_job(fake)
    await operator.reconcile()
    role = fake.get_object("Role", "mlp-trainer")
    assert role is not None
    fake.put({**role, "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]})  # an edit
    assert await operator.reconcile() == ["apply Role mlp-trainer"]
    repaired = fake.get_object("Role", "mlp-trainer")
    assert repaired is not None and repaired["rules"][0]["resourceNames"] == ["mlp"]


async def test_a_crash_after_the_status_write_is_finished_by_the_next_reconcile_without_duplicates(
    fake: FakeKube, operator: Operator
) -> None:
    new_job(fake)
    recorded = False

    def crash_after_the_status(request: Request) -> kube.ApiError | None:
        nonlocal recorded
        recorded = recorded or request.verb == "patch-status"
        if recorded and request.kind != "TrainingJob":
            return kube.ApiError(503, "ServiceUnavailable", "the operator died here")
        return None

    fake.fail_on = crash_after_the_status
    with pytest.raises(kube.ApiError):
        await operator.reconcile()
    assert fake.get_object("RayJob", "mlp-a1") is None
    fake.fail_on = lambda _: None
    operator.restart()
    writes = await operator.reconcile()
    assert "patch-status TrainingJob mlp" not in writes  # the intent was recorded already: nothing to add
    # The claim was made before the status; the restarted process applies the RBAC children once.
    assert sorted(writes) == sorted([*BESIDE_STATUS, *AFTER_STATUS, "create RayJob mlp-a1"])
    assert all(fake.before(w, "create RayJob mlp-a1") for w in writes if w != "create RayJob mlp-a1")
    owner = fake.get_object("TrainingJob", "mlp")
    assert owner is not None and owner["status"]["attempt"] == 1


async def test_a_rayjob_the_watch_has_not_shown_yet_is_created_once_and_the_409_is_not_an_error(
    fake: FakeKube, operator: Operator
) -> None:
    new_job(fake)
    await operator.reconcile()
    # No sync: the cache has not seen the RayJob (or anything else) yet.
    assert "create RayJob mlp-a1" in await operator.reconcile(sync=False)
    assert len([o for o in fake.objects.values() if o["kind"] == "RayJob"]) == 1


async def test_a_failed_attempt_records_the_failure_before_deleting_its_rayjob_by_uid(
    fake: FakeKube, operator: Operator
) -> None:
    new_job(fake)
    await operator.reconcile()
    kuberay(fake, "mlp-a1", "FAILED", "Failed")
    writes = await operator.reconcile()
    assert [w.split(".")[0] for w in writes] == [
        "create Event mlp",  # the Restarting Event, named after the transition
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
    fake: FakeKube, operator: Operator
) -> None:
    new_job(fake)
    await operator.reconcile()
    kuberay(fake, "mlp-a1", "FAILED", "Failed")
    await operator.reconcile()  # Restarting; the backoff is 1 s
    operator.now = NOW + datetime.timedelta(seconds=5)
    writes = await operator.reconcile()
    assert writes[0] == "patch-status TrainingJob mlp"
    assert writes.index("apply ConfigMap mlp-trainer") < writes.index("create RayJob mlp-a2")
    config = fake.get_object("ConfigMap", "mlp-trainer")
    assert config is not None and config["metadata"]["annotations"][kinds.ANNOTATION_ATTEMPT] == "2"


async def test_the_echoes_of_a_reconciles_own_writes_are_recognised_and_a_later_change_is_not(
    fake: FakeKube, operator: Operator
) -> None:
    new_job(fake)
    await operator.reconcile()
    own = operator.reconciler.own_writes

    def echo() -> bool:
        meta = fake.get_object("RayJob", "mlp-a1")["metadata"]  # type: ignore[index]
        return own.is_echo(KEY, "RayJob", "mlp-a1", uid=meta["uid"], resource_version=meta["resourceVersion"])

    assert echo()
    kuberay(fake, "mlp-a1", "", "Initializing")
    assert not echo()


async def test_a_job_waiting_for_its_existing_claim_creates_no_rayjob_until_the_claim_exists(
    fake: FakeKube, operator: Operator
) -> None:
    new_job(fake, checkpoint={"storage": {"existingClaim": "shared-data"}})
    assert not any("RayJob" in w or "PersistentVolumeClaim" in w for w in await operator.reconcile())
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "shared-data"}}
    fake.put(
        {**claim, "metadata": {**claim["metadata"], "namespace": "team-a"}, "status": {"phase": "Bound"}}
    )
    assert (await operator.reconcile())[-1] == "create RayJob mlp-a1"


async def test_a_job_recreated_after_its_namesakes_claim_went_says_its_claim_is_pending_only_once_it_exists(
    fake: FakeKube, operator: Operator
) -> None:
    """Seen in CI (test_status_truths): the status named the new RayJob and said ClaimPending, and the
    claim was not there yet -- the status was written before the claim it reports on."""
    old_owner = "0f0e0d0c-0000-4000-8000-0000000000aa"
    old_claim = fake.put(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": "mlp-ckpt",
                "namespace": "team-a",
                "ownerReferences": [
                    {
                        "apiVersion": "trainop.dev/v1alpha1",
                        "kind": "TrainingJob",
                        "name": "mlp",
                        "uid": old_owner,
                    }
                ],
                "deletionTimestamp": "2026-03-01T11:59:00Z",
                "finalizers": ["trainop.dev/test-hold"],
            },
            "status": {"phase": "Bound"},
        }
    )
    owner_uid = new_job(fake, checkpoint={"storage": {"deleteWithJob": True}})["metadata"]["uid"]
    writes = await operator.reconcile()
    assert not any("PersistentVolumeClaim" in w or "RayJob" in w for w in writes)
    assert storage_ready(fake) == ("False", "ClaimBeingDeleted")

    del fake.objects[FakeKube._path_of(old_claim)]  # its finalizer removed: the old claim goes
    named = []

    def status_write(request: Request) -> kube.ApiError | None:
        if request.verb == "patch-status":
            claim = fake.get_object("PersistentVolumeClaim", "mlp-ckpt")
            named.append(None if claim is None else [r["uid"] for r in claim["metadata"]["ownerReferences"]])
        return None

    fake.fail_on = status_write
    await operator.reconcile()
    owner = fake.get_object("TrainingJob", "mlp")
    assert owner is not None and owner["status"]["children"]["rayJob"] == "mlp-a1"
    assert storage_ready(fake) == ("False", "ClaimPending")
    assert named == [[owner_uid]]  # when that status was written, the new claim was there, the new job's


def claims_over_quota(request: Request) -> kube.ApiError | None:
    """A ResourceQuota's answer to every claim the operator creates."""
    if request.verb == "create" and request.kind == "PersistentVolumeClaim":
        return kube.ApiError(
            403, "Forbidden", 'persistentvolumeclaims "mlp-ckpt" is forbidden: exceeded quota'
        )
    return None


async def test_a_refused_claim_is_never_called_pending_and_its_rayjob_never_named(
    fake: FakeKube, operator: Operator
) -> None:
    new_job(fake)

    fake.fail_on = claims_over_quota
    for _ in range(2):
        with pytest.raises(kube.ApiError, match="exceeded quota"):
            await operator.reconcile()
        owner = fake.get_object("TrainingJob", "mlp")
        assert owner is not None
        status = owner.get("status") or {}
        assert "rayJob" not in (status.get("children") or {})
        assert "ClaimPending" not in [c["reason"] for c in status.get("conditions") or []]
    assert storage_ready(fake) == ("False", "QuotaExceeded")
    assert fake.get_object("RayJob", "mlp-a1") is None


async def test_a_namespace_being_deleted_ends_the_reconcile_quietly_with_nothing_to_retry(
    fake: FakeKube, operator: Operator
) -> None:
    new_job(fake)

    def terminating(request: Request) -> kube.ApiError | None:
        if request.verb in ("create", "apply"):
            message = (
                f'{request.kind} "{request.name}" is forbidden: unable to create new content in namespace '
            )
            return kube.ApiError(403, "Forbidden", message + "team-a because it is being terminated")
        return None

    fake.fail_on = terminating
    await operator.reconcile()  # no error: the owner goes with its namespace
    owner = fake.get_object("TrainingJob", "mlp")
    assert owner is not None and owner["status"]["phase"] == "Pending"
    assert not any(c["reason"] == "CreateFailed" for c in owner["status"]["conditions"])


S3_CHECKPOINTS = {
    "storage": {"s3": {"bucket": "ckpt", "prefix": "team-a", "endpoint": "http://s3.storage:9000"}}
}


def storage_ready(fake: FakeKube) -> tuple[str, str]:
    owner = fake.get_object("TrainingJob", "mlp")
    assert owner is not None
    found = [c for c in owner["status"]["conditions"] if c["type"] == "StorageReady"]
    return found[0]["status"], found[0]["reason"]


def trainer_reports_storage(fake: FakeKube, *, ready: bool, reason: str, attempt: int = 1) -> dict[str, Any]:
    """What the trainer's driver writes when an attempt starts (status.storage), the only other writer."""
    owner = fake.get_object("TrainingJob", "mlp")
    assert owner is not None
    check = {
        "location": "s3://ckpt/team-a/mlp",
        "ready": ready,
        "reason": reason,
        "message": "s3://ckpt/team-a/mlp is writable." if ready else "The endpoint refused the credentials.",
        "attempt": attempt,
        "checked": "2026-03-01T12:00:05Z",
    }
    return fake.put({**owner, "status": {**owner["status"], "storage": check}})


async def test_a_job_with_checkpoints_in_a_bucket_creates_its_rayjob_without_any_claim(
    fake: FakeKube, operator: Operator
) -> None:
    new_job(fake, checkpoint=S3_CHECKPOINTS)
    writes = await operator.reconcile()
    assert not any("PersistentVolumeClaim" in w for w in writes)
    assert writes[-1] == "create RayJob mlp-a1"
    owner = fake.get_object("TrainingJob", "mlp")
    assert owner is not None and "persistentVolumeClaim" not in owner["status"]["children"]
    assert storage_ready(fake) == ("Unknown", "ObjectStorageUnchecked")


@pytest.mark.parametrize(
    ("ready", "reason", "expected"),
    [(True, "Writable", ("True", "BucketWritable")), (False, "AccessDenied", ("False", "AccessDenied"))],
    ids=["writable", "refused"],
)
async def test_the_trainers_check_of_the_bucket_wakes_the_operator_and_storage_ready_tells_it(
    fake: FakeKube, operator: Operator, ready: bool, reason: str, expected: tuple[str, str]
) -> None:
    new_job(fake, checkpoint=S3_CHECKPOINTS)
    await operator.reconcile()
    # A check by an earlier attempt's driver is not this attempt's truth: no reconcile for it.
    assert not engine.needs_reconcile(trainer_reports_storage(fake, ready=ready, reason=reason, attempt=0))
    owner = trainer_reports_storage(fake, ready=ready, reason=reason)
    assert engine.needs_reconcile(owner)  # a trainer-only status write, yet StorageReady must change
    writes = await operator.reconcile()
    assert "patch-status TrainingJob mlp" in writes
    assert ("create Event mlp" in {w.split(".")[0] for w in writes}) == (not ready)  # a problem's Warning
    assert storage_ready(fake) == expected
    assert not engine.needs_reconcile(fake.get_object("TrainingJob", "mlp"))  # type: ignore[arg-type]


async def test_a_claim_created_after_a_refusal_asks_for_another_look_so_the_status_catches_up(
    fake: FakeKube, operator: Operator
) -> None:
    """The status is decided before any write: the reconcile that finally creates a refused claim wrote
    the old QuotaExceeded. Its own creation's watch event does not wake the owner, so it must ask for a
    reconcile at once (requeue 0), and that one writes the truth. Seen in CI: StorageReady said
    QuotaExceeded for good while the claim and the RayJob existed."""
    new_job(fake)

    fake.fail_on = claims_over_quota
    for _ in range(2):  # refused (retried with backoff by the engine); the second one records it on status
        with pytest.raises(kube.ApiError, match="exceeded quota"):
            await operator.reconcile()
    assert storage_ready(fake) == ("False", "QuotaExceeded")

    fake.fail_on = lambda _: None  # the quota allows it
    operator.watches.sync()
    created = await operator.reconciler.reconcile(KEY)
    assert fake.get_object("PersistentVolumeClaim", "mlp-ckpt") is not None
    assert storage_ready(fake) == ("False", "QuotaExceeded")  # decided before the claim was made
    assert created.requeue_after == 0.0
    await operator.reconcile()
    assert storage_ready(fake)[1] != "QuotaExceeded"
