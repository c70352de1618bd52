"""Reading KubeRay RayJobs, claims and Ray pods into observations (``observe``)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from trainop.controller import observe


def ray_job(status: dict[str, Any] | None) -> dict[str, Any]:
    return {"metadata": {"name": "mlp-a1", "creationTimestamp": "2026-03-01T12:00:00Z"}, "status": status}


@pytest.mark.parametrize(
    ("status", "state"),
    [
        (None, observe.AttemptState.NEW),
        ({}, observe.AttemptState.NEW),
        ({"jobDeploymentStatus": "Initializing"}, observe.AttemptState.STARTING),
        ({"jobDeploymentStatus": "Waiting"}, observe.AttemptState.STARTING),
        ({"jobDeploymentStatus": "Running", "jobStatus": "PENDING"}, observe.AttemptState.STARTING),
        ({"jobDeploymentStatus": "Retrying"}, observe.AttemptState.STARTING),
        ({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}, observe.AttemptState.RUNNING),
        ({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}, observe.AttemptState.SUCCEEDED),
        ({"jobDeploymentStatus": "Failed", "jobStatus": "FAILED"}, observe.AttemptState.FAILED),
        ({"jobDeploymentStatus": "Failed", "jobStatus": "RUNNING"}, observe.AttemptState.FAILED),
        ({"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED"}, observe.AttemptState.STOPPED),
        ({"jobDeploymentStatus": "ValidationFailed"}, observe.AttemptState.INVALID),
    ],
)
def test_kuberay_statuses_fold_into_one_attempt_state(
    status: dict[str, Any] | None, state: observe.AttemptState
) -> None:
    assert observe.ray_job(ray_job(status)).state == state


def test_reason_message_creation_and_cluster_name_are_read() -> None:
    seen = observe.ray_job(
        ray_job(
            {
                "jobDeploymentStatus": "Failed",
                "jobStatus": "FAILED",
                "reason": "AppFailed",
                "message": "boom",
                "rayClusterName": "mlp-a1-x2",
            }
        )
    )
    assert (seen.reason, seen.message, seen.cluster_name) == ("AppFailed", "boom", "mlp-a1-x2")
    assert seen.created == datetime.datetime(2026, 3, 1, 12, tzinfo=datetime.UTC)


def test_long_driver_messages_are_cut() -> None:
    seen = observe.ray_job(ray_job({"jobStatus": "FAILED", "message": "x" * 5000}))
    assert len(seen.message) == observe.MAX_MESSAGE


@pytest.mark.parametrize("state", list(observe.AttemptState))
def test_terminal_states_are_exactly_the_finished_ones(state: observe.AttemptState) -> None:
    assert state.terminal == (state.value in {"Succeeded", "Failed", "Stopped", "Invalid"})


@pytest.mark.parametrize(
    ("obj", "phase"),
    [
        (None, observe.ClaimPhase.MISSING),
        ({"status": {}}, observe.ClaimPhase.PENDING),
        ({"status": {"phase": "Pending"}}, observe.ClaimPhase.PENDING),
        ({"status": {"phase": "Bound"}, "spec": {"volumeName": "pv-1"}}, observe.ClaimPhase.BOUND),
        ({"status": {"phase": "Lost"}}, observe.ClaimPhase.LOST),
    ],
)
def test_claim_phases(obj: dict[str, Any] | None, phase: observe.ClaimPhase) -> None:
    assert observe.claim("c", obj).phase == phase


def pod(name: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": status}


def waiting(reason: str, message: str = "") -> dict[str, Any]:
    return {"name": "ray-worker", "state": {"waiting": {"reason": reason, "message": message}}}


def test_pods_that_cannot_pull_their_image_are_problems() -> None:
    problems = observe.pod_problems(
        [pod("w-1", containerStatuses=[waiting("ImagePullBackOff", 'Back-off pulling image "nope:1"')])]
    )
    assert problems == (
        observe.Problem("ImagePullBackOff", 'pod w-1 container ray-worker: Back-off pulling image "nope:1"'),
    )


def test_unschedulable_pods_are_problems_with_the_schedulers_words() -> None:
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
    }
    problems = observe.pod_problems([pod("w-2", conditions=[condition])])
    assert problems == (
        observe.Problem("Unschedulable", "pod w-2: 0/4 nodes are available: 4 Insufficient nvidia.com/gpu."),
    )


def test_init_containers_count_and_problems_are_sorted_by_pod() -> None:
    problems = observe.pod_problems(
        [
            pod("b", containerStatuses=[waiting("CrashLoopBackOff")]),
            pod("a", initContainerStatuses=[waiting("ErrImagePull")]),
        ]
    )
    assert [p.reason for p in problems] == ["ErrImagePull", "CrashLoopBackOff"]


@pytest.mark.parametrize("reason", ["ContainerCreating", "PodInitializing"])
def test_pods_that_are_merely_starting_are_not_problems(reason: str) -> None:
    assert observe.pod_problems([pod("w", containerStatuses=[waiting(reason)])]) == ()


def test_replica_failures_on_the_ray_cluster_are_problems_and_quota_is_named() -> None:
    problems = observe.cluster_problems(
        {
            "conditions": [
                {
                    "type": "ReplicaFailure",
                    "status": "True",
                    "message": "pods is forbidden: exceeded quota: q",
                },
                {"type": "HeadPodReady", "status": "False", "message": "not yet"},
            ]
        }
    )
    assert [p.reason for p in problems] == ["QuotaExceeded"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-03-01T12:00:00Z", datetime.datetime(2026, 3, 1, 12, tzinfo=datetime.UTC)),
        ("2026-03-01T12:00:00.5+00:00", datetime.datetime(2026, 3, 1, 12, 0, 0, 500000, tzinfo=datetime.UTC)),
        ("2026-03-01T12:00:00", datetime.datetime(2026, 3, 1, 12, tzinfo=datetime.UTC)),
        ("", None),
        ("yesterday", None),
        (None, None),
    ],
)
def test_times_are_parsed_leniently_and_always_in_utc(text: Any, expected: datetime.datetime | None) -> None:
    assert observe.parse_time(text) == expected


def test_times_are_written_in_kubernetes_format() -> None:
    moment = datetime.datetime(
        2026, 3, 1, 13, 0, 0, 999, tzinfo=datetime.timezone(datetime.timedelta(hours=1))
    )
    assert observe.format_time(moment) == "2026-03-01T12:00:00Z"
