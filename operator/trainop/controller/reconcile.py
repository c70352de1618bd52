"""One reconcile of one owner: read, decide (pure), write -- in that order, and writes in a fixed order.

1. Read the owner fresh from the API (never a possibly stale watch body), then, concurrently, its RayJobs
   (one label-selected LIST), its checkpoint claim and, while an attempt is starting, that attempt's Ray
   pods.
2. Decide: ``acceptance.evaluate`` (which spec to run) and ``status.next_status`` (the state machine).
3. Write:
   a. the accepted spec into the owner's ``trainop.dev/applied-spec`` annotation, when it changed;
   b. the operator-owned status fields, as a JSON merge patch computed against what was read, so the
      trainer's fields (progress, checkpoint, network) are never part of the patch;
   c. Events for phase transitions and new problems (posted before b: see ``events``);
   d. the children in ``CREATION_WAVES`` (claim, ConfigMap, ServiceAccount and Role concurrently, then
      the RoleBinding), then the attempt's RayJob; RayJobs of other attempts are deleted; or, after
      ttlSecondsAfterFinished, the owner itself. The claim and RayJobs just read are handed to
      ``apply.ensure`` (no second read); children this process verified with the same desired manifest
      are skipped (``verified``).

Writing the status before acting on it makes every crash window safe: a restarted operator reads the
recorded intent (a failure, a new attempt number) and repeats the same idempotent actions.

Returns when to reconcile again (``requeue_after``), for restart backoffs, deadlines and TTLs. This module
must not be called for one owner by two tasks at once (the work queue guarantees it), and must not keep
state across reconciles except the last child-creation errors, which only feed conditions, and the
``verified`` record, which only saves requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from collections.abc import Callable, Mapping
from typing import Any

from trainop.api.trainingjob import Phase
from trainop.controller import (
    acceptance,
    apply,
    children,
    events,
    failpoints,
    kinds,
    kube,
    observe,
    status,
    status_fields,
    verified,
)

log = logging.getLogger(__name__)

Clock = Callable[[], datetime.datetime]


@dataclasses.dataclass(frozen=True)
class OwnerKey:
    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclasses.dataclass(frozen=True)
class Outcome:
    requeue_after: float | None = None
    decision: status.Decision | None = None


# Children are written in waves; the children of one wave do not depend on each other and are written
# concurrently. A RoleBinding needs its Role (RBAC's escalation check reads the Role: 404 without it),
# and the RayJob, whose pods need all the others, comes last, only once they are in place.
CREATION_WAVES: tuple[frozenset[str], ...] = (
    frozenset({"PersistentVolumeClaim", "ConfigMap", "ServiceAccount", "Role"}),
    frozenset({"RoleBinding"}),
    frozenset({"RayJob"}),
)


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclasses.dataclass(frozen=True)
class _Read:
    """What a reconcile read besides the owner: its RayJobs and claim are handed on to ``apply.ensure``."""

    observed: status.Observed
    ray_jobs: list[dict[str, Any]]
    claim: dict[str, Any] | None


class Reconciler:
    def __init__(
        self, client: kube.Kube, *, clock: Clock = utcnow, children_verified: verified.Verified | None = None
    ) -> None:
        self._kube = client
        self._clock = clock
        # Child creation errors of the previous reconcile, by owner: they explain a stuck phase.
        self._create_errors: dict[OwnerKey, dict[str, observe.Problem]] = {}
        self._verified = children_verified or verified.Verified()

    def forget(self, key: OwnerKey) -> None:
        self._create_errors.pop(key, None)
        self._verified.forget(key)

    async def reconcile(self, key: OwnerKey) -> Outcome:
        kind = kinds.BY_KIND[key.kind]
        resource_api = kube.Resource(kind.api_version, kind.plural)
        body = await self._kube.get(resource_api, key.namespace, key.name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self.forget(key)
            return Outcome()  # the garbage collector removes the children
        verdict = acceptance.evaluate(body)
        read = await self._observe(key, kind, body, verdict)
        current = status_fields.OwnedStatus.from_status(body.get("status"))
        decision = status.next_status(verdict, current, read.observed)

        if verdict.applied_spec is not None:
            await self._kube.patch(
                resource_api,
                key.namespace,
                key.name,
                {"metadata": {"annotations": {kinds.ANNOTATION_APPLIED_SPEC: verdict.applied_spec}}},
            )
        # Events first: their names are deterministic, so a repeat after a crash is a no-op (409).
        await events.post(self._kube, body, decision.events, now=observe.format_time(read.observed.now))
        patch = status_fields.merge_patch(
            status_fields.stored(body.get("status")), decision.status.wire(kind)
        )
        if patch:
            await self._kube.patch(
                resource_api, key.namespace, key.name, {"status": patch}, subresource="status"
            )
            failpoints.hit("status-written", str(decision.status.phase))

        if decision.delete_owner:
            log.info("%s: ttlSecondsAfterFinished passed; deleting it", key)
            await self._kube.delete(resource_api, key.namespace, key.name, uid=body["metadata"]["uid"])
            return Outcome(decision=decision)
        await self._write_children(key, verdict, decision, read, seen_before=current.children is not None)
        return Outcome(requeue_after=decision.requeue_after, decision=decision)

    async def _observe(
        self, key: OwnerKey, kind: kinds.Kind, body: Mapping[str, Any], verdict: acceptance.Acceptance
    ) -> _Read:
        owner_uid = body["metadata"]["uid"]
        selector = f"{kind.owner_label}={key.name}"
        raw_status = body.get("status") or {}
        starting = raw_status.get("phase") in (Phase.PENDING.value, Phase.PROVISIONING.value) and bool(
            raw_status.get("attempt")
        )
        claim_name = kinds.claim_name(verdict.resource) if verdict.resource is not None else None

        async def no_claim() -> None:
            return None

        async def no_pods() -> list[dict[str, Any]]:
            return []

        listed, claim, pods = await asyncio.gather(
            self._kube.list(kube.RAY_JOBS, key.namespace, label_selector=selector),
            self._kube.get(kube.CLAIMS, key.namespace, claim_name) if claim_name else no_claim(),
            self._kube.list(
                kube.PODS,
                key.namespace,
                label_selector=f"{selector},{kinds.LABEL_ATTEMPT}={raw_status.get('attempt')}",
            )
            if starting
            else no_pods(),
        )
        ray_jobs = [r for r in listed if apply.owned_by(r, owner_uid)]
        observations = {r["metadata"]["name"]: observe.ray_job(r) for r in ray_jobs}
        if starting:
            observations = await self._with_cluster_problems(key.namespace, observations)
        observed = status.Observed(
            now=self._clock(),
            generation=body["metadata"].get("generation"),
            ray_jobs=observations,
            claim=observe.claim(claim_name, claim) if claim_name else None,
            pod_problems=observe.pod_problems(pods),
            create_errors=dict(self._create_errors.get(key, {})),
        )
        return _Read(observed, ray_jobs, claim)

    async def _with_cluster_problems(
        self, namespace: str, observations: dict[str, observe.RayJobObservation]
    ) -> dict[str, observe.RayJobObservation]:
        """While starting, KubeRay reports pod creation failures (quota) only on the RayCluster."""
        out = {}
        for name, ray in observations.items():
            if ray.state == observe.AttemptState.STARTING and ray.cluster_name and not ray.problems:
                cluster = await self._kube.get(kube.RAY_CLUSTERS, namespace, ray.cluster_name)
                if cluster is not None:
                    ray = dataclasses.replace(
                        ray, problems=observe.cluster_problems(cluster.get("status") or {})
                    )
            out[name] = ray
        return out

    async def _write_children(
        self,
        key: OwnerKey,
        verdict: acceptance.Acceptance,
        decision: status.Decision,
        read: _Read,
        *,
        seen_before: bool,
    ) -> None:
        resource = verdict.resource
        owner_uid = resource.metadata.uid if resource is not None else None
        errors: dict[str, observe.Problem] = {}
        try:
            if resource is not None and owner_uid is not None and decision.apply_children:
                manifests = children.desired_children(
                    resource, decision.status.attempt, include_ray_job=decision.create_ray_job
                )
                # An owner whose status names no children yet has none: the status is written first.
                believed_absent = not seen_before and not self._verified.knows(key, owner_uid)
                for wave in CREATION_WAVES:
                    batch = [m for m in manifests if m["kind"] in wave]
                    outcomes = await asyncio.gather(
                        *(self._ensure(key, owner_uid, m, read, errors, believed_absent) for m in batch),
                        return_exceptions=True,
                    )
                    for outcome in outcomes:
                        if isinstance(outcome, BaseException):
                            raise outcome
                    if "created" in outcomes and "RayJob" in wave:
                        failpoints.hit("ray-job-created")
            if owner_uid is not None:
                await apply.prune_ray_jobs(
                    self._kube, key.namespace, read.ray_jobs, keep=decision.ray_job, owner_uid=owner_uid
                )
        finally:
            if errors != self._create_errors.get(key, {}):
                self._create_errors[key] = errors
                if errors:
                    log.warning("%s: %s", key, "; ".join(p.message for p in errors.values()))

    async def _ensure(
        self,
        key: OwnerKey,
        owner_uid: str,
        manifest: Mapping[str, Any],
        read: _Read,
        errors: dict[str, observe.Problem],
        believed_absent: bool,
    ) -> str:
        """One child: handed what the reconcile read, or skipped when verified with this very manifest."""
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        existing: Mapping[str, Any] | apply.Unknown | None
        if kind == "RayJob":
            existing = next((r for r in read.ray_jobs if r["metadata"]["name"] == name), None)
        elif kind == "PersistentVolumeClaim":
            existing = read.claim
        elif self._verified.is_current(key, owner_uid, manifest):
            return "unchanged"
        else:
            existing = None if believed_absent else apply.UNKNOWN
        try:
            outcome = await apply.ensure(self._kube, manifest, existing=existing)
        except kube.ApiError as error:
            if error.status in (403, 404, 422):  # quota, admission, no KubeRay: a user can act
                errors[kind] = _create_problem(manifest, error)
            raise
        self._verified.record(key, owner_uid, manifest)
        return outcome


def _create_problem(manifest: Mapping[str, Any], error: kube.ApiError) -> observe.Problem:
    name = f"{manifest['kind']} {manifest['metadata']['name']}"
    if error.status == 404 and manifest["kind"] == "RayJob":
        return observe.Problem(
            "KubeRayNotInstalled",
            f"Cannot create {name}: the ray.io/v1 RayJob API is not served. Install the KubeRay operator "
            "(v1.1 or newer) in this cluster.",
        )
    reason = "QuotaExceeded" if "exceeded quota" in error.message else "CreateFailed"
    return observe.Problem(reason, f"Cannot create {name}: {error.message}")
