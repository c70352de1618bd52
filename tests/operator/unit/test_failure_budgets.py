"""Failure classes and their budgets, through the state machine: one row per class -- the facts of a failed
attempt in, the class out, counted against its budget, restarted until the budget is used up, then Failed
with a message naming the budget and what to change.

Every row drives a whole job: attempt after attempt, each one Running and then failing with the row's
facts, until the job is Failed. Nothing is mocked: the facts are the API objects (pod bodies, RayJob
statuses, the trainer's status records) the operator reads, turned into observations by the same code the
operator runs (``failures.pod_facts``, ``observe.ray_job``).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable
from typing import Any

import operator_factories as factories
import pytest
from state_machine_cases import NOW, RFC, accepted, after, condition, decide, ray_job, seconds

from trainop.api.operator_status import FailureReason, Phase
from trainop.api.trainingjob import FailureBudgets, FailurePolicy, Progress, WorkerFailures
from trainop.controller import conditions, failures, observe, state_machine

Fail = Callable[[dict[str, Any], int, datetime.datetime], state_machine.Transition]


def pod(name: str, **parts: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": name},
        "spec": {
            "nodeName": "node-2",
            "containers": [{"name": "ray-worker", "resources": {"limits": {"memory": "2Gi"}}}],
        },
        "status": {},
    }
    for key, value in parts.items():
        if key == "metadata":
            body["metadata"].update(value)
        else:
            body["status"][key] = value
    return body


def failed_with_pods(*pods: dict[str, Any]) -> Fail:
    def fail(body: dict[str, Any], attempt: int, now: datetime.datetime) -> state_machine.Transition:
        facts = tuple(f for p in pods for f in failures.pod_facts(p))
        return decide(
            body, ray_job(f"mlp-a{attempt}", "FAILED", "Failed", reason="AppFailed"), now=now, pod_facts=facts
        )

    return fail


def failed_by_the_trainer(reason: str, message: str) -> Fail:
    def fail(body: dict[str, Any], attempt: int, now: datetime.datetime) -> state_machine.Transition:
        record = WorkerFailures.model_validate(
            {
                "counts": {},
                "last": [
                    {
                        "attempt": attempt,
                        "reason": reason,
                        "message": message,
                        "rank": 1,
                        "step": 42,
                        "time": RFC(now),
                        "restarted": False,
                    }
                ],
            }
        )
        return decide(
            body,
            ray_job(f"mlp-a{attempt}", "FAILED", "Failed", reason="AppFailed", message="exit 1"),
            now=now,
            worker_failures=record,
        )

    return fail


def stalled(body: dict[str, Any], attempt: int, now: datetime.datetime) -> state_machine.Transition:
    # One progress report 5 s after the attempt started running, then silence past 900 + 2 x 15 s.
    reported = Progress(step=7, updated=RFC(now - seconds(60) + seconds(5)))
    return decide(
        body, ray_job(f"mlp-a{attempt}", "RUNNING", "Running"), now=now + seconds(940), progress=reported
    )


def refused(body: dict[str, Any], attempt: int, now: datetime.datetime) -> state_machine.Transition:
    return decide(body, ray_job(f"mlp-a{attempt}", "", "ValidationFailed", message="spec.x: bad"), now=now)


def unexplained(body: dict[str, Any], attempt: int, now: datetime.datetime) -> state_machine.Transition:
    return decide(
        body, ray_job(f"mlp-a{attempt}", "FAILED", "Failed", reason="AppFailed", message="exit 1"), now=now
    )


@dataclasses.dataclass(frozen=True)
class Row:
    reason: FailureReason
    fail: Fail
    budget: int  # the budget the row runs with (the default where it is small)
    says: str  # in every failure's message: the facts
    backoff: bool = True


ROWS = [
    Row(
        FailureReason.PREEMPTED,
        failed_with_pods(
            pod("mlp-w-0", metadata={"deletionTimestamp": RFC(NOW), "deletionGracePeriodSeconds": 30})
        ),
        budget=2,
        says="pod mlp-w-0 was deleted with a grace period of 30 s",
        backoff=False,
    ),
    Row(
        FailureReason.PREEMPTED,
        failed_with_pods(pod("mlp-w-1", reason="Evicted", message="The node was low on memory.")),
        budget=2,
        says="pod mlp-w-1 was evicted",
        backoff=False,
    ),
    Row(
        FailureReason.NODE_LOST,
        failed_with_pods(pod("mlp-w-0", reason="NodeLost")),
        budget=2,
        says="node-2 was lost",
        backoff=False,
    ),
    Row(
        FailureReason.OOM_KILLED,
        failed_with_pods(
            pod(
                "mlp-w-0",
                containerStatuses=[
                    {"name": "ray-worker", "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}
                ],
            )
        ),
        budget=FailureBudgets().oom_killed,
        says="container ray-worker was OOMKilled (memory limit 2Gi)",
    ),
    Row(
        FailureReason.OOM_KILLED,
        failed_with_pods(
            pod(
                "mlp-w-0",
                containerStatuses=[
                    {"name": "ray-worker", "lastState": {"terminated": {"reason": "Error", "exitCode": 137}}}
                ],
            )
        ),
        budget=FailureBudgets().oom_killed,
        says="killed (exit 137) under its memory limit 2Gi",
    ),
    Row(
        FailureReason.STALLED, stalled, budget=FailureBudgets().stalled, says="no reported progress for 995 s"
    ),
    Row(
        FailureReason.NCCL_ERROR,
        failed_by_the_trainer("NCCLError", "all_reduce timed out after 600 s"),
        budget=FailureBudgets().nccl_error,
        says="all_reduce timed out after 600 s (rank 1, step 42)",
    ),
    Row(
        FailureReason.USER_CODE_ERROR,
        failed_by_the_trainer("UserCodeError", "ValueError: bad shape at model.py:42 (forward)"),
        budget=FailureBudgets().user_code_error,
        says="ValueError: bad shape at model.py:42 (forward)",
    ),
    Row(
        FailureReason.INFRA_ERROR,
        failed_with_pods(
            pod(
                "mlp-head",
                containerStatuses=[
                    {
                        "name": "ray-head",
                        "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}},
                    }
                ],
            )
        ),
        budget=2,
        says="pod mlp-head container ray-head: ErrImagePull: not found",
    ),
    Row(FailureReason.INVALID_SPEC, refused, budget=FailureBudgets().invalid_spec, says="spec.x: bad"),
    Row(FailureReason.UNKNOWN, unexplained, budget=FailureBudgets().unknown, says="AppFailed: exit 1"),
]


def run_until_failed(fail: Fail, policy: dict[str, Any]) -> tuple[state_machine.Transition, list[float]]:
    """Attempts that run and fail, restarted at their nextRestartTime, until the job is Failed."""
    body = accepted(factories.job(spec={"failurePolicy": {"maxRestarts": None, **policy}}))
    now = NOW
    transition = decide(body, now=now)
    delays: list[float] = []
    for _ in range(20):
        attempt = transition.status.attempt
        body = after(body, transition)
        transition = decide(body, ray_job(f"mlp-a{attempt}", "RUNNING", "Running"), now=now)
        assert transition.status.phase == Phase.RUNNING
        body = after(body, transition)
        now += seconds(60)
        transition = fail(body, attempt, now)
        if transition.status.phase == Phase.FAILED:
            return transition, delays
        assert transition.status.phase == Phase.RESTARTING, transition.status.conditions
        body = after(body, transition)
        due = observe.parse_time(transition.status.next_restart_time)
        assert due is not None
        failed_at = observe.parse_time(transition.status.failures[-1].time)
        assert failed_at is not None
        delays.append((due - failed_at).total_seconds())
        now = max(now, due)
        transition = decide(body, now=now)
        assert transition.restarted and transition.status.phase == Phase.PENDING
    raise AssertionError("the job never failed")


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r.reason.value}-{r.says[:24]}")
def test_each_failure_class_is_restarted_until_its_budget_is_used_up_then_fails_naming_it(row: Row) -> None:
    key = FailureBudgets.key(row.reason)
    transition, delays = run_until_failed(row.fail, {"budgets": {key: row.budget}})

    status = transition.status
    assert status.restarts == row.budget
    assert status.restarts_by_reason == ({row.reason.value: row.budget} if row.budget else {})
    assert [f.reason for f in status.failures] == [row.reason.value] * (row.budget + 1)
    assert all(row.says in f.message for f in status.failures), status.failures[-1].message
    reason, message = condition(transition, conditions.FAILED)[1:]
    assert reason == row.reason.value
    assert message.startswith(f"{row.reason.value}: ")
    assert f"the {key} budget ({row.budget}) is used up: {state_machine.BUDGET_HINTS[row.reason]}" in message
    assert message.endswith(f"or raise spec.failurePolicy.budgets.{key}.")
    if row.backoff:
        assert delays == [min(2**n, 2) for n in range(row.budget)]  # backoffSeconds 1, max 2, per class
    else:
        assert delays == [0.0] * row.budget


def test_the_user_code_error_message_names_the_exception_the_frame_and_the_budget() -> None:
    transition, _ = run_until_failed(
        failed_by_the_trainer("UserCodeError", "ValueError: bad shape at model.py:42 (forward)"), {}
    )
    message = condition(transition, conditions.FAILED)[2]
    assert message == (
        "UserCodeError: ValueError: bad shape at model.py:42 (forward) (rank 1, step 42) (attempt 2); "
        "the userCodeError budget (1) is used up: fix the code, or raise "
        "spec.failurePolicy.budgets.userCodeError."
    )


def test_the_trainers_in_attempt_restarts_use_up_the_same_budget() -> None:
    body = accepted(factories.job(spec={"failurePolicy": {"maxRestarts": None, "budgets": {"ncclError": 2}}}))
    body = {**body, "status": {"phase": "Running", "attempt": 1, "startTime": RFC(NOW)}}
    record = WorkerFailures.model_validate(
        {
            "counts": {"NCCLError": 2},
            "last": [{"attempt": 1, "reason": "NCCLError", "message": "all_reduce hung", "time": RFC(NOW)}],
        }
    )
    transition = decide(body, ray_job("mlp-a1", "FAILED", "Failed"), worker_failures=record)
    assert transition.status.phase == Phase.FAILED
    assert "the ncclError budget (2) is used up" in condition(transition, conditions.FAILED)[2]

    once = record.model_copy(update={"counts": {"NCCLError": 1}})
    transition = decide(body, ray_job("mlp-a1", "FAILED", "Failed"), worker_failures=once)
    assert transition.status.phase == Phase.RESTARTING
    assert "ncclError budget: 2 of 2 used" in condition(transition, conditions.RUNNING)[2]


def test_max_restarts_when_set_caps_attempts_of_every_class() -> None:
    transition, _ = run_until_failed(unexplained, {"maxRestarts": 1})
    assert transition.status.restarts == 1
    assert "maxRestarts=1" in condition(transition, conditions.FAILED)[2]


def test_the_default_budgets_are_the_documented_ones() -> None:
    assert FailurePolicy().max_restarts is None
    assert FailurePolicy().stall_timeout_seconds == 900
    assert {r.value: FailureBudgets().of(r) for r in FailureReason} == {
        "Preempted": 1000,
        "NodeLost": 1000,
        "OOMKilled": 1,
        "Stalled": 3,
        "NCCLError": 3,
        "UserCodeError": 1,
        "InfraError": 5,
        "InvalidSpec": 0,
        "Unknown": 3,
    }


def test_pod_facts_after_the_rayjob_ended_are_not_its_cause() -> None:
    # KubeRay deletes the Ray cluster of a failed RayJob: that deletion is no preemption.
    deleted = pod(
        "mlp-w-0", metadata={"deletionTimestamp": RFC(NOW + seconds(30)), "deletionGracePeriodSeconds": 0}
    )
    ended = dataclasses.replace(ray_job("mlp-a1", "FAILED", "Failed", reason="AppFailed"), ended=NOW)
    found = failures.classify(attempt=1, ray=ended, worker_failures=None, facts=failures.pod_facts(deleted))
    assert found.reason == FailureReason.UNKNOWN
    before = pod(
        "mlp-w-0", metadata={"deletionTimestamp": RFC(NOW + seconds(20)), "deletionGracePeriodSeconds": 30}
    )
    found = failures.classify(attempt=1, ray=ended, worker_failures=None, facts=failures.pod_facts(before))
    assert found.reason == FailureReason.PREEMPTED


def test_the_trainers_record_wins_over_pod_facts_and_only_its_attempt_ending_entry_counts() -> None:
    oom = failures.pod_facts(
        pod(
            "mlp-w-0",
            containerStatuses=[{"name": "ray-worker", "state": {"terminated": {"reason": "OOMKilled"}}}],
        )
    )
    record = WorkerFailures.model_validate(
        {
            "last": [
                {
                    "attempt": 2,
                    "reason": "Stalled",
                    "message": "rank 0 stuck",
                    "time": RFC(NOW),
                    "restarted": True,
                },
                {"attempt": 1, "reason": "UserCodeError", "message": "KeyError: 'x'", "time": RFC(NOW)},
            ]
        }
    )
    ray = ray_job("mlp-a2", "FAILED", "Failed")
    assert failures.classify(attempt=2, ray=ray, worker_failures=record, facts=oom).reason == (
        FailureReason.OOM_KILLED
    )
    ray = ray_job("mlp-a1", "FAILED", "Failed")
    assert failures.classify(attempt=1, ray=ray, worker_failures=record, facts=oom).reason == (
        FailureReason.USER_CODE_ERROR
    )


# ------------------------------------------------------------------------------------ the watchdog
def running_job(**policy: Any) -> dict[str, Any]:
    body = accepted(factories.job(spec={"failurePolicy": policy} if policy else None))
    transition = decide(body, ray_job("mlp-a1", "RUNNING", "Running"))  # enters Running at NOW
    return after(
        {**body, "status": {"phase": "Provisioning", "attempt": 1, "startTime": RFC(NOW)}}, transition
    )


def test_the_watchdog_is_armed_at_running_entry_and_rearmed_by_each_progress_report() -> None:
    body = running_job(stallTimeoutSeconds=10)  # fires after 10 + 2 x 15 s (+ 10 before the first report)
    transition = decide(body, ray_job("mlp-a1", "RUNNING", "Running"), now=NOW + seconds(5))
    assert transition.requeue_after == 45.0
    assert condition(transition, conditions.PROGRESSING)[:2] == ("True", "Progressing")
    fresh = Progress(step=3, updated=RFC(NOW + seconds(30)))
    transition = decide(body, ray_job("mlp-a1", "RUNNING", "Running"), now=NOW + seconds(45), progress=fresh)
    assert transition.status.phase == Phase.RUNNING and transition.requeue_after == 25.0
    # An older attempt's last report does not keep a new attempt alive: Running entry counts (with the
    # allowance before a first report).
    stale = Progress(step=3, updated=RFC(NOW - seconds(3600)))
    transition = decide(body, ray_job("mlp-a1", "RUNNING", "Running"), now=NOW + seconds(49), progress=stale)
    assert transition.status.phase == Phase.RUNNING and transition.requeue_after == 1.0
    transition = decide(body, ray_job("mlp-a1", "RUNNING", "Running"), now=NOW + seconds(50), progress=stale)
    assert transition.status.phase == Phase.RESTARTING and transition.failed == FailureReason.STALLED


def test_the_trainers_in_attempt_restart_rearms_the_operators_watchdog() -> None:
    """The trainer's own watchdog fired (or a worker died) and it restarts the workers in the attempt: the
    operator waits a whole window from that record instead of racing the restart with a new attempt."""
    body = running_job(stallTimeoutSeconds=10)
    last = Progress(step=30, updated=RFC(NOW + seconds(5)))
    restarting = WorkerFailures.model_validate(
        {
            "counts": {"Stalled": 1},
            "last": [
                {
                    "attempt": 1,
                    "reason": "Stalled",
                    "message": "rank 1",
                    "time": RFC(NOW + seconds(20)),
                    "restarted": True,
                }
            ],
        }
    )
    ray = ray_job("mlp-a1", "RUNNING", "Running")
    transition = decide(body, ray, now=NOW + seconds(45), progress=last, worker_failures=restarting)
    assert transition.status.phase == Phase.RUNNING and transition.requeue_after == 15.0  # 20 + 40 - 45
    transition = decide(body, ray, now=NOW + seconds(45), progress=last)
    assert transition.status.phase == Phase.RESTARTING  # without the record: 5 + 40 < 45


def test_a_silent_running_attempt_is_stalled_its_rayjob_deleted_and_the_restart_counted_as_stalled() -> None:
    body = running_job(stallTimeoutSeconds=10)
    once = Progress(step=3, updated=RFC(NOW + seconds(2)))
    transition = decide(body, ray_job("mlp-a1", "RUNNING", "Running"), now=NOW + seconds(42), progress=once)

    assert transition.status.phase == Phase.RESTARTING
    assert transition.ray_job is None  # every RayJob of the owner is deleted, the stalled one included
    assert transition.failed == FailureReason.STALLED
    status, reason, message = condition(transition, conditions.PROGRESSING)
    assert (status, reason) == ("False", "Stalled")
    assert "no reported progress for 40 s (the last one at 2026-03-01T12:00:02Z (step 3))" in message
    assert [(e.type, e.reason) for e in transition.events][:1] == [("Warning", "Stalled")]
    body = after(body, transition)
    due = observe.parse_time(transition.status.next_restart_time)
    assert due is not None
    transition = decide(body, now=due)
    assert (transition.status.attempt, transition.status.restarts_by_reason) == (2, {"Stalled": 1})
    assert condition(transition, conditions.PROGRESSING)[:2] == ("Unknown", "NotRunning")


HEAD_GONE = {
    "conditions": [
        {"type": "RayClusterProvisioned", "status": "True", "reason": "AllPodRunningAndReadyFirstTime"},
        {"type": "HeadPodReady", "status": "False", "reason": "HeadPodNotFound", "message": "not found"},
    ]
}


def test_a_provisioned_cluster_without_its_head_pod_is_a_lost_head_and_a_starting_one_is_not() -> None:
    assert [p.reason for p in observe.cluster_problems(HEAD_GONE)] == [observe.HEAD_POD_LOST]
    starting = {"conditions": [HEAD_GONE["conditions"][1]]}  # not provisioned yet: the head is coming
    assert observe.cluster_problems(starting) == ()


@pytest.mark.parametrize(
    ("facts", "reason", "says"),
    [
        (
            failures.pod_facts(
                pod("mlp-head", metadata={"deletionTimestamp": RFC(NOW), "deletionGracePeriodSeconds": 30})
            ),
            FailureReason.PREEMPTED,
            "pod mlp-head was deleted with a grace period of 30 s",
        ),
        ((), FailureReason.NODE_LOST, "the Ray head pod is gone"),
    ],
)
def test_a_running_attempt_whose_head_pod_is_gone_is_failed_and_restarted_by_its_class(
    facts: tuple[failures.PodFact, ...], reason: FailureReason, says: str
) -> None:
    """KubeRay v1.5 neither recreates the head of a RayJob's provisioned cluster nor fails the RayJob in
    HTTPMode: without this the job would stay Running for ever."""
    body = running_job()
    lost = ray_job("mlp-a1", "RUNNING", "Running", cluster_status=HEAD_GONE)
    transition = decide(body, lost, now=NOW + seconds(30), pod_facts=facts)
    assert transition.status.phase == Phase.RESTARTING
    assert transition.failed == reason
    assert transition.ray_job is None  # the headless RayJob is deleted
    assert says in transition.status.failures[-1].message
    assert transition.status.failures[-1].reason == reason.value


def test_a_sigkill_at_the_end_of_a_deletions_grace_period_is_a_preemption_not_an_oom() -> None:
    """Exit 137 under a memory limit reads as an OOM kill only in a pod nobody is deleting: the kubelet (and
    the node agent) SIGKILL what is left of a deleted pod when its grace period ends."""
    killed = {"terminated": {"reason": "Error", "exitCode": 137}}
    deleted = pod(
        "mlp-head",
        metadata={"deletionTimestamp": RFC(NOW), "deletionGracePeriodSeconds": 1},
        containerStatuses=[{"name": "ray-worker", "state": killed}],
    )
    assert [f.reason for f in failures.pod_facts(deleted)] == [FailureReason.PREEMPTED]
    alive = pod("mlp-w-0", containerStatuses=[{"name": "ray-worker", "state": killed}])
    assert [f.reason for f in failures.pod_facts(alive)] == [FailureReason.OOM_KILLED]


def test_the_pods_explain_a_worker_the_trainer_saw_die_without_a_word() -> None:
    """The trainer's Unknown (a dead worker) gives way to a pod fact (here its node was lost); a class the
    trainer knows (UserCodeError) does not."""
    lost = failures.pod_facts(pod("mlp-w-0", reason="NodeLost"))
    ray = ray_job("mlp-a1", "FAILED", "Failed", reason="AppFailed")

    def record(reason: str) -> WorkerFailures:
        entry = {
            "attempt": 1,
            "reason": reason,
            "message": "worker died",
            "time": RFC(NOW),
            "restarted": False,
        }
        return WorkerFailures.model_validate({"counts": {}, "last": [entry]})

    found = failures.classify(attempt=1, ray=ray, worker_failures=record("Unknown"), facts=lost)
    assert (found.reason, found.source) == (FailureReason.NODE_LOST, "pods")
    found = failures.classify(attempt=1, ray=ray, worker_failures=record("Unknown"), facts=())
    assert (found.reason, found.source) == (FailureReason.UNKNOWN, "trainer")
    found = failures.classify(attempt=1, ray=ray, worker_failures=record("UserCodeError"), facts=lost)
    assert (found.reason, found.source) == (FailureReason.USER_CODE_ERROR, "trainer")


def test_a_failure_nothing_explains_yet_waits_for_the_pods_then_is_unknown() -> None:
    """The RayJob failed, the trainer saw rank 1's process die without a word, and the pods do not say why
    yet: the operator waits up to EVIDENCE_WAIT_S after the RayJob's end (an OOM-killed container's status
    can come after it; e2e 2026-11-27), recording nothing and keeping the RayJob; a pod fact that arrives
    decides, else Unknown. Without the trainer's account (a RayJob that failed before training) there is
    no wait."""
    body = running_job()
    failed = dataclasses.replace(
        ray_job("mlp-a1", "FAILED", "Failed", reason="AppFailed", message="exit 1"), ended=NOW + seconds(60)
    )
    died = WorkerFailures.model_validate(
        {
            "last": [
                {
                    "attempt": 1,
                    "reason": "Unknown",
                    "message": "rank 1's worker process died: Worker exit type: SYSTEM_ERROR",
                    "rank": 1,
                    "time": RFC(NOW + seconds(58)),
                }
            ]
        }
    )
    at_once = decide(body, failed, now=NOW + seconds(62))
    assert [(f.attempt, f.reason) for f in at_once.status.failures] == [(1, "Unknown")]

    waiting = decide(body, failed, now=NOW + seconds(62), worker_failures=died)
    assert waiting.status.failures == [] and waiting.status.phase == Phase.RUNNING, waiting.status
    assert waiting.ray_job == "mlp-a1" and not waiting.create_ray_job and waiting.failed is None
    assert waiting.requeue_after == pytest.approx(state_machine.EVIDENCE_WAIT_S - 2)

    oom = failures.pod_facts(
        pod(
            "mlp-a1-w-0",
            containerStatuses=[
                {
                    "name": "ray-worker",
                    "lastState": {
                        "terminated": {
                            "reason": "OOMKilled",
                            "exitCode": 137,
                            "finishedAt": RFC(NOW + seconds(57)),
                        }
                    },
                }
            ],
        )
    )
    explained = decide(
        after(body, waiting), failed, now=NOW + seconds(64), worker_failures=died, pod_facts=oom
    )
    assert [(f.attempt, f.reason) for f in explained.status.failures] == [(1, "OOMKilled")]
    assert "pod mlp-a1-w-0 container ray-worker was OOMKilled (memory limit 2Gi)" in (
        explained.status.failures[0].message
    )

    late = NOW + seconds(60 + state_machine.EVIDENCE_WAIT_S)
    unexplained = decide(after(body, waiting), failed, now=late, worker_failures=died)
    assert [(f.attempt, f.reason) for f in unexplained.status.failures] == [(1, "Unknown")]
    assert unexplained.status.failures[0].message.startswith("rank 1's worker process died"), unexplained


# ------------------------------------------------------------------------------------ stuck pods (InfraError)
PULL = observe.Problem(
    "ImagePullBackOff", 'pod mlp-a1-head container ray-head: Back-off pulling image "nope:1"'
)
UNSCHEDULABLE = observe.Problem(
    "Unschedulable", "pod mlp-a1-head: 0/3 nodes are available: 3 Insufficient cpu."
)


def starting_job(**policy: Any) -> dict[str, Any]:
    body = accepted(factories.job(spec={"failurePolicy": {"stuckPodTimeoutSeconds": 120, **policy}}))
    return after(body, decide(body))


def starting_for(
    body: dict[str, Any], seconds_after_creation: float, problem: observe.Problem
) -> state_machine.Transition:
    """Attempt 1's transition that long after its RayJob (Initializing) was created, its pods showing
    ``problem``."""
    created = NOW - seconds(60)
    return decide(
        body,
        ray_job("mlp-a1", "", "Initializing", created=created),
        now=created + seconds(seconds_after_creation),
        pod_problems=(problem,),
    )


def test_pods_stuck_on_an_image_pull_fail_the_attempt_as_infra_error_after_the_stuck_pod_timeout() -> None:
    body = starting_job()
    created = NOW - seconds(60)  # the RayJob's creationTimestamp (state_machine_cases.ray_job)
    starting = ray_job("mlp-a1", "", "Initializing", created=created)

    # Before the timeout: still Provisioning, with a reconcile asked for when it runs out (no polling).
    waiting = decide(body, starting, now=created + seconds(100), pod_problems=(PULL,))
    assert waiting.status.phase == Phase.PROVISIONING and not waiting.status.failures
    assert min(waiting.requeue_after or 1e9, 1e9) <= 20.0 + 1e-6, waiting.requeue_after

    failed = decide(body, starting, now=created + seconds(121), pod_problems=(PULL,))
    assert failed.status.phase == Phase.RESTARTING, failed.status.conditions
    assert failed.failed == FailureReason.INFRA_ERROR
    [failure] = failed.status.failures
    assert (failure.attempt, failure.reason) == (1, "InfraError")
    assert failure.message == (
        'ImagePullBackOff: pod mlp-a1-head container ray-head: Back-off pulling image "nope:1"; the Ray pods '
        "of RayJob mlp-a1 did not start in 121 s (spec.failurePolicy.stuckPodTimeoutSeconds: 120)"
    )
    assert failed.status.restarts_by_reason == {} and failed.ray_job is None  # the stuck RayJob goes


def test_pods_stuck_on_an_image_pull_with_no_infra_budget_fail_the_job_naming_the_budget() -> None:
    failed = starting_for(starting_job(budgets={"infraError": 0}), 130, PULL)
    assert failed.status.phase == Phase.FAILED
    reason, message = condition(failed, conditions.FAILED)[1:]
    assert reason == "InfraError"
    assert "Back-off pulling image" in message and "stuckPodTimeoutSeconds: 120" in message, message
    assert "the infraError budget (0) is used up: fix the image" in message, message


def test_unschedulable_pods_wait_for_a_node_however_long_it_takes() -> None:
    later = starting_for(starting_job(), 86400, UNSCHEDULABLE)
    assert later.status.phase == Phase.PROVISIONING and not later.status.failures


def test_the_stuck_pod_timeout_has_a_documented_default_and_floor() -> None:
    assert FailurePolicy().stuck_pod_timeout_seconds == 600
    with pytest.raises(ValueError, match="greater than or equal to 30"):
        FailurePolicy.model_validate({"stuckPodTimeoutSeconds": 29})


def test_a_trainer_entry_names_the_rank_and_the_step_it_has() -> None:
    assert failures.where(1, 42) == " (rank 1, step 42)"
    assert failures.where(1, None) == " (rank 1)"  # failed before its first step: no "step None"
    assert failures.where(None, 42) == ""
