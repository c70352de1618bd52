"""The conditions on an owner's status, computed whole on every reconcile from the facts at hand.

Every owner carries the same nine condition types, always present, so that ``kubectl wait
--for=condition=Complete`` (or ``Failed``, ``Running``, ``Suspended``) works and ``kubectl describe``
shows what is wrong in one place:

==================  ======================================================================
SpecValid           the spec passed the models' validation (False: InvalidSpec, with fields)
SpecApplied         the spec is what runs (False: ImmutableFieldChanged or InvalidSpec edit)
StorageReady        the checkpoint claim exists and is Bound; with checkpoints in a bucket, the
                    trainer's start-up check could write there (``object_storage``)
RayClusterReady     the current attempt's Ray cluster runs (False: why not, e.g. ImagePullBackOff)
Running             phase is Running
Suspended           spec.suspend stopped the job
Complete            the job succeeded
Failed              the job failed for good (reason: the last failure's class)
Progressing         while Running: the trainer reports progress (False, reason Stalled: the
                    operator's watchdog saw no status.progress update for too long, see
                    ``state_machine``); Unknown while not Running
==================  ======================================================================

``lastTransitionTime`` changes only when a condition's status changes. This module must not talk to the
API; it only shapes facts into ``base.Condition`` values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

from trainop.api import base
from trainop.api.operator_status import Phase
from trainop.api.trainingjob import StorageStatus
from trainop.controller import acceptance, observe

Status = Literal["True", "False", "Unknown"]

SPEC_VALID = "SpecValid"
SPEC_APPLIED = "SpecApplied"
STORAGE_READY = "StorageReady"
RAY_CLUSTER_READY = "RayClusterReady"
RUNNING = "Running"
SUSPENDED = "Suspended"
COMPLETE = "Complete"
FAILED = "Failed"
PROGRESSING = "Progressing"
TYPES = (
    SPEC_VALID,
    SPEC_APPLIED,
    STORAGE_READY,
    RAY_CLUSTER_READY,
    RUNNING,
    SUSPENDED,
    COMPLETE,
    FAILED,
    PROGRESSING,
)
STALLED = "Stalled"
DIAGNOSTIC_TYPES = (SPEC_VALID, SPEC_APPLIED, STORAGE_READY, RAY_CLUSTER_READY)

# Reasons that mean "a user should look at this": a condition turning into one of them posts a Warning.
PROBLEM_REASONS = frozenset(
    {
        "InvalidSpec",
        "ImmutableFieldChanged",
        "ClaimNotFound",
        "ClaimLost",
        "ClaimBeingDeleted",
        "ClaimOwnedByAnother",
        "CreateFailed",
        "QuotaExceeded",
        "ReplicaFailure",
        "Unschedulable",
        "RayJobValidationFailed",
        "KubeRayNotInstalled",
        # status.storage's reasons (the trainer's start-up check of a checkpoint bucket)
        "BucketNotFound",
        "AccessDenied",
        "CredentialsMissing",
        "EndpointUnreachable",
        "StorageError",
        *observe.STUCK_WAITING_REASONS,
    }
)


@dataclasses.dataclass(frozen=True)
class Desired:
    type: str
    status: Status
    reason: str
    message: str


def spec(verdict: acceptance.Acceptance, generation: int | None) -> list[Desired]:
    kind = verdict.kind.kind
    if verdict.errors:
        fields = "; ".join(str(e) for e in verdict.errors)
        if verdict.resource is not None:
            valid = Desired(
                SPEC_VALID,
                "False",
                "InvalidSpec",
                f"{fields}. Fix the field; until then the {kind} keeps running with its last accepted spec.",
            )
        else:
            valid = Desired(SPEC_VALID, "False", "InvalidSpec", f"{fields}. Fix the field and apply again.")
    else:
        valid = Desired(SPEC_VALID, "True", "Valid", "The spec passed validation.")
    if verdict.refused:
        changes = "; ".join(str(c) for c in verdict.refused)
        applied = Desired(
            SPEC_APPLIED,
            "False",
            "ImmutableFieldChanged",
            f"{changes} while the {kind} exists: its checkpoints were written for the old value. Revert the "
            f"change, or delete the {kind} and create a new one. It keeps running with the previous spec.",
        )
    elif verdict.errors:
        applied = Desired(
            SPEC_APPLIED, "False", "InvalidSpec", "The current spec is invalid (see SpecValid)."
        )
    else:
        applied = Desired(
            SPEC_APPLIED,
            "True",
            "Applied",
            f"Generation {generation} is accepted; changes to mutable fields reach the trainer with the "
            "next attempt.",
        )
    return [valid, applied]


def storage(
    claim: observe.ClaimObservation | None,
    *,
    existing: bool,
    create_error: observe.Problem | None,
    kind: str = "TrainingJob",
) -> Desired:
    """StorageReady. ``existing``: the claim is the user's (``existingClaim``), not one the operator makes."""
    if claim is None:
        return Desired(STORAGE_READY, "Unknown", "NotObserved", "No accepted spec names a checkpoint claim.")
    name = claim.name
    if claim.being_deleted:
        after = (
            "Create it again once it is gone, or set spec.checkpoint.storage.existingClaim to another claim."
            if existing
            else "A new claim is created once it is gone."
        )
        return Desired(
            STORAGE_READY,
            "False",
            "ClaimBeingDeleted",
            f"Claim {name} is being deleted; no Ray pod starts until there is a claim to mount. {after}",
        )
    if not existing and claim.ownership == observe.Ownership.OTHER:
        return Desired(
            STORAGE_READY,
            "False",
            "ClaimOwnedByAnother",
            f"Claim {name} belongs to another object (a deleted {kind} of the same name whose claim the "
            "garbage collector is about to delete?); a new claim is created once it is gone.",
        )
    if create_error is not None and claim.phase == observe.ClaimPhase.MISSING:
        return Desired(STORAGE_READY, "False", create_error.reason, create_error.message)
    match claim.phase:
        case observe.ClaimPhase.MISSING if existing:
            return Desired(
                STORAGE_READY,
                "False",
                "ClaimNotFound",
                f"spec.checkpoint.storage.existingClaim {name!r} does not exist in this namespace: create it "
                "(the RayJob is created once it exists) or unset existingClaim so that trainop creates one.",
            )
        case observe.ClaimPhase.MISSING | observe.ClaimPhase.PENDING:
            # MISSING here: the reconcile writing this creates the claim first, unbound like any new one.
            return Desired(
                STORAGE_READY,
                "False",
                "ClaimPending",
                f"Claim {name} has no volume bound yet. With a WaitForFirstConsumer storage class it binds "
                f"when the first Ray pod is scheduled; otherwise see `kubectl describe pvc {name}`.",
            )
        case observe.ClaimPhase.LOST:
            return Desired(
                STORAGE_READY,
                "False",
                "ClaimLost",
                f"Claim {name} lost its volume: checkpoints on it are unreachable. Restore the volume or "
                "delete the claim so that a new one is created.",
            )
    note = ""
    if "ReadWriteOnce" in claim.access_modes or "ReadWriteOncePod" in claim.access_modes:
        note = (
            " It is ReadWriteOnce: every Ray pod must run on one node (use ReadWriteMany across nodes, or "
            "checkpoint.storage.s3)."
        )
    return Desired(
        STORAGE_READY, "True", "ClaimBound", f"Claim {name} is bound to volume {claim.volume}.{note}"
    )


