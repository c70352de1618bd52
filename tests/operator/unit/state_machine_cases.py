"""Shared inputs of the state-machine tests: a clock, KubeRay-shaped RayJobs, owners with a given status."""

from __future__ import annotations

import datetime
from typing import Any

import operator_factories as factories

from trainop.api.trainingjob import Progress, TrainingJobOperatorStatus, WorkerFailures
from trainop.controller import acceptance, failures, observe, state_machine

NOW = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.UTC)
RFC = observe.format_time


def seconds(n: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=n)


def ray_job(
    name: str = "mlp-a1",
    job_status: str = "",
    deployment: str = "",
    *,
    reason: str = "",
    message: str = "",
    created: datetime.datetime = NOW - datetime.timedelta(seconds=60),
    cluster_status: dict[str, Any] | None = None,
) -> observe.RayJobObservation:
    """A RayJob as KubeRay v1 reports it (status fields spelled as on the wire)."""
    return observe.ray_job(
        {
            "metadata": {"name": name, "creationTimestamp": RFC(created)},
            "status": {
                "jobStatus": job_status,
                "jobDeploymentStatus": deployment,
                "reason": reason,
                "message": message,
                "rayClusterStatus": cluster_status or {},
            },
        }
    )


def accepted(body: dict[str, Any]) -> dict[str, Any]:
    """The body as it is after the operator accepted its spec (the applied-spec annotation written)."""
    verdict = acceptance.evaluate(body)
    assert verdict.resource is not None and not verdict.refused
    applied = acceptance.serialise(verdict.resource.spec.to_wire())
    annotations = {**body["metadata"].get("annotations", {}), "trainop.dev/applied-spec": applied}
    return {**body, "metadata": {**body["metadata"], "annotations": annotations}}


def decide(
    body: dict[str, Any],
    *ray_jobs: observe.RayJobObservation,
    now: datetime.datetime = NOW,
    claim: observe.ClaimPhase = observe.ClaimPhase.BOUND,
    pod_problems: tuple[observe.Problem, ...] = (),
    create_errors: dict[str, observe.Problem] | None = None,
    ownership: observe.Ownership = observe.Ownership.NONE,
    claim_being_deleted: bool = False,
    foreign_ray_jobs: frozenset[str] = frozenset(),
    leftovers: tuple[str, ...] = (),
    attempt_pods: dict[int, tuple[observe.PodLife, ...]] | None = None,
    namesake_pods: tuple[observe.PodLife, ...] = (),
    worker_failures: WorkerFailures | None = None,
    progress: Progress | None = None,
    pod_facts: tuple[failures.PodFact, ...] = (),
) -> state_machine.Transition:
    verdict = acceptance.evaluate(body)
    claim_name = body["spec"].get("checkpoint", {}).get("storage", {}).get("existingClaim", "mlp-ckpt")
    return state_machine.next_status(
        verdict,
        verdict.kind.operator_status.from_stored(body.get("status")),
        state_machine.Observed(
            now=now,
            generation=body["metadata"].get("generation"),
            ray_jobs={r.name: r for r in ray_jobs},
            claim=observe.ClaimObservation(
                claim_name,
                claim,
                volume="" if claim == observe.ClaimPhase.MISSING else "pv-1",
                access_modes=("ReadWriteMany",),
                being_deleted=claim_being_deleted,
                ownership=ownership,
            ),
            pod_problems=pod_problems,
            create_errors=create_errors or {},
            foreign_ray_jobs=foreign_ray_jobs,
            leftovers=leftovers,
            attempt_pods=attempt_pods or {},
            namesake_pods=namesake_pods,
            worker_failures=worker_failures,
            progress=progress,
            pod_facts=pod_facts,
            # As the reconciler reads it: from the stored spec, whatever the models say of it.
            raw_ttl_seconds_after_finished=body["spec"].get("ttlSecondsAfterFinished"),
        ),
    )


def after(body: dict[str, Any], transition: state_machine.Transition) -> dict[str, Any]:
    """The body once the operator wrote the transition's status (and accepted the spec)."""
    return {**body, "status": transition.status.to_wire()}


def with_status(**fields: Any) -> dict[str, Any]:
    """A job whose operator-owned status already has ``fields`` (snake_case names), spec accepted."""
    owned = TrainingJobOperatorStatus(**fields)
    return accepted({**factories.job(), "status": owned.to_wire()})


def condition(transition: state_machine.Transition, type_: str) -> tuple[str, str, str]:
    found = [c for c in transition.status.conditions if c.type == type_]
    assert len(found) == 1, transition.status.conditions
    return found[0].status, found[0].reason, found[0].message
