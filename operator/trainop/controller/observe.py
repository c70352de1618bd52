"""Pure translations of what the API shows (RayJobs, claims, pods, RayClusters) into observations.

KubeRay v1 reports a RayJob's progress in two fields: ``status.jobStatus`` (the Ray job: PENDING,
RUNNING, STOPPED, SUCCEEDED, FAILED) and ``status.jobDeploymentStatus`` (KubeRay's lifecycle:
Initializing, Running, Complete, Failed, ValidationFailed, Suspending, Suspended, Retrying, Waiting).
:func:`ray_job` folds both into one :class:`AttemptState`, which is all the state machine needs.
Problems a user can act on (image pulls, scheduling, quota, an invalid RayJob) become :class:`Problem`
values with one sentence each.

This module must not talk to the API or decide anything; ``state_machine`` decides.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Iterable, Mapping
from typing import Any

# Messages copied from KubeRay or Ray (driver logs can be long) are cut to this many characters.
MAX_MESSAGE = 1024
# Container waiting reasons that will not fix themselves and that a user can act on.
STUCK_WAITING_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "CrashLoopBackOff",
        "RunContainerError",
    }
)


# The problem a provisioned RayCluster without its head pod has (``cluster_problems``).
HEAD_POD_LOST = "HeadPodLost"


class AttemptState(enum.Enum):
    ABSENT = "Absent"  # no RayJob of this attempt exists (yet)
    NEW = "New"  # created, KubeRay has not picked it up (empty status)
    STARTING = "Starting"  # KubeRay is creating the Ray cluster or submitting the job
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    STOPPED = "Stopped"  # the Ray job was stopped from outside (ray job stop)
    INVALID = "Invalid"  # KubeRay refused the RayJob (ValidationFailed)

    @property
    def terminal(self) -> bool:
        return self in (
            AttemptState.SUCCEEDED,
            AttemptState.FAILED,
            AttemptState.STOPPED,
            AttemptState.INVALID,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Problem:
    reason: str
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class RayJobObservation:
    name: str
    state: AttemptState
    reason: str = ""
    message: str = ""
    created: datetime.datetime | None = None
    cluster_name: str = ""
    problems: tuple[Problem, ...] = ()
    ended: datetime.datetime | None = None  # KubeRay's status.endTime: when the Ray job finished


class Ownership(enum.Enum):
    """A child's owner references, seen from the owner being reconciled."""

    NONE = "none"  # no owner reference (a claim kept from an earlier job, or the user's)
    THIS = "this"  # a reference to this owner incarnation
    OTHER = "other"  # references to other objects only (a deleted namesake's, or someone else's)


class ClaimPhase(enum.StrEnum):
    MISSING = "Missing"
    PENDING = "Pending"
    BOUND = "Bound"
    LOST = "Lost"


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimObservation:
    name: str
    phase: ClaimPhase
    volume: str = ""
    access_modes: tuple[str, ...] = ()
    being_deleted: bool = False
    ownership: Ownership = Ownership.NONE


def ray_job(obj: Mapping[str, Any]) -> RayJobObservation:
    status: Mapping[str, Any] = obj.get("status") or {}
    job_status = str(status.get("jobStatus") or "")
    deployment = str(status.get("jobDeploymentStatus") or "")
    reason = str(status.get("reason") or "")
    message = _cut(str(status.get("message") or ""))
    state = _state(job_status, deployment)
    if state == AttemptState.FAILED and not reason:
        reason = "RayJobFailed"
    return RayJobObservation(
        name=str(obj["metadata"]["name"]),
        state=state,
        reason=reason,
        message=message,
        created=parse_time(obj["metadata"].get("creationTimestamp")),
        cluster_name=str(status.get("rayClusterName") or ""),
        problems=cluster_problems(status.get("rayClusterStatus") or {}),
        ended=parse_time(status.get("endTime")),
    )


def _state(job_status: str, deployment: str) -> AttemptState:
    # Terminal Ray job statuses win: in K8sJobMode KubeRay keeps the deployment Running until the
    # submitter finishes, but the Ray job's own status is already final.
    if deployment == "ValidationFailed":
        return AttemptState.INVALID
    if job_status == "SUCCEEDED":
        return AttemptState.SUCCEEDED
    if job_status == "FAILED" or deployment == "Failed":
        return AttemptState.FAILED
    if job_status == "STOPPED":
        return AttemptState.STOPPED
    if job_status == "RUNNING":
        return AttemptState.RUNNING
    if deployment == "" and job_status == "":
        return AttemptState.NEW
    return AttemptState.STARTING