OBJECT_STORAGE_UNCHECKED = "ObjectStorageUnchecked"


def object_storage(location: str, reported: StorageStatus | None, *, attempt: int) -> Desired:
    """StorageReady for checkpoints in a bucket (``checkpoint.storage.s3``): no claim; the truth comes from
    the trainer's driver, which writes a test object there when an attempt starts and records the verdict
    as ``status.storage`` (an operator without the job's credentials cannot look itself). A verdict of an
    earlier attempt counts only until the current attempt's driver has checked again."""
    anywhere = "no claim is mounted, so the Ray pods may run on any nodes"
    if reported is None or reported.attempt != attempt:
        return Desired(
            STORAGE_READY,
            "Unknown",
            OBJECT_STORAGE_UNCHECKED,
            f"Checkpoints go to {location} ({anywhere}); the trainer checks that it can write there when "
            f"attempt {attempt} starts.",
        )
    if reported.ready:
        return Desired(
            STORAGE_READY,
            "True",
            "BucketWritable",
            f"{reported.location} was writable when attempt {reported.attempt} started ({reported.checked}); "
            f"{anywhere}.",
        )
    return Desired(STORAGE_READY, "False", reported.reason, reported.message)


def ray_cluster(
    phase: Phase,
    ray: observe.RayJobObservation | None,
    problems: Sequence[observe.Problem],
    create_error: observe.Problem | None,
    ray_job: str | None = None,
) -> Desired:
    """RayClusterReady. ``ray_job``: the attempt's RayJob as the status names it (None: none is created)."""
    if ray is not None and ray.state == observe.AttemptState.RUNNING:
        return Desired(RAY_CLUSTER_READY, "True", "RayJobRunning", f"RayJob {ray.name} is running.")
    if ray is not None and ray.state == observe.AttemptState.INVALID:
        return Desired(
            RAY_CLUSTER_READY,
            "False",
            "RayJobValidationFailed",
            f"KubeRay refused RayJob {ray.name}: {ray.message}",
        )
    if phase in (Phase.PENDING, Phase.PROVISIONING):
        if create_error is not None:
            return Desired(RAY_CLUSTER_READY, "False", create_error.reason, create_error.message)
        if problems:
            shown = "; ".join(p.message for p in problems[:3])
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            return Desired(RAY_CLUSTER_READY, "False", problems[0].reason, shown + more)
        target = ray.name if ray is not None else ray_job
        if target is None:
            return Desired(
                RAY_CLUSTER_READY,
                "False",
                "NoRayJob",
                "No RayJob is created yet; the Running condition says what the job waits for.",
            )
        return Desired(
            RAY_CLUSTER_READY,
            "False",
            "Provisioning",
            f"Waiting for KubeRay to start the Ray cluster of RayJob {target}.",
        )
    return Desired(
        RAY_CLUSTER_READY, "False", phase.value, f"No Ray cluster runs while the phase is {phase.value}."
    )


