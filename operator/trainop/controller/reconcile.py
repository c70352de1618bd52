"""One reconcile of one owner: read, decide (pure), write -- in that order, and writes in a fixed order.

1. Read the owner fresh from the API (never a possibly stale watch body), its RayJobs (one label-selected
   LIST), its checkpoint claim and, while an attempt is starting, that attempt's Ray pods.
2. Decide: ``acceptance.evaluate`` (which spec to run) and ``status.next_status`` (the state machine).
3. Write:
   a. the accepted spec into the owner's ``trainop.dev/applied-spec`` annotation, when it changed;
   b. the operator-owned status fields, as a JSON merge patch computed against what was read, so the
      trainer's fields (progress, checkpoint, network) are never part of the patch;
   c. Events for phase transitions and new problems (posted before b: see ``events``);
   d. the children (claim, ConfigMap, RBAC), then the attempt's RayJob; RayJobs of other attempts are
      deleted; or, after ttlSecondsAfterFinished, the owner itself.

Writing the status before acting on it makes every crash window safe: a restarted operator reads the
recorded intent (a failure, a new attempt number) and repeats the same idempotent actions.

Returns when to reconcile again (``requeue_after``), for restart backoffs, deadlines and TTLs. This module
must not be called for one owner by two tasks at once (the work queue guarantees it), and must not keep
state across reconciles except the last child-creation errors, which only feed conditions.
"""

from __future__ import annotations

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


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Reconciler:
    def __init__(self, client: kube.Kube, *, clock: Clock = utcnow) -> None:
        self._kube = client
        self._clock = clock
        # Child creation errors of the previous reconcile, by owner: they explain a stuck phase.
        self._create_errors: dict[OwnerKey, dict[str, observe.Problem]] = {}

    def forget(self, key: OwnerKey) -> None:
        self._create_errors.pop(key, None)

    async def reconcile(self, key: OwnerKey) -> Outcome:
        kind = kinds.BY_KIND[key.kind]
        resource_api = kube.Resource(kind.api_version, kind.plural)
        body = await self._kube.get(resource_api, key.namespace, key.name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self.forget(key)
            return Outcome()  # the garbage collector removes the children
        verdict = acceptance.evaluate(body)
        observed, ray_jobs = await self._observe(key, kind, body, verdict)
        current = status_fields.OwnedStatus.from_status(body.get("status"))
        decision = status.next_status(verdict, current, observed)

        if verdict.applied_spec is not None:
            await self._kube.patch(
                resource_api,
                key.namespace,
                key.name,
                {"metadata": {"annotations": {kinds.ANNOTATION_APPLIED_SPEC: verdict.applied_spec}}},
            )
        # Events first: their names are deterministic, so a repeat after a crash is a no-op (409).
        await events.post(self._kube, body, decision.events, now=observe.format_time(observed.now))
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
        await self._write_children(key, verdict, decision, ray_jobs)
        return Outcome(requeue_after=decision.requeue_after, decision=decision)

    async def _observe(
        self, key: OwnerKey, kind: kinds.Kind, body: Mapping[str, Any], verdict: acceptance.Acceptance
    ) -> tuple[status.Observed, list[dict[str, Any]]]:
        owner_uid = body["metadata"]["uid"]
        selector = f"{kind.owner_label}={key.name}"
        ray_jobs = [
            r
            for r in await self._kube.list(kube.RAY_JOBS, key.namespace, label_selector=selector)
            if apply.owned_by(r, owner_uid)
        ]
        observations = {r["metadata"]["name"]: observe.ray_job(r) for r in ray_jobs}
        claim = None
        if verdict.resource is not None:
            claim_name = kinds.claim_name(verdict.resource)
            claim = observe.claim(claim_name, await self._kube.get(kube.CLAIMS, key.namespace, claim_name))
        raw_status = body.get("status") or {}
        pod_problems: tuple[observe.Problem, ...] = ()
        if raw_status.get("phase") in (Phase.PENDING.value, Phase.PROVISIONING.value) and raw_status.get(
            "attempt"
        ):
            pods = await self._kube.list(
                kube.PODS,
                key.namespace,
                label_selector=f"{selector},{kinds.LABEL_ATTEMPT}={raw_status['attempt']}",
            )
            pod_problems = observe.pod_problems(pods)
            observations = await self._with_cluster_problems(key.namespace, observations)
        observed = status.Observed(
            now=self._clock(),
            generation=body["metadata"].get("generation"),
            ray_jobs=observations,
            claim=claim,
            pod_problems=pod_problems,
            create_errors=dict(self._create_errors.get(key, {})),
        )
        return observed, ray_jobs

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
        ray_jobs: list[dict[str, Any]],
    ) -> None:
        resource = verdict.resource
        owner_uid = resource.metadata.uid if resource is not None else None
        errors: dict[str, observe.Problem] = {}
        try:
            if resource is not None and decision.apply_children:
                manifests = children.desired_children(
                    resource, decision.status.attempt, include_ray_job=decision.create_ray_job
                )
                for manifest in manifests:
                    try:
                        outcome = await apply.ensure(self._kube, manifest)
                    except kube.ApiError as error:
                        if error.status in (403, 404, 422):  # quota, admission, no KubeRay: a user can act
                            errors[manifest["kind"]] = _create_problem(manifest, error)
                        raise
                    if outcome == "created" and manifest["kind"] == "RayJob":
                        failpoints.hit("ray-job-created")
            if owner_uid is not None:
                await apply.prune_ray_jobs(
                    self._kube, key.namespace, ray_jobs, keep=decision.ray_job, owner_uid=owner_uid
                )
        finally:
            if errors != self._create_errors.get(key, {}):
                self._create_errors[key] = errors
                if errors:
                    log.warning("%s: %s", key, "; ".join(p.message for p in errors.values()))


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
