"""The state machine: activeDeadlineSeconds, suspend and resume, finished phases, TTL, spec changes."""

from __future__ import annotations

import operator_factories as factories
import pytest
from state_machine_cases import NOW, RFC, accepted, after, condition, decide, ray_job, seconds, with_status

from trainop.api import manifest, trainingjob
from trainop.api.trainingjob import Phase, TrainingJobOperatorStatus
from trainop.controller import conditions, kinds, observe


# ----------------------------------------------------------------------------------------- deadline
def test_the_deadline_fails_a_running_job_and_deletes_its_rayjob() -> None:
    body = factories.job(spec={"activeDeadlineSeconds": 60})
    body = {
        **accepted(body),
        "status": TrainingJobOperatorStatus(
            phase=Phase.RUNNING, attempt=1, start_time=RFC(NOW - seconds(61))
        ).to_wire(),
    }
    transition = decide(body, ray_job("mlp-a1", "RUNNING", "Running"))
    assert transition.status.phase == Phase.FAILED
    assert condition(transition, conditions.FAILED)[1] == "DeadlineExceeded"
    assert "activeDeadlineSeconds=60" in condition(transition, conditions.FAILED)[2]
    assert transition.ray_job is None  # still running: deleted so the cluster stops


def test_before_the_deadline_the_job_is_requeued_for_it() -> None:
    body = factories.job(spec={"activeDeadlineSeconds": 60})
    body = {
        **accepted(body),
        "status": TrainingJobOperatorStatus(
            phase=Phase.RUNNING, attempt=1, start_time=RFC(NOW - seconds(20))
        ).to_wire(),
    }
    transition = decide(body, ray_job("mlp-a1", "RUNNING", "Running"))
    assert transition.status.phase == Phase.RUNNING
    assert transition.requeue_after == 40.0


def test_the_longest_deadline_and_ttl_allowed_are_requeued_without_overflow() -> None:
    longest = trainingjob.MAX_DURATION_SECONDS
    body = factories.job(spec={"activeDeadlineSeconds": longest})
    body = {
        **accepted(body),
        "status": TrainingJobOperatorStatus(
            phase=Phase.PROVISIONING, attempt=1, start_time=RFC(NOW)
        ).to_wire(),
    }
    # Provisioning: no stall watchdog is armed, so the deadline is the only requeue.
    assert decide(body, ray_job("mlp-a1", "", "Initializing")).requeue_after == float(longest)
    body = factories.job(spec={"ttlSecondsAfterFinished": longest})
    owned = TrainingJobOperatorStatus(phase=Phase.SUCCEEDED, attempt=1, completion_time=RFC(NOW))
    assert decide({**accepted(body), "status": owned.to_wire()}).requeue_after == float(longest)
    with pytest.raises(manifest.ManifestError, match="activeDeadlineSeconds"):
        kinds.parse(factories.job(spec={"activeDeadlineSeconds": longest + 1}))


def test_the_deadline_also_ends_a_restart_backoff() -> None:
    body = factories.job(spec={"activeDeadlineSeconds": 60})
    owned = TrainingJobOperatorStatus(
        phase=Phase.RESTARTING,
        attempt=1,
        start_time=RFC(NOW - seconds(70)),
        next_restart_time=RFC(NOW + seconds(9)),
    )
    transition = decide({**accepted(body), "status": owned.to_wire()})
    assert transition.status.phase == Phase.FAILED
    assert transition.status.next_restart_time is None


def test_the_deadline_does_not_run_while_suspended() -> None:
    body = factories.job(spec={"activeDeadlineSeconds": 60, "suspend": True})
    owned = TrainingJobOperatorStatus(phase=Phase.SUSPENDED, attempt=1, start_time=RFC(NOW - seconds(3600)))
    transition = decide({**accepted(body), "status": owned.to_wire()})
    assert transition.status.phase == Phase.SUSPENDED
    assert transition.requeue_after is None


# ------------------------------------------------------------------------------------------ suspend
@pytest.mark.parametrize("phase", [Phase.PENDING, Phase.PROVISIONING, Phase.RUNNING, Phase.RESTARTING])
def test_suspend_deletes_the_rayjob_keeps_the_other_children_and_cancels_a_pending_restart(
    phase: Phase,
) -> None:
    body = factories.job(spec={"suspend": True})
    owned = TrainingJobOperatorStatus(
        phase=phase, attempt=1, start_time=RFC(NOW), next_restart_time=RFC(NOW + seconds(5))
    )
    transition = decide(
        {**accepted(body), "status": owned.to_wire()}, ray_job("mlp-a1", "RUNNING", "Running")
    )
    assert transition.status.phase == Phase.SUSPENDED
    assert (transition.ray_job, transition.create_ray_job, transition.apply_children) == (None, False, True)
    assert transition.status.next_restart_time is None
    assert transition.status.attempt == 1 and transition.status.restarts == 0
    assert condition(transition, conditions.SUSPENDED)[:2] == ("True", "Suspended")
    assert "mlp-ckpt" in condition(transition, conditions.SUSPENDED)[2]