def phase(current: Phase, reason: str, message: str) -> list[Desired]:
    """Running, Suspended, Complete and Failed; ``reason``/``message`` explain the current phase."""

    def flag(type_: str, on: bool, off_reason: str) -> Desired:
        if on:
            return Desired(type_, "True", reason, message)
        return Desired(type_, "False", off_reason, f"The phase is {current.value}.")

    return [
        # Running's False message explains why not: the one place to look while a job is not running.
        Desired(RUNNING, "True" if current == Phase.RUNNING else "False", reason, message),
        flag(SUSPENDED, current == Phase.SUSPENDED, "NotSuspended"),
        flag(COMPLETE, current == Phase.SUCCEEDED, "NotComplete"),
        flag(FAILED, current == Phase.FAILED, "NotFailed"),
    ]


def progressing(current: Phase, stall: str | None, watchdog: str) -> Desired:
    """Progressing. ``stall``: the watchdog's finding when it fired in this attempt (then False, Stalled,
    kept while the restart it causes waits); ``watchdog``: what the watchdog checks, for the True message."""
    if stall is not None:
        return Desired(PROGRESSING, "False", STALLED, stall)
    if current == Phase.RUNNING:
        return Desired(PROGRESSING, "True", "Progressing", watchdog)
    return Desired(PROGRESSING, "Unknown", "NotRunning", f"The phase is {current.value}.")


def merge(
    previous: Sequence[base.Condition], desired: Sequence[Desired], *, now: str, generation: int | None
) -> list[base.Condition]:
    """The new condition list: ``lastTransitionTime`` carried over where the status did not change."""
    before = {c.type: c for c in previous}
    merged = []
    for d in desired:
        old = before.get(d.type)
        transition = old.last_transition_time if old is not None and old.status == d.status else now
        merged.append(
            base.Condition(
                type=d.type,
                status=d.status,
                reason=d.reason,
                message=d.message,
                last_transition_time=transition or now,
                observed_generation=generation,
            )
        )
    return merged


def new_problems(
    previous: Sequence[base.Condition], current: Sequence[base.Condition]
) -> list[base.Condition]:
    """Diagnostic conditions that just turned into a problem: each gets one Warning Event.

    Only the diagnostic types count (phase conditions have their phase Event), and a reason is announced
    once (SpecApplied repeats SpecValid's InvalidSpec).
    """
    before = {c.type: (c.status, c.reason) for c in previous}
    problems: list[base.Condition] = []
    for c in current:
        if (
            c.type in DIAGNOSTIC_TYPES
            and c.reason in PROBLEM_REASONS
            and c.status != "True"
            and before.get(c.type) != (c.status, c.reason)
            and c.reason not in {p.reason for p in problems}
        ):
            problems.append(c)
    return problems
