"""The state machine: failures, the restart backoff, attempts and restarts, and giving up."""

from __future__ import annotations

import datetime

import operator_factories as factories
import pytest
from state_machine_cases import NOW, RFC, accepted, after, condition, decide, ray_job, seconds, with_status

from trainop.api.trainingjob import MAX_FAILURE_HISTORY, FailurePolicy, Phase, TrainingJobOperatorStatus
from trainop.controller import conditions, observe, state_machine


# ----------------------------------------------------------------------------------------- failures
def test_a_failed_attempt_is_recorded_and_restarts_after_the_backoff() -> None:
    body = with_status(phase=Phase.RUNNING, attempt=1, start_time=RFC(NOW - seconds(600)))
    failed = ray_job("mlp-a1", "FAILED", "Failed", reason="AppFailed", message="exit code 1")

    transition = decide(body, failed)

    assert transition.status.phase == Phase.RESTARTING
    assert [f.model_dump() for f in transition.status.failures] == [
        {"attempt": 1, "reason": "Unknown", "message": "AppFailed: exit code 1", "time": RFC(NOW)}
    ]
    assert transition.status.next_restart_time == RFC(NOW + seconds(1))
    assert transition.requeue_after == 1.0
    assert transition.ray_job is None  # the failed RayJob is deleted: its cluster's GPUs are freed
    assert transition.status.restarts == 0  # counted when the next attempt starts
    assert transition.status.children is not None and transition.status.children.ray_job is None
    assert [(e.type, e.reason) for e in transition.events] == [("Warning", "Restarting")]
    running = condition(transition, conditions.RUNNING)
    assert running[:2] == ("False", "Unknown")  # no trainer record, no pod fact: the class is not known
    assert "Attempt 2 starts at" in running[2] and "restart 1 of maxRestarts 2" in running[2]
    assert "unknown budget: 1 of 3 used" in running[2]


def test_a_failure_without_a_kuberay_reason_is_unknown_and_names_rayjobfailed() -> None:
    body = with_status(phase=Phase.RUNNING, attempt=1, start_time=RFC(NOW))
    transition = decide(body, ray_job("mlp-a1", "FAILED", "Failed"))
    assert transition.status.failures[-1].reason == "Unknown"
    assert transition.status.failures[-1].message == "RayJobFailed"


def test_restarting_waits_until_next_restart_time() -> None:
    body = with_status(
        phase=Phase.RESTARTING, attempt=1, start_time=RFC(NOW), next_restart_time=RFC(NOW + seconds(30))
    )
    transition = decide(body, ray_job("mlp-a1", "FAILED", "Failed"))
    assert transition.status.phase == Phase.RESTARTING
    assert transition.status.attempt == 1
    assert transition.requeue_after == 30.0
    assert transition.ray_job is None and transition.create_ray_job is False
    assert transition.events == ()


@pytest.mark.parametrize("late_by", [0, 1, 3600])
def test_at_next_restart_time_attempt_n_plus_one_starts_and_counts_a_restart(late_by: int) -> None:
    body = with_status(
        phase=Phase.RESTARTING, attempt=1, start_time=RFC(NOW), next_restart_time=RFC(NOW - seconds(late_by))
    )
    transition = decide(body)
    assert (transition.status.phase, transition.status.attempt, transition.status.restarts) == (
        Phase.PENDING,
        2,
        1,
    )
    assert transition.status.next_restart_time is None
    assert (transition.ray_job, transition.create_ray_job, transition.restarted) == ("mlp-a2", True, True)


@pytest.mark.parametrize(
    ("backoff", "cap", "restarts", "expected"),
    [
        (10, 600, 0, 10),
        (10, 600, 1, 20),
        (10, 600, 2, 40),
        (10, 600, 5, 320),
        (10, 600, 6, 600),
        (10, 600, 99, 600),
        (0, 600, 3, 0),
        (30, 20, 0, 20),  # the cap wins even over the first backoff
    ],
)
def test_restart_backoff_doubles_per_restart_and_is_capped(
    backoff: int, cap: int, restarts: int, expected: int
) -> None:
    policy = FailurePolicy(backoff_seconds=backoff, max_backoff_seconds=cap, max_restarts=100)
    assert state_machine.restart_delay(policy, restarts) == expected


def test_next_restart_time_is_rounded_up_so_the_backoff_is_never_shortened() -> None:
    body = with_status(phase=Phase.RUNNING, attempt=1, start_time=RFC(NOW))
    now = NOW + datetime.timedelta(microseconds=250_000)
    transition = decide(body, ray_job("mlp-a1", "FAILED", "Failed"), now=now)
    assert transition.status.next_restart_time == RFC(NOW + seconds(2))
    assert transition.requeue_after == pytest.approx(1.75)


def test_the_second_failure_of_a_class_waits_twice_the_first_backoff() -> None:
    body = with_status(
        phase=Phase.RUNNING, attempt=2, restarts=1, restarts_by_reason={"Unknown": 1}, start_time=RFC(NOW)
    )
    transition = decide(body, ray_job("mlp-a2", "FAILED", "Failed"))
    assert transition.status.next_restart_time == RFC(NOW + seconds(2))