def test_a_suspended_job_with_checkpoints_in_a_bucket_says_they_stay_in_the_bucket() -> None:
    s3 = {"bucket": "ckpt", "prefix": "team-a", "endpoint": "http://s3.storage:9000"}
    body = factories.job(spec={"suspend": True, "checkpoint": {"storage": {"s3": s3}}})
    owned = TrainingJobOperatorStatus(phase=Phase.RUNNING, attempt=1, start_time=RFC(NOW))
    transition = decide(
        {**accepted(body), "status": owned.to_wire()}, ray_job("mlp-a1", "RUNNING", "Running")
    )
    assert "checkpoints stay in s3://ckpt/team-a/mlp." in condition(transition, conditions.SUSPENDED)[2]


def test_resume_starts_a_new_attempt_that_is_not_counted_as_a_restart_and_resets_the_deadline_clock() -> None:
    owned = TrainingJobOperatorStatus(
        phase=Phase.SUSPENDED, attempt=2, restarts=1, start_time=RFC(NOW - seconds(999))
    )
    transition = decide({**accepted(factories.job()), "status": owned.to_wire()})
    assert (transition.status.phase, transition.status.attempt, transition.status.restarts) == (
        Phase.PENDING,
        3,
        1,
    )
    assert transition.status.start_time == RFC(NOW)
    assert (transition.ray_job, transition.create_ray_job) == ("mlp-a3", True)
    assert transition.restarted is False
    assert [e.reason for e in transition.events] == ["Resumed"]


def test_a_job_created_suspended_creates_no_rayjob_and_starts_attempt_one_on_resume() -> None:
    suspended = decide(factories.job(spec={"suspend": True}))
    assert (suspended.status.phase, suspended.status.attempt, suspended.ray_job) == (Phase.SUSPENDED, 0, None)
    resumed = decide(after(factories.job(), suspended))
    assert (resumed.status.phase, resumed.status.attempt, resumed.ray_job) == (Phase.PENDING, 1, "mlp-a1")


# ------------------------------------------------------------------------------------ finished + TTL
@pytest.mark.parametrize("phase", [Phase.SUCCEEDED, Phase.FAILED])
@pytest.mark.parametrize(
    "observed",
    [
        ray_job("mlp-a1", "RUNNING", "Running"),
        ray_job("mlp-a1", "FAILED", "Failed"),
        ray_job("mlp-a2", "", ""),
    ],
)
def test_finished_jobs_stay_finished_whatever_the_rayjobs_say(
    phase: Phase, observed: observe.RayJobObservation
) -> None:
    owned = TrainingJobOperatorStatus(phase=phase, attempt=1, completion_time=RFC(NOW - seconds(5)))
    transition = decide(
        {**accepted(factories.job(spec={"suspend": True})), "status": owned.to_wire()}, observed
    )
    assert transition.status.phase == phase
    assert transition.status.attempt == 1
    assert transition.create_ray_job is False and transition.apply_children is False
    assert transition.events == ()


def test_ttl_after_finished_requeues_until_due_then_deletes_the_job() -> None:
    body = factories.job(spec={"ttlSecondsAfterFinished": 30})
    owned = TrainingJobOperatorStatus(
        phase=Phase.SUCCEEDED, attempt=1, completion_time=RFC(NOW - seconds(10))
    )
    body = {**accepted(body), "status": owned.to_wire()}
    early = decide(body)
    due = decide(body, now=NOW + seconds(20))
    assert (early.delete_owner, early.requeue_after) == (False, 20.0)
    assert (due.delete_owner, due.requeue_after) == (True, None)


def test_without_ttl_a_finished_job_is_kept_and_never_requeued() -> None:
    owned = TrainingJobOperatorStatus(
        phase=Phase.FAILED, attempt=1, completion_time=RFC(NOW - seconds(10**6))
    )
    transition = decide({**accepted(factories.job()), "status": owned.to_wire()})
    assert (transition.delete_owner, transition.requeue_after) == (False, None)