def cluster_problems(cluster_status: Mapping[str, Any]) -> tuple[Problem, ...]:
    """Problems in a RayCluster's status (also embedded in a RayJob's status.rayClusterStatus).

    KubeRay sets condition ``ReplicaFailure`` when it cannot create a pod (quota, admission), and
    ``HeadPodReady=False`` with reason ``HeadPodNotFound`` when the head pod is gone. Once the cluster was
    ``RayClusterProvisioned``, KubeRay v1.5 does not create a new head for a RayJob's cluster ("to let
    RayJob controller handle the failure"), and in HTTPMode the RayJob controller never does: it retries
    the dead dashboard and the RayJob stays RUNNING for ever. That is :data:`HEAD_POD_LOST`, which the
    state machine turns into a failed attempt.
    """
    problems = []
    conditions = {str(c.get("type")): c for c in cluster_status.get("conditions") or ()}
    for condition in conditions.values():
        if condition.get("type") == "ReplicaFailure" and condition.get("status") == "True":
            text = str(condition.get("message") or condition.get("reason") or "")
            reason = "QuotaExceeded" if "exceeded quota" in text else "ReplicaFailure"
            problems.append(Problem(reason, _cut(f"KubeRay cannot create a Ray pod: {text}")))
    head = conditions.get("HeadPodReady") or {}
    provisioned = conditions.get("RayClusterProvisioned") or {}
    if (
        head.get("status") == "False"
        and head.get("reason") == "HeadPodNotFound"
        and provisioned.get("status") == "True"
    ):
        problems.append(
            Problem(
                HEAD_POD_LOST,
                "the Ray head pod is gone and KubeRay does not create a new head for a RayJob's cluster",
            )
        )
    return tuple(problems)


def claim(name: str, obj: Mapping[str, Any] | None) -> ClaimObservation:
    if obj is None:
        return ClaimObservation(name=name, phase=ClaimPhase.MISSING)
    status = obj.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    return ClaimObservation(
        name=name,
        phase=ClaimPhase(phase) if phase in ClaimPhase.__members__.values() else ClaimPhase.PENDING,
        volume=str((obj.get("spec") or {}).get("volumeName") or ""),
        access_modes=tuple(status.get("accessModes") or (obj.get("spec") or {}).get("accessModes") or ()),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class PodLife:
    """Whether a pod's processes may still run: not once it Succeeded or Failed, and, once it is being
    deleted, not after its deletion deadline (``deletionTimestamp``: the request's time plus the grace
    period, when the kubelet kills what is left; a pod of a lost node stays Terminating past it, with
    nothing running)."""

    name: str
    ended: bool
    deletion_due: datetime.datetime | None = None

    def may_run(self, now: datetime.datetime) -> bool:
        return not self.ended and (self.deletion_due is None or now < self.deletion_due)


def pod_life(pod: Mapping[str, Any]) -> PodLife:
    meta = pod["metadata"]
    phase = (pod.get("status") or {}).get("phase")
    return PodLife(
        str(meta["name"]),
        ended=phase in ("Succeeded", "Failed"),
        deletion_due=parse_time(meta.get("deletionTimestamp")),
    )


def pod_problems(pods: Iterable[Mapping[str, Any]]) -> tuple[Problem, ...]:
    """Stuck containers and unschedulable pods among the Ray pods of one attempt, sorted by pod name."""
    problems: list[Problem] = []
    for pod in sorted(pods, key=lambda p: str(p["metadata"]["name"])):
        name = pod["metadata"]["name"]
        status = pod.get("status") or {}
        for condition in status.get("conditions") or ():
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"
            ):
                problems.append(Problem("Unschedulable", _cut(f"pod {name}: {condition.get('message', '')}")))
        statuses = [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]
        for container in statuses:
            waiting = (container.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason in STUCK_WAITING_REASONS:
                detail = waiting.get("message") or reason
                problems.append(
                    Problem(reason, _cut(f"pod {name} container {container.get('name')}: {detail}"))
                )
    return tuple(problems)


def parse_time(value: object) -> datetime.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def format_time(value: datetime.datetime) -> str:
    """Kubernetes' metav1.Time format: RFC 3339 in UTC, whole seconds."""
    return value.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cut(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"
