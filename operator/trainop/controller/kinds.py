"""What differs between the kinds the operator reconciles, in one place: names, labels, lifecycle.

The reconcile loop, the state machine (``state_machine``) and the child builders (``children``,
``rayjob``) are written once and are generic over :class:`Kind`; a TuningSweep is reconciled exactly
like a TrainingJob, into the same five children, except that its RayJob runs the sweep driver and its
worker group is sized for ``maxConcurrentTrials`` trials at once. Every place where the two kinds
differ is a field of :class:`Kind` or one of the small functions below that dispatch on the model's type.

Child names are deterministic (a function of the owner's name and the attempt) so that creating a child
twice is a 409, never a duplicate. A TrainingJob and a TuningSweep may share a name in one namespace, so
their children carry different suffixes.

This module must not talk to the API or hold state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from trainop.api import base, manifest, operator_status, trainer_config, trainingjob, tuningsweep

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "trainop"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_ATTEMPT = "trainop.dev/attempt"
# On an attempt's children (its RayJob, so its Ray pods): the uid of the owner incarnation that made them,
# which the name label cannot tell from a deleted namesake's.
LABEL_OWNER_UID = "trainop.dev/owner-uid"
# The spec the operator last accepted (JSON, wire form): what the running children were built from.
# Immutable-field changes are detected against it, and the job keeps running with it when refused.
ANNOTATION_APPLIED_SPEC = "trainop.dev/applied-spec"
# On the ConfigMap: the attempt its config was rendered for (it is rewritten only for a new attempt).
ANNOTATION_ATTEMPT = "trainop.dev/attempt"
# Server-side label selector for every child the operator creates (and the Ray pods KubeRay creates).
MANAGED_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY}"


@dataclasses.dataclass(frozen=True)
class Lifecycle:
    """The spec fields that drive the state machine, the same for every kind."""

    suspend: bool
    active_deadline_seconds: int | None
    ttl_seconds_after_finished: int | None
    failure_policy: trainingjob.FailurePolicy


@dataclasses.dataclass(frozen=True)
class Kind:
    kind: str
    plural: str
    owner_label: str  # label on every child: its value is the owner's name
    component: str  # app.kubernetes.io/component of the children
    child_suffix: str  # ConfigMap, ServiceAccount, Role and RoleBinding: "<name><suffix>"
    claim_suffix: str  # the created checkpoint claim: "<name><suffix>"
    attempt_prefix: str  # RayJob of attempt N: "<name>-<prefix><N>"
    entrypoint: str  # the RayJob's entrypoint (runs on the Ray head)
    immutable_fields: tuple[tuple[str, ...], ...]
    # The operator's part of this kind's status (TrainingJobs add workers/gpus for their printer columns).
    operator_status: type[operator_status.OperatorStatus]

    @property
    def api_version(self) -> str:
        return base.API_VERSION

    @property
    def reports_workers(self) -> bool:
        """Whether its status has workers/gpus (the TrainingJob printer columns)."""
        return "workers" in self.operator_status.operator_keys()

    def config_map_name(self, owner: str) -> str:
        return f"{owner}{self.child_suffix}"

    def service_account_name(self, owner: str) -> str:
        return f"{owner}{self.child_suffix}"

    def role_name(self, owner: str) -> str:
        return f"{owner}{self.child_suffix}"

    def created_claim_name(self, owner: str) -> str:
        return f"{owner}{self.claim_suffix}"

    def ray_job_name(self, owner: str, attempt: int) -> str:
        return f"{owner}-{self.attempt_prefix}{attempt}"

    def attempt_of(self, owner: str, ray_job_name: str) -> int | None:
        """The attempt number encoded in a RayJob's name, or None when it is not one of ours."""
        prefix = f"{owner}-{self.attempt_prefix}"
        digits = ray_job_name.removeprefix(prefix)
        if digits == ray_job_name or not digits.isdigit():
            return None
        return int(digits)


TRAINING_JOB = Kind(
    kind="TrainingJob",
    plural="trainingjobs",
    owner_label="trainop.dev/job",
    component="trainer",
    child_suffix="-trainer",
    claim_suffix="-ckpt",
    attempt_prefix="a",
    entrypoint=f"python -m trainop_trainer --config {trainer_config.DEFAULT_CONFIG_PATH}",
    immutable_fields=trainingjob.IMMUTABLE_FIELDS,
    operator_status=trainingjob.TrainingJobOperatorStatus,
)

