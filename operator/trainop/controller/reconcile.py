"""One reconcile of one owner: read, decide (pure), write -- in that order, and writes in a fixed order.

1. Read the owner fresh from the API (its status is the record of intent this reconcile extends), and its
   children from the watch-fed ``cache`` (no request): its RayJobs, its checkpoint claim (none with
   ``checkpoint.storage.s3``: then the trainer driver's ``status.storage`` says whether the bucket can be
   written) and, while an attempt is starting, that attempt's Ray pods and RayCluster (while it runs, the
   RayCluster only for a lost head pod).
2. Decide: ``acceptance.evaluate`` (which spec to run) and ``state_machine.next_status``.
3. Write, in three sequential steps, each a set of concurrent requests:
   a. the owner's own writes -- the accepted spec into its ``trainop.dev/applied-spec`` annotation when
      it changed, and Events for phase transitions and new problems (both before the status: see
      ``events``), then the operator-owned status fields, as a patch computed against what was read, so
      the trainer's fields (progress, checkpoint, network) are never part of it -- (two round trips).
      The annotation and the status carry the uid of the owner read (``incarnation``): if it was deleted
      meanwhile, and maybe created again under its name, the apiserver refuses them, nothing after them
      is written, and the object now under the name is reconciled from scratch. Concurrently with them,
      the children that depend on none of that record: the ServiceAccount, the Role and the claim. The
      status waits for the claim: it reports on it (StorageReady, ``children``) and names the RayJob
      that mounts it, so it is not written while the claim it calls Pending does not exist, nor when the
      claim's creation was refused and the status does not say so yet (the error is kept; the retried
      reconcile's status tells it);
   b. the children that do: the ConfigMap, the RoleBinding (``CREATION_WAVES``);
   c. the attempt's RayJob; RayJobs of other attempts are deleted; or, after ttlSecondsAfterFinished,
      the owner itself instead of b and c.
   A child is written only when the cache says it must be: a create-only child that is not there; the
   ConfigMap when it was not written for this attempt (a running attempt's config never changes under
   it: mutable spec changes reach the next one; it is not watched, so an owner's first reconcile in a
   process reads it: the one child read); ServiceAccount, Role and RoleBinding unless this process
   applied the same manifest and saw no other change of them since (``own_writes``).

Writing the status before acting on it makes every crash window safe: a restarted operator reads the
recorded intent (a failure, a new attempt number) and repeats the same idempotent actions. What is written
beside the status in step a is the same whatever the status says (a crash there leaves a ServiceAccount,
Role or claim that the next reconcile finds in place: the claim is built from the owner's identity and
``spec.checkpoint.storage``, which is immutable); what depends on the attempt waits for the record.

Returns when to reconcile again (``requeue_after``), for restart backoffs, deadlines and TTLs. This module
must not be called for one owner by two tasks at once (the work queue guarantees it), and keeps no state
across reconciles but the last child-creation errors, which only feed conditions, the failure facts of the
current attempt's pods, and ``own_writes``, which only saves requests. All of it belongs to one incarnation
of the owner (its uid): a job deleted and created again under its name starts with none of the deleted
one's, even where its deletion was not seen before it was reconciled again (a reconcile in flight, a watch
that was away).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import pydantic

from trainop.api import manifest, trainingjob
from trainop.api.operator_status import Phase
from trainop.controller import (
    acceptance,
    apply,
    cache,
    children,
    events,
    failpoints,
    failures,
    incarnation,
    kinds,
    kube,
    metrics,
    observe,
    own_writes,
    rayjob,
    state_machine,
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
class Result:
    requeue_after: float | None = None
    transition: state_machine.Transition | None = None


# Children are written in waves; the children of one wave do not depend on each other and are written
# concurrently. The first wave depends on nothing the reconcile records -- a ServiceAccount and a Role are
# a function of the owner's kind, name and uid alone, the claim of those and spec.checkpoint.storage
# (immutable), none of the attempt its status records -- so it is written concurrently with the owner's
# own writes (the accepted spec, the Events, the status). The rest follow the status: the ConfigMap (the
# attempt's config) and the RoleBinding (RBAC's escalation check reads its Role: 404 without it); then the
# RayJob, whose pods need all the others, only once they are in place.
CREATION_WAVES: tuple[frozenset[str], ...] = (
    frozenset({"ServiceAccount", "Role", "PersistentVolumeClaim"}),
    frozenset({"ConfigMap", "RoleBinding"}),
    frozenset({"RayJob"}),
)
# Of the first wave, what the status waits for: it says the claim is there (StorageReady ClaimPending,
# children.persistentVolumeClaim) and names the RayJob that mounts it. Written after it, the status named
# a claim that did not exist yet -- or never, when its creation was refused (quota).
BEFORE_STATUS = frozenset({"PersistentVolumeClaim"})


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclasses.dataclass(frozen=True)
class _Read:
    """What a reconcile took from the cache besides the observations: the records its writes act on."""

    owner_uid: str
    stored_attempt: int
    observed: state_machine.Observed
    ray_jobs: list[cache.RayJobRecord]
    claim: cache.ClaimRecord | None


@dataclasses.dataclass
class _Kept:
    """What a reconcile leaves to the next one of the same owner incarnation (``uid``): a namesake created
    after a deletion starts with none of it."""

    uid: str
    #: Child creation errors of the previous reconcile: they explain a stuck phase.
    create_errors: dict[str, observe.Problem] = dataclasses.field(default_factory=dict)
    #: What the current attempt's Ray pods showed: (attempt, facts). Pods of a failed attempt may be gone
    #: (and out of the cache) when its RayJob reports FAILED; these outlive them.
    pod_facts: tuple[int, tuple[failures.PodFact, ...]] | None = None


class Reconciler:
    def __init__(self, client: kube.Kube, children_cache: cache.Cache, *, clock: Clock = utcnow) -> None:
        self._kube = client
        self._cache = children_cache
        self._clock = clock
        self._kept: dict[OwnerKey, _Kept] = {}
        self.own_writes = own_writes.OwnWrites()

    def forget(self, key: OwnerKey) -> None:
        self._kept.pop(key, None)
        self.own_writes.forget(key)

    def _kept_for(self, key: OwnerKey, uid: str) -> _Kept:
        """What earlier reconciles of this incarnation left; a reconcile still in flight when its owner
        was forgotten leaves its own to a record no longer held."""
        kept = self._kept.get(key)
        if kept is None or kept.uid != uid:
            kept = self._kept[key] = _Kept(uid)
        return kept

    async def reconcile(self, key: OwnerKey) -> Result:
        kind = kinds.BY_KIND[key.kind]
        resource_api = kube.Resource(kind.api_version, kind.plural)
        body = await self._kube.get(resource_api, key.namespace, key.name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self.forget(key)
            return Result()  # the garbage collector removes the children
        verdict = acceptance.evaluate(body)
        kept = self._kept_for(key, body["metadata"]["uid"])
        read = self._observe(key, kind, body, verdict, kept)
        current = kind.operator_status.from_stored(body.get("status"))
        transition = state_machine.next_status(verdict, current, read.observed)

        writes: list[tuple[dict[str, Any], Write]] = []
        if not transition.delete_owner:
            if transition.status.phase is not None and transition.status.phase.finished:
                self.own_writes.forget(key)  # a finished owner's children are not written again
            if verdict.resource is not None and transition.apply_children:
                writes = await self._needed_writes(key, verdict.resource, transition, read)
        waves = [[(m, how) for m, how in writes if m["kind"] in wave] for wave in CREATION_WAVES]
        errors: dict[str, observe.Problem] = {}
        owner_uid = read.owner_uid
        try:
            # The record of intent and the children that depend on none of it, concurrently; the status
            # waits for the claim.
            claim = asyncio.ensure_future(
                self._write_wave(
                    key, owner_uid, [w for w in waves[0] if w[0]["kind"] in BEFORE_STATUS], errors
                )
            )
            recorded, first_wave, _ = await asyncio.gather(
                self._record(key, kind, resource_api, body, verdict, transition, read, claim),
                self._write_wave(
                    key, owner_uid, [w for w in waves[0] if w[0]["kind"] not in BEFORE_STATUS], errors
                ),
                claim,
                return_exceptions=True,
            )
            if isinstance(recorded, incarnation.Replaced):
                # Decided from an owner that is gone: the object under its name now (if any) is another,
                # to be reconciled from scratch. Nothing that depends on the record was written.
                log.info("%s: not recorded, the owner it was decided from is gone: %s", key, recorded)
                self.forget(key)
                return Result(requeue_after=0.0)
            if isinstance(recorded, BaseException):
                raise recorded  # nothing that depends on the record was written
            if transition.delete_owner:
                log.info("%s: ttlSecondsAfterFinished passed; deleting it", key)
                await self._kube.delete(resource_api, key.namespace, key.name, uid=body["metadata"]["uid"])
                return Result(transition=transition)
            if isinstance(first_wave, BaseException):
                raise first_wave
            for wave in waves[1:]:
                await self._write_wave(key, owner_uid, wave, errors)
            if verdict.resource is not None:
                await apply.prune_ray_jobs(
                    self._kube, key.namespace, read.ray_jobs, keep=transition.ray_job, owner_uid=owner_uid
                )
        except kube.ApiError as error:
            if not kube.namespace_terminating(error):
                raise
            # Its namespace is being deleted, the owner with it: nothing to create, nothing to retry.
            log.info("%s: its namespace is being deleted; no children written", key)
            return Result(transition=transition)
        finally:
            changed = errors != kept.create_errors
            if changed:
                kept.create_errors = errors
                if errors:
                    log.warning("%s: %s", key, "; ".join(p.message for p in errors.values()))
        if changed:
            # The status this reconcile wrote was decided from the previous creation errors (before any
            # write): e.g. still QuotaExceeded although the claim now exists. Our own creations' watch
            # events do not wake the owner, so look again at once.
            return Result(requeue_after=0.0, transition=transition)
        return Result(requeue_after=transition.requeue_after, transition=transition)

    async def _record(
        self,
        key: OwnerKey,
        kind: kinds.Kind,
        resource_api: kube.Resource,
        body: Mapping[str, Any],
        verdict: acceptance.Acceptance,
        transition: state_machine.Transition,
        read: _Read,
        claim: Awaitable[None],
    ) -> None:
        """The owner's own writes: the accepted spec and the Events, then -- once ``claim`` (its write, if
        any) is done -- the status that records them. An owner that is no longer the one ``body`` is
        (deleted, or created again under its name) refuses both: :class:`incarnation.Replaced`."""
        annotation = (
            incarnation.annotate(
                self._kube,
                resource_api,
                key.namespace,
                key.name,
                {kinds.ANNOTATION_APPLIED_SPEC: verdict.applied_spec},
                uid=read.owner_uid,
            )
            if verdict.applied_spec is not None
            else None
        )
        # Events before the status: their names are deterministic, so a repeat after a crash is a no-op
        # (409); after it, a crash in between would lose them.
        now = observe.format_time(read.observed.now)
        await asyncio.gather(
            *([annotation] if annotation is not None else []),
            events.post(self._kube, body, transition.events, now=now),
        )
        refused: Exception | None = None
        try:
            await claim
        except Exception as error:
            refused = error
        if refused is not None and not _status_tells(refused, read.observed):
            raise refused  # this status says the claim is there: it is written once it is
        patch = transition.status.merge_patch_from(body.get("status"))
        if patch:
            await incarnation.patch_status(
                self._kube,
                resource_api,
                key.namespace,
                key.name,
                patch,
                stored=body.get("status"),
                uid=read.owner_uid,
            )
            failpoints.hit("status-written", str(transition.status.phase))
            # Counted once the status that records them is written: a failure writing children after this
            # retries the reconcile, which then starts from the new status and would not see them again.
            if transition.restarted:
                metrics.record_restart(kind)
            if transition.failed is not None:
                metrics.record_failure(kind, transition.failed)
            if transition.time_to_running is not None:
                metrics.record_time_to_running(kind, transition.time_to_running)
        if refused is not None:
            raise refused

    def _observe(
        self,
        key: OwnerKey,
        kind: kinds.Kind,
        body: Mapping[str, Any],
        verdict: acceptance.Acceptance,
        kept: _Kept,
    ) -> _Read:
        owner_uid = body["metadata"]["uid"]
        raw_status = body.get("status") or {}
        attempt = int(raw_status.get("attempt") or 0)
        starting = raw_status.get("phase") in (Phase.PENDING.value, Phase.PROVISIONING.value) and attempt > 0
        claim_name = kinds.claim_name(verdict.resource) if verdict.resource is not None else None

        owner_at = (key.namespace, kind, key.name)
        ray_jobs = self._cache.ray_jobs(*owner_at)
        observations = {r.seen.name: r.observation for r in ray_jobs if owner_uid in r.seen.owner_uids}
        observations = {
            name: self._with_cluster_problems(key.namespace, ray) for name, ray in observations.items()
        }
        claim = self._cache.claim(key.namespace, claim_name) if claim_name else None
        leftovers = [f"{child_kind} {name}" for child_kind, name in self.own_writes.being_deleted(key)]
        observed = state_machine.Observed(
            now=self._clock(),
            generation=body["metadata"].get("generation"),
            ray_jobs=observations,
            claim=(observe.claim(claim_name, None) if claim is None else claim.for_owner(owner_uid))
            if claim_name
            else None,
            pod_problems=self._cache.pod_problems(*owner_at, attempt, owner_uid=owner_uid)
            if starting
            else (),
            create_errors=dict(kept.create_errors),
            foreign_ray_jobs=frozenset(r.seen.name for r in ray_jobs if owner_uid not in r.seen.owner_uids),
            leftovers=tuple(leftovers),
            attempt_pods={
                earlier: lives
                for earlier in (attempt - 1, attempt)
                if earlier > 0 and (lives := self._cache.pod_lives(*owner_at, earlier, owner_uid=owner_uid))
            },
            namesake_pods=self._cache.namesake_pod_lives(*owner_at, owner_uid),
            storage_check=_storage_check(raw_status),
            worker_failures=_trainer_record(raw_status, "workerFailures", trainingjob.WorkerFailures),
            progress=_trainer_record(raw_status, "progress", trainingjob.Progress),
            pod_facts=self._remember_pod_facts(key, kind, kept, attempt),
            raw_ttl_seconds_after_finished=_raw_spec(body).get("ttlSecondsAfterFinished"),
        )
        return _Read(owner_uid, attempt, observed, ray_jobs, claim)

    def _remember_pod_facts(
        self, key: OwnerKey, kind: kinds.Kind, kept: _Kept, attempt: int
    ) -> tuple[failures.PodFact, ...]:
        """The failure facts of this attempt's pods seen so far by this process, the cache's added."""
        if attempt <= 0:
            return ()
        kept_attempt, earlier = kept.pod_facts or (attempt, ())
        if kept_attempt != attempt:
            earlier = ()
        seen = self._cache.pod_facts(key.namespace, kind, key.name, attempt, owner_uid=kept.uid)
        facts = failures.remember(earlier, seen)
        kept.pod_facts = (attempt, facts)
        return facts

    def _with_cluster_problems(
        self, namespace: str, ray: observe.RayJobObservation
    ) -> observe.RayJobObservation:
        """What only the RayCluster says: while starting, pod creation failures (quota); while running, a
        lost head pod (``observe.cluster_problems``), which KubeRay never writes onto the RayJob."""
        following = (observe.AttemptState.STARTING, observe.AttemptState.RUNNING)
        if ray.state not in following or not ray.cluster_name:
            return ray
        cluster = self._cache.ray_cluster_problems(namespace, ray.cluster_name) or ()
        if ray.state == observe.AttemptState.STARTING:
            return dataclasses.replace(ray, problems=cluster) if cluster and not ray.problems else ray
        lost = tuple(p for p in cluster if p.reason == observe.HEAD_POD_LOST)
        if lost and all(p.reason != observe.HEAD_POD_LOST for p in ray.problems):
            return dataclasses.replace(ray, problems=(*ray.problems, *lost))
        return ray

    async def _write_wave(
        self,
        key: OwnerKey,
        owner_uid: str,
        batch: list[tuple[dict[str, Any], Write]],
        errors: dict[str, observe.Problem],
    ) -> None:
        """The children of one wave, concurrently; the first error is raised once all have answered."""
        outcomes = await asyncio.gather(
            *(self._write(key, owner_uid, m, how, errors) for m, how in batch), return_exceptions=True
        )
        done = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
            done.append(outcome)
        if any(w.kind == "RayJob" and w.written == apply.Written.CREATED for w in done):
            failpoints.hit("ray-job-created")

    async def _config_written(
        self, key: OwnerKey, resource: manifest.Resource, attempt: int, stored_attempt: int, owner_uid: str
    ) -> bool:
        """Whether the trainer's ConfigMap was written for this attempt: it is written once per attempt, so a
        running attempt's config never changes under it (spec changes reach the next attempt).

        ConfigMaps are not watched (``handlers``): what this process applied is remembered; the first
        reconcile of an owner in a process reads it instead -- the one read of a child a reconcile makes.
        """
        name = kinds.kind_of(resource).config_map_name(key.name)
        marker = f"attempt {attempt}"
        written = self.own_writes.get(key, "ConfigMap", name, owner_uid=owner_uid)
        if written is not None:
            return written.fingerprint == marker
        if attempt != stored_attempt:  # an attempt this reconcile starts: its config is not written yet
            return False
        stored = await self._kube.get(kube.CONFIG_MAPS, key.namespace, name)
        meta = (stored or {}).get("metadata") or {}
        if (
            stored is None
            or meta.get("deletionTimestamp")
            or (meta.get("annotations") or {}).get(kinds.ANNOTATION_ATTEMPT) != str(attempt)
            or owner_uid not in [r.get("uid") for r in meta.get("ownerReferences") or ()]
        ):
            return False
        self.own_writes.record(
            key,
            "ConfigMap",
            name,
            own_writes.Record(meta["uid"], meta["resourceVersion"], marker),
            owner_uid=owner_uid,
        )
        return True

    async def _needed_writes(
        self,
        key: OwnerKey,
        resource: manifest.Resource,
        transition: state_machine.Transition,
        read: _Read,
    ) -> list[tuple[dict[str, Any], Write]]:
        """The children this reconcile must write, and how; built only when needed (the ConfigMap holds
        the rendered trainer config, the RayJob the whole pod spec)."""
        writes: list[tuple[dict[str, Any], Write]] = []
        claim = children.desired_pvc(resource)
        if claim is not None and read.claim is None:
            writes.append((claim, Write.CREATE))
        elif claim is not None and transition.adopt_claim:
            writes.append((claim, Write.ADOPT))
        attempt = transition.status.attempt
        if not await self._config_written(key, resource, attempt, read.stored_attempt, read.owner_uid):
            writes.append((children.desired_configmap(resource, attempt), Write.APPLY))
        for child in children.desired_rbac(resource):
            name = child["metadata"]["name"]
            fingerprint = apply.fingerprint(child)
            if not self.own_writes.current(
                key, child["kind"], name, owner_uid=read.owner_uid, fingerprint=fingerprint
            ):
                writes.append((child, Write.APPLY))
        if transition.create_ray_job and transition.ray_job not in {r.seen.name for r in read.ray_jobs}:
            writes.append((rayjob.desired_rayjob(resource, attempt), Write.CREATE))
        return writes

    async def _write(
        self,
        key: OwnerKey,
        owner_uid: str,
        manifest: Mapping[str, Any],
        how: Write,
        errors: dict[str, observe.Problem],
    ) -> apply.Write:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        try:
            if how == Write.CREATE:
                write = await apply.create(self._kube, manifest)
            elif how == Write.ADOPT:
                write = await apply.adopt(self._kube, manifest)
            else:
                write = await apply.server_side_apply(self._kube, manifest)
        except kube.ApiError as error:
            if kube.namespace_terminating(error):
                raise
            if _refused(error):  # quota, admission, no KubeRay: a user can act
                errors[kind] = _create_problem(manifest, error)
            raise
        if kind == "ConfigMap":
            fingerprint = f"attempt {manifest['metadata']['annotations'][kinds.ANNOTATION_ATTEMPT]}"
        else:
            fingerprint = apply.fingerprint(manifest) if how == Write.APPLY else ""
        self.own_writes.record(
            key,
            kind,
            name,
            own_writes.Record(write.uid, write.resource_version, fingerprint),
            owner_uid=owner_uid,
        )
        return write


class Write(enum.Enum):
    """How a child is written (see ``apply``)."""

    CREATE = "create"
    APPLY = "apply"
    ADOPT = "adopt"


def _status_tells(refused: Exception, observed: state_machine.Observed) -> bool:
    """Whether a status decided from ``observed`` is still true after the claim's creation failed: it
    says a creation of the claim was refused already, or the namespace, the owner with it, is going away."""
    if not isinstance(refused, kube.ApiError):
        return False
    return "PersistentVolumeClaim" in observed.create_errors or kube.namespace_terminating(refused)


def _storage_check(raw_status: Mapping[str, Any]) -> trainingjob.StorageStatus | None:
    """The trainer driver's ``status.storage`` (the apiserver checked its schema; anything else: none)."""
    reported = raw_status.get("storage")
    if not reported:
        return None
    try:
        return trainingjob.StorageStatus.model_validate(reported)
    except pydantic.ValidationError:
        return None


def _raw_spec(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """The owner's spec as stored, unvalidated (a spec the models refuse has no other reading)."""
    spec = body.get("spec")
    return spec if isinstance(spec, Mapping) else {}


Record = TypeVar("Record", bound=pydantic.BaseModel)


def _trainer_record(raw_status: Mapping[str, Any], field: str, model: type[Record]) -> Record | None:
    """One of the trainer's status records, read as an observation (anything malformed: none)."""
    reported = raw_status.get(field)
    if not reported:
        return None
    try:
        return model.model_validate(reported)
    except pydantic.ValidationError:
        return None


def _refused(error: kube.ApiError) -> bool:
    """A refusal the status should carry: any 4xx but a conflict (409: the object exists or moved on, the
    next reconcile reads it) and throttling (429: retried). Admission says no with 403 (quota, RBAC,
    policies), 422 (invalid), 413 or 401 (a ValidatingAdmissionPolicy's reason), and 400 (a webhook that
    names no code); 404 is an API that is not served (no KubeRay)."""
    return 400 <= error.status < 500 and error.status not in (409, 429)


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
