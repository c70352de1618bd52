"""What the status says while the attempt's RayJob must not be created yet, and which children it names.

The rule under test: ``status.children`` names only objects that exist or that this reconcile creates,
no RayJob is created before its claim exists, and while one cannot be, the phase is Pending with the
awaited thing in the Running condition (``WaitingForStorage`` / ``WaitingForDeletion`` /
``WaitingForPreviousAttempt``).
"""

from __future__ import annotations

import datetime

import operator_factories as factories
import pytest
from state_machine_cases import NOW, after, condition, decide, ray_job

from trainop.api.operator_status import Phase
from trainop.controller import conditions, observe

EXISTING = {"checkpoint": {"storage": {"existingClaim": "shared-data"}}}
DELETE_WITH_JOB = {"checkpoint": {"storage": {"deleteWithJob": True}}}


def test_an_existing_claim_that_is_missing_holds_the_rayjob_back_and_says_so() -> None:
    transition = decide(factories.job(spec=EXISTING), claim=observe.ClaimPhase.MISSING)
    assert (transition.status.phase, transition.create_ray_job) == (Phase.PENDING, False)
    assert transition.status.children is not None
    assert (transition.status.children.ray_job, transition.status.children.persistent_volume_claim) == (
        None,
        None,
    )
    assert condition(transition, conditions.STORAGE_READY)[:2] == ("False", "ClaimNotFound")
    status, reason, message = condition(transition, conditions.RUNNING)
    assert (status, reason) == ("False", "WaitingForStorage")
    assert "claim shared-data (spec.checkpoint.storage.existingClaim)" in message and "mlp-a1" in message


def test_the_existing_claim_appearing_lets_the_rayjob_be_created_and_named() -> None:
    waiting = decide(factories.job(spec=EXISTING), claim=observe.ClaimPhase.MISSING)
    transition = decide(after(factories.job(spec=EXISTING), waiting), claim=observe.ClaimPhase.PENDING)
    assert transition.create_ray_job is True
    assert transition.status.children is not None
    assert transition.status.children.ray_job == "mlp-a1"
    assert transition.status.children.persistent_volume_claim == "shared-data"
    assert condition(transition, conditions.STORAGE_READY)[:2] == ("False", "ClaimPending")


def test_a_claim_the_job_creates_counts_as_there_the_reconcile_creates_it_before_the_rayjob() -> None:
    transition = decide(factories.job(), claim=observe.ClaimPhase.MISSING)
    assert transition.create_ray_job is True
    assert transition.status.children is not None
    assert transition.status.children.persistent_volume_claim == "mlp-ckpt"


@pytest.mark.parametrize(
    ("observed", "reason", "awaited"),
    [
        ({"claim_being_deleted": True}, "ClaimBeingDeleted", "claim mlp-ckpt, which is being deleted, to go"),
        (
            {"ownership": observe.Ownership.OTHER},
            "ClaimOwnedByAnother",
            "claim mlp-ckpt, which another object owns, to be deleted",
        ),
        ({"claim": observe.ClaimPhase.LOST}, "ClaimLost", "claim mlp-ckpt to get a volume back"),
    ],
)
def test_a_claim_that_cannot_hold_checkpoints_holds_the_rayjob_back_and_storage_ready_says_why(
    observed: dict[str, object], reason: str, awaited: str
) -> None:
    transition = decide(factories.job(), **observed)  # type: ignore[arg-type]
    assert (transition.status.phase, transition.create_ray_job) == (Phase.PENDING, False)
    assert transition.status.children is not None and transition.status.children.ray_job is None
    assert condition(transition, conditions.STORAGE_READY)[1] == reason
    assert awaited in condition(transition, conditions.RUNNING)[2]