def test_when_restarts_are_exhausted_the_job_fails_with_the_last_reason() -> None:
    body = with_status(phase=Phase.RUNNING, attempt=3, restarts=2, start_time=RFC(NOW))
    failed = ray_job("mlp-a3", "FAILED", "Failed", reason="SubmissionFailed", message="head pod lost")
    transition = decide(body, failed)
    assert transition.status.phase == Phase.FAILED
    assert transition.status.completion_time == RFC(NOW)
    assert transition.status.failures[-1].attempt == 3
    reason, message = condition(transition, conditions.FAILED)[1:]
    assert reason == "InfraError"  # KubeRay's SubmissionFailed: the job never ran the user's code
    assert "head pod lost" in message and "maxRestarts=2" in message
    assert transition.ray_job == "mlp-a3"  # finished by KubeRay: kept as the record
    assert [(e.type, e.reason) for e in transition.events] == [("Warning", "Failed")]


def test_max_restarts_zero_fails_on_the_first_failure() -> None:
    body = factories.job(spec={"failurePolicy": {"maxRestarts": 0}})
    body = {**accepted(body), "status": TrainingJobOperatorStatus(phase=Phase.RUNNING, attempt=1).to_wire()}
    assert decide(body, ray_job("mlp-a1", "FAILED", "Failed")).status.phase == Phase.FAILED


def test_failure_history_keeps_only_the_latest_entries() -> None:
    history = [{"attempt": i, "reason": "AppFailed", "message": "", "time": RFC(NOW)} for i in range(1, 11)]
    body = factories.job(spec={"failurePolicy": {"maxRestarts": 50}})
    owned = TrainingJobOperatorStatus.model_validate(
        {"phase": "Running", "attempt": 11, "restarts": 10, "failures": history}, by_alias=True
    )
    body = {**accepted(body), "status": owned.to_wire()}
    transition = decide(body, ray_job("mlp-a11", "FAILED", "Failed", reason="AppFailed"))
    assert len(transition.status.failures) == MAX_FAILURE_HISTORY
    assert [f.attempt for f in transition.status.failures] == list(range(2, 12))


def test_a_failure_already_recorded_for_this_attempt_is_not_recorded_twice() -> None:
    owned = TrainingJobOperatorStatus.model_validate(
        {
            "phase": "Running",
            "attempt": 1,
            "failures": [
                {"attempt": 1, "reason": "AppFailed", "message": "x", "time": RFC(NOW - seconds(5))}
            ],
        },
        by_alias=True,
    )
    body = {**accepted(factories.job()), "status": owned.to_wire()}
    transition = decide(body, ray_job("mlp-a1", "FAILED", "Failed", reason="AppFailed", message="x"))
    assert len(transition.status.failures) == 1


def test_a_stopped_rayjob_fails_the_job_without_restarting() -> None:
    body = with_status(phase=Phase.PROVISIONING, attempt=1, start_time=RFC(NOW))
    transition = decide(body, ray_job("mlp-a1", "STOPPED", "Complete", message="spec.foo: bad"))
    assert transition.status.phase == Phase.FAILED
    assert transition.status.restarts == 0 and transition.status.failures == []
    assert condition(transition, conditions.FAILED)[1] == "RayJobStopped"


def test_a_rayjob_kuberay_refuses_is_invalidspec_and_its_zero_budget_fails_the_job() -> None:
    body = with_status(phase=Phase.PROVISIONING, attempt=1, start_time=RFC(NOW))
    transition = decide(body, ray_job("mlp-a1", "", "ValidationFailed", message="spec.foo: bad"))
    assert transition.status.phase == Phase.FAILED
    assert transition.status.restarts == 0
    assert [f.reason for f in transition.status.failures] == ["InvalidSpec"]
    reason, message = condition(transition, conditions.FAILED)[1:]
    assert reason == "InvalidSpec"
    assert "spec.foo: bad" in message and "the invalidSpec budget (0) is used up: fix the spec" in message


def test_a_full_failure_flow_ends_failed_after_max_restarts_with_one_rayjob_per_attempt() -> None:
    body = factories.job()
    now = NOW
    transition = decide(body, now=now)
    asked_for = [transition.ray_job]
    for attempt in (1, 2, 3):
        body = after(body, transition)
        transition = decide(body, ray_job(f"mlp-a{attempt}", "RUNNING", "Running"), now=now)
        assert transition.status.phase == Phase.RUNNING
        body = after(body, transition)
        transition = decide(body, ray_job(f"mlp-a{attempt}", "FAILED", "Failed", reason="AppFailed"), now=now)
        if attempt < 3:
            assert transition.status.phase == Phase.RESTARTING
            body = after(body, transition)
            now = observe.parse_time(transition.status.next_restart_time) or now
            transition = decide(body, now=now)
            asked_for.append(transition.ray_job)
    assert transition.status.phase == Phase.FAILED
    assert (transition.status.attempt, transition.status.restarts) == (3, 2)
    assert [f.attempt for f in transition.status.failures] == [1, 2, 3]
    assert asked_for == ["mlp-a1", "mlp-a2", "mlp-a3"]
