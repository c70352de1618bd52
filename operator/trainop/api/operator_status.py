"""The operator-owned part of an owner's status, defined once for both kinds.

A TrainingJob's and a TuningSweep's status are written by two parties on disjoint keys: the operator
(``phase``, ``conditions``, ``attempt``, ``restarts``, ``failures``, ``children``, the times) and the
workload (a TrainingJob's trainer rank 0: ``progress``, ``checkpoint``, ``network``, ``cost`` and the
experiment records ``evaluation``, ``profile``, ``communication``, ``tracking``; a TuningSweep's driver:
``trials``, ``bestTrial``, ``updated``). :class:`OperatorStatus` is the operator's part; each
kind's status model extends it (``trainingjob.TrainingJobOperatorStatus`` adds ``workers``/``gpus``,
then ``TrainingJobStatus`` the trainer's keys; ``tuningsweep.TuningSweepStatus`` the driver's), so the
CRD schema, the docs and the operator's own reads and writes all come from this one definition.

:meth:`OperatorStatus.from_stored` reads only the operator's keys of a stored status and
:meth:`OperatorStatus.merge_patch_from` computes a JSON merge patch from what is stored to what is
wanted, so the workload's keys are never in a patch the operator sends and can never be overwritten by it.

This module must not import anything heavier than pydantic (both images import the API).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Self

import pydantic

from trainop.api import base

MAX_FAILURE_HISTORY = 10


class Phase(enum.StrEnum):
    """Where a job is in its life. Only the operator writes it."""

    PENDING = "Pending"
    PROVISIONING = "Provisioning"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def finished(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED)


class FailureReason(enum.StrEnum):
    """Why an attempt (or, in the trainer, a worker group inside one) failed: the failure classes.

    Each class has its own restart budget (spec.failurePolicy.budgets). The trainer's failure records
    (status.workerFailures) use the same strings.
    """

    PREEMPTED = "Preempted"  # the pod was evicted or deleted with a grace period (spot, drain)
    NODE_LOST = "NodeLost"  # the node went away or stopped reporting Ready
    OOM_KILLED = "OOMKilled"  # a container was killed over its memory limit
    STALLED = "Stalled"  # no training progress for failurePolicy.stallTimeoutSeconds
    NCCL_ERROR = "NCCLError"  # a collective failed or timed out
    USER_CODE_ERROR = "UserCodeError"  # the training function raised
    INFRA_ERROR = "InfraError"  # image pull, scheduling, KubeRay or Ray start-up
    INVALID_SPEC = "InvalidSpec"  # KubeRay refused the RayJob the spec produced
    UNKNOWN = "Unknown"  # none of the facts seen says which


class Failure(base.ApiModel):
    attempt: int
    """The attempt that failed."""
    reason: str
    """The failure class, one of Preempted, NodeLost, OOMKilled, Stalled, NCCLError, UserCodeError,
    InfraError, InvalidSpec, Unknown; each is counted against its own budget in
    spec.failurePolicy.budgets."""
    message: str = ""
    """The facts the class was decided from: the trainer's account (exception type and last frame for a
    UserCodeError, the stuck rank for a Stalled attempt), the pod's or node's state, or KubeRay's
    message."""
    time: str
    """When the operator recorded the failure (RFC 3339, UTC)."""


# The owner's children by name: each one named exists, or is being created by the reconcile that wrote it.
class Children(base.ApiModel):
    ray_job: str | None = None
    """The RayJob of the current attempt, <name>-a<attempt> (<name>-s<attempt> for a TuningSweep)."""
    config_map: str | None = None
    """The ConfigMap holding the trainer's config (trainer.json), mounted at /etc/trainop in the Ray pods."""
    persistent_volume_claim: str | None = None
    """The checkpoint claim the Ray pods mount: the one trainop created, or
    checkpoint.storage.existingClaim."""
    service_account: str | None = None
    """The Ray pods' ServiceAccount, allowed only to get and patch this object's status."""


class OperatorStatus(base.ApiModel):
    """The status fields only the operator writes (every kind has them)."""

    phase: Phase | None = None
    """Where the job is: Pending (its storage and RayJob are being created, or KubeRay has not started the
    RayJob yet), Provisioning (KubeRay starts the Ray cluster), Running, Restarting (an attempt failed; the
    next one starts after a backoff and resumes from the newest checkpoint), Suspended (spec.suspend),
    Succeeded or Failed. Written by the operator."""
    conditions: list[base.Condition] = pydantic.Field(default_factory=list)
    """Always the same nine conditions, for kubectl wait and kubectl describe: SpecValid, SpecApplied,
    StorageReady, RayClusterReady, Running, Suspended, Complete, Failed, Progressing. A condition's reason
    and message say what is wrong, what the operator waits for, and what to do. Written by the operator."""
    observed_generation: int | None = None
    """The metadata.generation of the spec the operator last acted on."""
    attempt: int = 0
    """The current attempt, counted from 1: each runs in its own RayJob. A new attempt starts after a failure
    (a restart) or when a suspended job resumes. 0 before the first."""
    restarts: int = 0
    """Attempts started because the one before failed (restartsByReason has them by class), at most
    spec.failurePolicy.maxRestarts when set. Resuming from suspend does not count."""
    restarts_by_reason: dict[str, int] = pydantic.Field(default_factory=dict)
    """Attempts started after a failure, by the class of that failure (Preempted, UserCodeError, ...). With
    the trainer's in-attempt restarts (status.workerFailures.counts) they use up
    spec.failurePolicy.budgets."""
    failures: list[Failure] = pydantic.Field(default_factory=list, max_length=MAX_FAILURE_HISTORY)
    """The failed attempts, oldest first, at most the last 10: attempt, reason, message, time."""
    children: Children | None = None
    """The objects the operator created for this job, by kind: each one named exists, or is being created."""
    start_time: str | None = None
    """When the job started running: the first attempt's start, reset when a suspended job resumes.
    activeDeadlineSeconds counts from it (RFC 3339, UTC)."""
    completion_time: str | None = None
    """When the job Succeeded or Failed (RFC 3339, UTC)."""
    next_restart_time: str | None = None
    """While Restarting: when the next attempt starts, after the backoff (RFC 3339, UTC)."""

    @classmethod
    def operator_keys(cls) -> frozenset[str]:
        """The wire names of this model's fields: call it on an operator-owned model (this class or a
        kind's extension of it with operator fields only), not on a kind's whole status model."""
        return frozenset(f.alias or name for name, f in cls.model_fields.items())

    @classmethod
    def from_stored(cls, raw: Mapping[str, Any] | None) -> Self:
        """The operator's part of a status exactly as stored (the workload's keys are left out)."""
        return cls.model_validate(stored_part(cls, raw), by_alias=True, by_name=False)

    def merge_patch_from(self, raw: Mapping[str, Any] | None) -> dict[str, Any]:
        """The RFC 7386 JSON merge patch that turns the stored operator keys of ``raw`` into these.

        Computed against what is stored, not against model defaults: ``restarts: 0`` is not in a new
        object's status until written.
        """
        return merge_patch(stored_part(type(self), raw), self.to_wire())


def stored_part(model: type[OperatorStatus], raw: Mapping[str, Any] | None) -> dict[str, Any]:
    keys = model.operator_keys()
    return {k: v for k, v in (raw or {}).items() if k in keys}


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """An RFC 7386 JSON merge patch turning ``old`` into ``new`` (removed keys become null)."""
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            nested = merge_patch(before, value)
            if nested:
                patch[key] = nested
        elif value != before:
            patch[key] = value
    for key in old:
        if key not in new:
            patch[key] = None
    return patch