TUNING_SWEEP = Kind(
    kind="TuningSweep",
    plural="tuningsweeps",
    owner_label="trainop.dev/sweep",
    component="sweep-driver",
    child_suffix="-sweep",
    claim_suffix="-sweep-ckpt",
    attempt_prefix="s",
    entrypoint=f"python -m trainop_trainer.sweep --config {trainer_config.DEFAULT_CONFIG_PATH}",
    immutable_fields=tuningsweep.IMMUTABLE_FIELDS,
    operator_status=operator_status.OperatorStatus,
)

ALL: tuple[Kind, ...] = (TRAINING_JOB, TUNING_SWEEP)
BY_KIND: Mapping[str, Kind] = {k.kind: k for k in ALL}


def kind_of(resource: manifest.Resource) -> Kind:
    return TRAINING_JOB if isinstance(resource, trainingjob.TrainingJob) else TUNING_SWEEP


def owner_of(labels: Mapping[str, str]) -> tuple[Kind, str] | None:
    """The owner (kind, name) a child's labels point at, or None for objects that are not our children."""
    for kind in ALL:
        name = labels.get(kind.owner_label)
        if name:
            return kind, name
    return None


def training_spec(resource: manifest.Resource) -> trainingjob.TrainingJobSpec:
    """The TrainingJob spec that shapes the Ray pods: the job's own, or the sweep's trial template."""
    if isinstance(resource, trainingjob.TrainingJob):
        return resource.spec
    return resource.spec.template


def lifecycle(resource: manifest.Resource) -> Lifecycle:
    spec = resource.spec
    return Lifecycle(
        suspend=spec.suspend,
        active_deadline_seconds=spec.active_deadline_seconds,
        ttl_seconds_after_finished=spec.ttl_seconds_after_finished,
        # A sweep's driver restarts follow its trial template's failure policy.
        failure_policy=training_spec(resource).failure_policy,
    )


def worker_replicas(resource: manifest.Resource) -> int:
    """Worker pods in the RayJob: a sweep runs maxConcurrentTrials trials of template.workers.replicas."""
    if isinstance(resource, trainingjob.TrainingJob):
        return resource.spec.workers.replicas
    return resource.spec.max_concurrent_trials * resource.spec.template.workers.replicas


def trial_drivers(resource: manifest.Resource) -> int:
    """Trial drivers the Ray head hosts at once: a sweep's maxConcurrentTrials; a TrainingJob has none."""
    if isinstance(resource, trainingjob.TrainingJob):
        return 0
    return resource.spec.max_concurrent_trials


def claim_name(resource: manifest.Resource) -> str | None:
    """The checkpoint claim the Ray pods mount: the existing claim named in the spec, or the created one;
    None when checkpoints go to object storage (``checkpoint.storage.s3``): no claim at all."""
    storage = training_spec(resource).checkpoint.storage
    if storage.s3 is not None:
        return None
    return storage.existing_claim or kind_of(resource).created_claim_name(resource.metadata.name)


def checkpoint_location(resource: manifest.Resource) -> str:
    """Where the job's checkpoints live, for people: ``s3://<bucket>/<prefix>/<run>``, or the claim's name."""
    storage = training_spec(resource).checkpoint.storage
    if storage.s3 is not None:
        return f"{trainer_config.s3_uri(storage.s3)}/{trainer_config.run_name_for(resource.metadata.name)}"
    return f"claim {claim_name(resource)}"


def existing_claim_of(body: Mapping[str, Any]) -> str | None:
    """``checkpoint.storage.existingClaim`` of a stored owner, read without validating the whole object."""
    spec: Any = body.get("spec") or {}
    if body.get("kind") == TUNING_SWEEP.kind:
        spec = spec.get("template") or {}
    existing = ((spec.get("checkpoint") or {}).get("storage") or {}).get("existingClaim")
    return str(existing) if existing else None


def render_config(resource: manifest.Resource, attempt: int) -> str:
    """The JSON the trainer (or the sweep driver) reads from /etc/trainop/trainer.json: the storage path is
    the claim's mount, or the ``s3://`` URI of the checkpoint bucket."""
    if isinstance(resource, trainingjob.TrainingJob):
        return trainer_config.dumps(
            trainer_config.for_job(
                resource,
                storage_path=trainer_config.storage_path_for(resource.spec),
                attempt=attempt,
                in_cluster=True,
            )
        )
    return trainer_config.dumps(
        trainer_config.for_sweep(
            resource, storage_path=trainer_config.CHECKPOINT_MOUNT_PATH, attempt=attempt, in_cluster=True
        )
    )


def parse(body: Mapping[str, Any]) -> manifest.Resource:
    """Validate an object as the apiserver stored it (raises ``manifest.ManifestError``)."""
    return manifest.parse_object(
        dict(body), source=f"{body.get('kind')}/{body.get('metadata', {}).get('name')}"
    )