def test_a_namesakes_rayjob_still_being_deleted_holds_the_new_jobs_rayjob_back() -> None:
    transition = decide(factories.job(), foreign_ray_jobs=frozenset({"mlp-a1"}))
    assert transition.create_ray_job is False
    _, reason, message = condition(transition, conditions.RUNNING)
    assert reason == "WaitingForDeletion"
    assert "RayJob mlp-a1 of a deleted TrainingJob of the same name to be deleted" in message


def test_a_namesakes_child_being_deleted_holds_the_rayjob_back_and_is_named() -> None:
    transition = decide(factories.job(), leftovers=("Role mlp-trainer",))
    assert transition.create_ray_job is False
    assert "Role mlp-trainer of a deleted TrainingJob" in condition(transition, conditions.RUNNING)[2]


def test_a_new_job_waits_for_its_deleted_namesakes_ray_pods_which_may_still_write_into_its_claim() -> None:
    due = NOW + datetime.timedelta(seconds=30)
    pods = (observe.PodLife("mlp-a3-worker-y", False, due), observe.PodLife("mlp-a3-head-x", ended=False))
    waiting = decide(factories.job(), namesake_pods=pods)
    assert waiting.create_ray_job is False
    _, reason, message = condition(waiting, conditions.RUNNING)
    assert reason == "WaitingForDeletion"
    assert "a deleted TrainingJob of the same name to stop (mlp-a3-worker-y and 1 more;" in message
    assert waiting.requeue_after == 31.0  # a lost node's pod sends no event at its deadline
    past = observe.PodLife("mlp-a3-worker-y", False, NOW - datetime.timedelta(seconds=1))
    ended = observe.PodLife("mlp-a3-head-x", ended=True)
    assert decide(factories.job(), namesake_pods=(past, ended)).create_ray_job is True


def test_a_new_attempt_waits_for_the_pods_of_the_previous_one_which_may_still_be_checkpointing() -> None:
    """Resumed (suspend: false) while attempt 1's workers still run their preStop checkpoint: attempt 2's
    rank 0 would clear their half-written step directory as stale, and both would write the status."""
    body = factories.job(status={"phase": "Suspended", "attempt": 1})
    due = NOW + datetime.timedelta(seconds=90)
    pods = (observe.PodLife("mlp-a1-head-x", ended=False), observe.PodLife("mlp-a1-worker-y", False, due))
    waiting = decide(body, attempt_pods={1: pods})
    assert (waiting.status.phase, waiting.status.attempt, waiting.create_ray_job) == (Phase.PENDING, 2, False)
    assert waiting.status.children is not None and waiting.status.children.ray_job is None
    _, reason, message = condition(waiting, conditions.RUNNING)
    assert reason == "WaitingForPreviousAttempt"
    assert message == (
        "Waiting for the Ray pods of attempt 1 to stop (mlp-a1-head-x and 1 more; they may still be writing "
        "the checkpoint this attempt resumes from) before creating RayJob mlp-a2 (attempt 2)."
    )
    # A pod of a lost node sends no event when its deadline passes: the owner is woken then.
    assert waiting.requeue_after == 91.0
    # The current attempt's own pods hold nothing back, and once attempt 1's are gone attempt 2 starts.
    assert decide(after(body, waiting), attempt_pods={2: pods}).create_ray_job is True
    assert decide(after(body, waiting)).create_ray_job is True


@pytest.mark.parametrize(
    "life",
    [
        observe.PodLife("mlp-a1-worker-y", ended=True),  # Succeeded or Failed: nothing runs
        # Past its deletion deadline the kubelet has killed it, or its node is lost: nothing writes.
        observe.PodLife("mlp-a1-worker-y", False, NOW - datetime.timedelta(seconds=1)),
    ],
    ids=["ended", "past-its-deletion-deadline"],
)
def test_a_pod_of_the_previous_attempt_that_cannot_run_holds_nothing_back(life: observe.PodLife) -> None:
    body = factories.job(status={"phase": "Suspended", "attempt": 1})
    assert decide(body, attempt_pods={1: (life,)}).create_ray_job is True


