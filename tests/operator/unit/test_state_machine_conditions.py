"""The state machine: conditions a user reads, and the Warning Events that announce problems."""

from __future__ import annotations

import operator_factories as factories
import pytest
from state_machine_cases import NOW, RFC, after, condition, decide, ray_job, seconds, with_status

from trainop.api.trainingjob import Phase, StorageStatus
from trainop.controller import conditions, observe, state_machine


# ---------------------------------------------------------------------------------------- conditions
def test_every_condition_type_is_always_present_once() -> None:
    transition = decide(factories.job())
    assert [c.type for c in transition.status.conditions] == list(conditions.TYPES)


def test_last_transition_time_moves_only_when_a_condition_status_changes() -> None:
    body = with_status(phase=Phase.PROVISIONING, attempt=1, start_time=RFC(NOW))
    first = decide(body, ray_job("mlp-a1", "", "Initializing"))
    body = after(body, first)
    later = NOW + seconds(30)
    same = decide(body, ray_job("mlp-a1", "PENDING", "Running"), now=later)
    running = decide(body, ray_job("mlp-a1", "RUNNING", "Running"), now=later)

    def times(transition: state_machine.Transition) -> dict[str, str | None]:
        return {c.type: c.last_transition_time for c in transition.status.conditions}

    assert times(same) == times(first)
    assert times(running)[conditions.RUNNING] == RFC(later)
    assert times(running)[conditions.SPEC_VALID] == RFC(NOW)


@pytest.mark.parametrize(
    ("claim", "existing", "expected"),
    [
        (observe.ClaimPhase.BOUND, False, ("True", "ClaimBound")),
        (observe.ClaimPhase.PENDING, False, ("False", "ClaimPending")),
        (observe.ClaimPhase.LOST, False, ("False", "ClaimLost")),
        # The reconcile that writes this creates the claim next: unbound, like any new claim.
        (observe.ClaimPhase.MISSING, False, ("False", "ClaimPending")),
        (observe.ClaimPhase.MISSING, True, ("False", "ClaimNotFound")),
    ],
)
def test_storage_ready_tells_the_state_of_the_checkpoint_claim(
    claim: observe.ClaimPhase, existing: bool, expected: tuple[str, str]
) -> None:
    spec = {"checkpoint": {"storage": {"existingClaim": "shared-ckpt"}}} if existing else {}
    assert condition(decide(factories.job(spec=spec), claim=claim), conditions.STORAGE_READY)[:2] == expected


def test_a_missing_existing_claim_says_which_field_to_fix_and_posts_a_warning() -> None:
    transition = decide(
        factories.job(spec={"checkpoint": {"storage": {"existingClaim": "shared-ckpt"}}}),
        claim=observe.ClaimPhase.MISSING,
    )
    message = condition(transition, conditions.STORAGE_READY)[2]
    assert "spec.checkpoint.storage.existingClaim 'shared-ckpt'" in message
    assert ("Warning", "ClaimNotFound") in [(e.type, e.reason) for e in transition.events]


@pytest.mark.parametrize(
    ("problem", "reason"),
    [
        (
            observe.Problem("ImagePullBackOff", "pod x container ray-head: Back-off pulling image"),
            "ImagePullBackOff",
        ),
        (observe.Problem("Unschedulable", "pod x: 0/3 nodes have nvidia.com/gpu"), "Unschedulable"),
    ],
)
def test_pod_problems_while_provisioning_show_in_ray_cluster_ready_and_post_a_warning(
    problem: observe.Problem, reason: str
) -> None:
    body = with_status(phase=Phase.PROVISIONING, attempt=1, start_time=RFC(NOW))
    transition = decide(body, ray_job("mlp-a1", "", "Initializing"), pod_problems=(problem,))
    assert condition(transition, conditions.RAY_CLUSTER_READY) == ("False", reason, problem.message)
    assert ("Warning", reason) in [(e.type, e.reason) for e in transition.events]


def test_quota_refusals_reported_by_kuberay_show_as_quota_exceeded() -> None:
    body = with_status(phase=Phase.PROVISIONING, attempt=1, start_time=RFC(NOW))
    cluster = {
        "conditions": [
            {
                "type": "ReplicaFailure",
                "status": "True",
                "reason": "FailedCreateWorkerPod",
                "message": 'pods "w" is forbidden: exceeded quota: gpu, requested: nvidia.com/gpu=8',
            }
        ]
    }
    transition = decide(body, ray_job("mlp-a1", "", "Initializing", cluster_status=cluster))
    reason, message = condition(transition, conditions.RAY_CLUSTER_READY)[1:]
    assert reason == "QuotaExceeded" and "exceeded quota" in message


def test_a_child_creation_error_from_the_last_reconcile_explains_the_stuck_phase() -> None:
    problem = observe.Problem("QuotaExceeded", "Cannot create PersistentVolumeClaim mlp-ckpt: exceeded quota")
    transition = decide(
        factories.job(), claim=observe.ClaimPhase.MISSING, create_errors={"PersistentVolumeClaim": problem}
    )
    assert condition(transition, conditions.STORAGE_READY) == ("False", "QuotaExceeded", problem.message)


# ------------------------------------------------------------------------------------ object storage
def _reported(*, ready: bool, attempt: int, reason: str = "Writable", message: str = "ok") -> StorageStatus:
    return StorageStatus(
        location="s3://ckpt/team-a/mlp",
        ready=ready,
        reason=reason,
        message=message,
        attempt=attempt,
        checked="2026-11-26T12:00:00Z",
    )


@pytest.mark.parametrize(
    ("reported", "expected"),
    [
        (None, ("Unknown", "ObjectStorageUnchecked")),
        (_reported(ready=True, attempt=1), ("Unknown", "ObjectStorageUnchecked")),  # an older attempt's
        (_reported(ready=True, attempt=2), ("True", "BucketWritable")),
        (
            _reported(ready=False, attempt=2, reason="AccessDenied", message="refused the credentials"),
            ("False", "AccessDenied"),
        ),
    ],
    ids=["not-checked", "checked-by-an-earlier-attempt", "writable", "refused"],
)
def test_storage_ready_for_a_bucket_follows_the_current_attempts_start_up_check(
    reported: StorageStatus | None, expected: tuple[str, str]
) -> None:
    desired = conditions.object_storage("s3://ckpt/team-a/mlp", reported, attempt=2)
    assert (desired.type, desired.status, desired.reason) == (conditions.STORAGE_READY, *expected)
    if expected[0] != "False":
        assert "may run on any nodes" in desired.message
    else:
        assert desired.message == "refused the credentials"


@pytest.mark.parametrize(
    "reason", ["BucketNotFound", "AccessDenied", "CredentialsMissing", "EndpointUnreachable", "StorageError"]
)
def test_every_reason_of_a_failed_storage_check_is_a_problem_that_posts_a_warning(reason: str) -> None:
    assert reason in conditions.PROBLEM_REASONS