def test_a_job_finishing_now_is_requeued_for_its_ttl() -> None:
    body = factories.job(spec={"ttlSecondsAfterFinished": 0})
    owned = TrainingJobOperatorStatus(phase=Phase.RUNNING, attempt=1, start_time=RFC(NOW))
    transition = decide(
        {**accepted(body), "status": owned.to_wire()}, ray_job("mlp-a1", "SUCCEEDED", "Complete")
    )
    assert transition.status.phase == Phase.SUCCEEDED
    assert transition.delete_owner is True


# ------------------------------------------------------------------------------------- spec changes
def test_an_immutable_change_is_refused_and_the_job_keeps_running_the_previous_spec() -> None:
    running = with_status(phase=Phase.RUNNING, attempt=1, start_time=RFC(NOW))
    running["spec"]["workers"]["replicas"] = 8
    running["metadata"]["generation"] = 2
    transition = decide(running, ray_job("mlp-a1", "RUNNING", "Running"))
    assert transition.status.phase == Phase.RUNNING
    assert transition.status.workers == 2  # the accepted spec's value
    assert transition.status.observed_generation == 2
    status_, reason, message = condition(transition, conditions.SPEC_APPLIED)
    assert (status_, reason) == ("False", "ImmutableFieldChanged")
    assert "spec.workers.replicas cannot change from 2 to 8" in message
    assert ("Warning", "ImmutableFieldChanged") in [(e.type, e.reason) for e in transition.events]


def test_an_invalid_spec_that_was_never_accepted_fails_the_job_naming_the_field() -> None:
    body = factories.job(spec={"precision": "fp16"})  # fp16 needs GPUs; the CRD schema cannot tell
    transition = decide(body)
    assert transition.status.phase == Phase.FAILED
    assert transition.status.attempt == 0
    assert (transition.ray_job, transition.apply_children) == (None, False)
    valid = condition(transition, conditions.SPEC_VALID)
    assert valid[:2] == ("False", "InvalidSpec") and "fp16" in valid[2]
    assert condition(transition, conditions.FAILED)[1] == "InvalidSpec"
    assert [(e.type, e.reason) for e in transition.events] == [
        ("Warning", "Failed"),
        ("Warning", "InvalidSpec"),
    ]


def test_an_invalid_spec_failure_is_final_and_posts_its_events_once() -> None:
    body = factories.job(spec={"precision": "fp16"})
    first = decide(body)
    second = decide({**body, "status": first.status.to_wire()})
    assert second.status.phase == Phase.FAILED
    assert second.events == ()


def test_fixing_the_spec_of_a_job_that_failed_for_an_invalid_spec_starts_it() -> None:
    invalid = factories.job(spec={"precision": "fp16"})
    failed = decide(invalid)
    fixed = {**factories.job(generation=2), "status": failed.status.to_wire()}
    transition = decide(fixed)
    assert (transition.status.phase, transition.status.attempt, transition.ray_job) == (
        Phase.PENDING,
        1,
        "mlp-a1",
    )
    assert transition.status.completion_time is None
    assert condition(transition, conditions.SPEC_VALID)[0] == "True"
    assert condition(transition, conditions.FAILED)[0] == "False"


def test_a_job_that_failed_after_running_stays_failed_when_its_spec_changes() -> None:
    owned = TrainingJobOperatorStatus(phase=Phase.RUNNING, attempt=1, restarts=2, start_time=RFC(NOW))
    body = {**accepted(factories.job()), "status": owned.to_wire()}
    failed = decide(body, ray_job("mlp-a1", "FAILED", "Failed"))
    assert failed.status.phase == Phase.FAILED
    edited = {**after(body, failed)}
    edited["spec"]["hyperparameters"]["learningRate"] = 0.5
    assert decide(edited).status.phase == Phase.FAILED


def test_an_invalid_edit_of_a_running_job_is_refused_and_the_job_keeps_running() -> None:
    running = with_status(phase=Phase.RUNNING, attempt=1, start_time=RFC(NOW))
    running["spec"]["precision"] = "fp16"
    transition = decide(running, ray_job("mlp-a1", "RUNNING", "Running"))
    assert transition.status.phase == Phase.RUNNING
    assert condition(transition, conditions.SPEC_VALID)[:2] == ("False", "InvalidSpec")
    assert condition(transition, conditions.SPEC_APPLIED)[:2] == ("False", "InvalidSpec")
    assert transition.ray_job == "mlp-a1"