@pytest.mark.parametrize(
    ("reason", "waits"), [("NodeLost", False), ("Unknown", False), ("Stalled", False), ("Preempted", True)]
)
def test_only_a_preemption_restart_waits_for_that_attempts_pods(reason: str, waits: bool) -> None:
    """A rank died (with its node, or alone) or stalled: no graceful checkpoint of that attempt can complete,
    and a lost node's pod would hold the restart for its whole grace period. A preempted (drained) worker may
    be writing one."""
    failed = {"attempt": 1, "reason": reason, "message": "m", "time": "2026-03-01T11:59:00Z"}
    body = factories.job(
        status={
            "phase": "Restarting",
            "attempt": 1,
            "nextRestartTime": "2026-03-01T11:59:30Z",
            "failures": [failed],
        }
    )
    due = NOW + datetime.timedelta(seconds=100)
    transition = decide(body, attempt_pods={1: (observe.PodLife("mlp-a1-workers-worker-x", False, due),)})
    assert transition.status.attempt == 2
    assert transition.create_ray_job is not waits
    if waits:
        assert condition(transition, conditions.RUNNING)[1] == "WaitingForPreviousAttempt"


def test_pod_life_reads_the_phase_and_the_deletion_deadline() -> None:
    pod = {"metadata": {"name": "p"}, "status": {"phase": "Running"}}
    assert observe.pod_life(pod) == observe.PodLife("p", ended=False)
    deleted = {**pod, "metadata": {"name": "p", "deletionTimestamp": "2026-01-02T03:04:05Z"}}
    assert observe.pod_life(deleted).deletion_due == datetime.datetime(
        2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC
    )
    assert observe.pod_life({**pod, "status": {"phase": "Failed"}}).ended


def test_a_rayjob_whose_creation_keeps_failing_is_not_named() -> None:
    refused = observe.Problem("CreateFailed", "Cannot create RayJob mlp-a1: admission said no")
    transition = decide(factories.job(), create_errors={"RayJob": refused})
    assert transition.create_ray_job is True  # tried again
    assert transition.status.children is not None and transition.status.children.ray_job is None


def test_suspending_and_resuming_before_the_storage_exists_never_names_a_rayjob() -> None:
    body = factories.job(spec=EXISTING)
    named = []
    for suspend in (False, True, False, True, False):
        body = {**body, "spec": {**body["spec"], "suspend": suspend}}
        transition = decide(body, claim=observe.ClaimPhase.MISSING)
        assert transition.create_ray_job is False
        assert transition.status.children is not None
        named.append(transition.status.children.ray_job)
        body = after(body, transition)
    assert named == [None] * 5
    assert transition.status.attempt == 3  # each resume is an attempt, none of which could start


@pytest.mark.parametrize(
    ("spec", "ownership", "adopts"),
    [
        (DELETE_WITH_JOB, observe.Ownership.NONE, True),
        (DELETE_WITH_JOB, observe.Ownership.THIS, False),  # already ours
        ({}, observe.Ownership.NONE, False),  # kept on purpose: checkpoints outlive the job
        (EXISTING, observe.Ownership.NONE, False),  # the user's claim is never taken
    ],
)
def test_a_claim_found_under_the_jobs_name_is_adopted_only_when_delete_with_job_asks(
    spec: dict[str, object], ownership: observe.Ownership, adopts: bool
) -> None:
    transition = decide(factories.job(spec=spec), ownership=ownership)
    assert transition.adopt_claim is adopts
    assert ("ClaimAdopted" in [e.reason for e in transition.events]) is adopts


def test_a_running_attempt_is_followed_whatever_its_claim_does() -> None:
    body = after(factories.job(), decide(factories.job()))
    transition = decide(body, ray_job("mlp-a1", "RUNNING", "Running"), claim_being_deleted=True)
    assert transition.status.phase == Phase.RUNNING
    assert transition.status.children is not None and transition.status.children.ray_job == "mlp-a1"
