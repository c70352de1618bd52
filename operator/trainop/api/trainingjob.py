"""The TrainingJob API (trainop.dev/v1alpha1): spec, status and the cross-field rules.

These models are the single source of truth: the CRD schema (crds/), the defaults the apiserver fills
in, the docs' field tables and the trainer's config are all derived from them. Cross-field rules are
written twice on purpose — once as a pydantic validator (for ``trainop validate`` and local mode) and
once as a CEL rule attached to the schema (so the apiserver refuses the same manifest) — and a test
checks that both reject the same corpus.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

import pydantic

from trainop.api import base, operator_status

# Defined once in operator_status (both kinds share them); named here too, where a job's users look.
Phase = operator_status.Phase
Failure = operator_status.Failure
Children = operator_status.Children
MAX_FAILURE_HISTORY = operator_status.MAX_FAILURE_HISTORY

ENTRYPOINT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
NCCL_ENV_KEY_PATTERN = r"^(NCCL|TORCH_NCCL|UCX|FI)_[A-Z0-9_]+$"
CLAIM_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
# activeDeadlineSeconds and ttlSecondsAfterFinished: at most 2^31 - 1 s (about 68 years, Kubernetes' int32
# for a Job's TTL). Unbounded, a huge value made the operator's due-time arithmetic overflow (found by
# tests/reliability/test_bad_input_property.py).
MAX_DURATION_SECONDS = 2**31 - 1
# Random seeds: what NumPy's RandomState (Ray Tune's search algorithms) accepts, less room for seed + rank.
MAX_SEED = 2**32 - 1 - 4096 * 16
# Ports Ray itself listens on in every Ray pod (KubeRay's defaults): the trainer's metrics must avoid them.
RAY_POD_PORTS = {
    6379: "Ray's GCS server",
    8080: "Ray's metrics exporter",
    8265: "the Ray dashboard",
    10001: "the Ray client server",
}
# Worker pods' terminationGracePeriodSeconds. The preStop hook waits for the checkpoint for this long less
# the operator's margin (5 s), so the floor leaves the hook at least 5 s; the default leaves a large
# model's synchronous checkpoint time to finish.
MIN_TERMINATION_GRACE_PERIOD_SECONDS = 10
DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS = 120


class BuiltinModel(enum.StrEnum):
    RESNET18 = "resnet18"
    RESNET50 = "resnet50"
    GPT_SMALL = "gpt-small"  # GPT-2 small shape, ~124M parameters
    GPT_TINY = "gpt-tiny"  # a few layers: CPU tests and the demo
    MLP = "mlp"  # a small multilayer perceptron: the CPU demo and exact-resume tests


class DatasetKind(enum.StrEnum):
    SYNTHETIC = "synthetic"
    CIFAR10 = "cifar10"
    IMAGEFOLDER = "imagefolder"
    TOKENS = "tokens"


class Precision(enum.StrEnum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"


class OptimizerName(enum.StrEnum):
    SGD = "sgd"
    ADAMW = "adamw"
    ADAM = "adam"


class ScheduleKind(enum.StrEnum):
    COSINE = "cosine"
    LINEAR = "linear"
    CONSTANT = "constant"


class NetworkProfile(enum.StrEnum):
    AUTO = "auto"
    NVLINK = "nvlink"
    INFINIBAND = "infiniband"
    ROCE = "roce"
    EFA = "efa"
    TCP = "tcp"


class AccessMode(enum.StrEnum):
    READ_WRITE_ONCE = "ReadWriteOnce"
    READ_WRITE_MANY = "ReadWriteMany"
    READ_WRITE_ONCE_POD = "ReadWriteOncePod"


class Dataset(base.ApiModel):
    """Where the training data comes from. Nothing is downloaded: real datasets are read from a path."""

    kind: DatasetKind = DatasetKind.SYNTHETIC
    path: str | None = pydantic.Field(
        default=None, description="Directory or file inside the worker (cifar10, imagefolder, tokens)."
    )
    num_samples: Annotated[int, pydantic.Field(ge=1)] = pydantic.Field(
        default=50_000, description="Samples per epoch of the synthetic dataset."
    )
    image_size: Annotated[int, pydantic.Field(ge=8, le=1024)] = 224
    num_classes: Annotated[int, pydantic.Field(ge=2)] = 1000
    sequence_length: Annotated[int, pydantic.Field(ge=8, le=32768)] = 1024
    num_workers: Annotated[int, pydantic.Field(ge=0, le=64)] = pydantic.Field(
        default=2, description="DataLoader worker processes per training worker."
    )

    @pydantic.model_validator(mode="after")
    def _path_needed(self) -> Dataset:
        if self.kind != DatasetKind.SYNTHETIC and not self.path:
            raise ValueError(f"path is required when kind is {self.kind.value}: set the directory or file")
        return self


class Workload(base.ApiModel):
    """What to train: a built-in model + dataset, or a user function ``pkg.module:function``."""

    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.model) != has(self.entrypoint)",
                    "message": "set exactly one of workload.model (a built-in model) or workload.entrypoint "
                    "(your own pkg.module:function)",
                }
            ]
        }
    )

    model: BuiltinModel | None = None
    entrypoint: Annotated[str, pydantic.Field(pattern=ENTRYPOINT_PATTERN, max_length=256)] | None = (
        pydantic.Field(default=None, description="A user training function, 'pkg.module:function'.")
    )
    dataset: Dataset = pydantic.Field(default_factory=Dataset)
    config: dict[str, Any] = pydantic.Field(
        default_factory=dict, description="Free-form settings handed to the model or the user function."
    )

    @pydantic.model_validator(mode="after")
    def _exactly_one(self) -> Workload:
        if (self.model is None) == (self.entrypoint is None):
            raise ValueError(
                "set exactly one of workload.model (a built-in model) or workload.entrypoint "
                "(your own pkg.module:function)"
            )
        return self


class Schedule(base.ApiModel):
    kind: ScheduleKind = ScheduleKind.COSINE
    warmup_steps: Annotated[int, pydantic.Field(ge=0)] = 0
    min_lr_ratio: Annotated[float, pydantic.Field(ge=0.0, le=1.0)] = 0.0


class Hyperparameters(base.ApiModel):
    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.epochs) || has(self.maxSteps)",
                    "message": "set hyperparameters.epochs or hyperparameters.maxSteps so the job can end",
                }
            ]
        }
    )

    epochs: Annotated[int, pydantic.Field(ge=1)] | None = None
    max_steps: Annotated[int, pydantic.Field(ge=1)] | None = pydantic.Field(
        default=None, description="Optimizer steps in total; ends training before epochs if both are set."
    )
    batch_size_per_worker: Annotated[int, pydantic.Field(ge=1, le=65536)] = 32
    learning_rate: Annotated[float, pydantic.Field(gt=0.0, le=10.0)] = 0.1
    optimizer: OptimizerName = OptimizerName.SGD
    momentum: Annotated[float, pydantic.Field(ge=0.0, lt=1.0)] = 0.9
    weight_decay: Annotated[float, pydantic.Field(ge=0.0, le=1.0)] = 0.0
    schedule: Schedule = pydantic.Field(default_factory=Schedule)
    gradient_accumulation_steps: Annotated[int, pydantic.Field(ge=1, le=1024)] = 1
    gradient_clip_norm: Annotated[float, pydantic.Field(gt=0.0)] | None = None
    # NumPy's and Ray Tune's generators take seeds below 2^32 (the trainer seeds seed + rank).
    seed: Annotated[int, pydantic.Field(ge=0, le=MAX_SEED)] = 0

    @pydantic.model_validator(mode="after")
    def _has_end(self) -> Hyperparameters:
        if self.epochs is None and self.max_steps is None:
            raise ValueError("set hyperparameters.epochs or hyperparameters.maxSteps so the job can end")
        return self


class Toleration(base.ApiModel):
    """A pod toleration, refused here when Kubernetes would refuse it in the worker pods (KubeRay could
    then not create them, and the job would sit in Provisioning)."""

    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.key) && self.key != '') "
                    "|| (has(self.operator) && self.operator == 'Exists')",
                    "message": "a toleration without a key must set operator: Exists (it then tolerates "
                    "every taint); give it a key or set operator to Exists",
                },
                {
                    "rule": "!(has(self.operator) && self.operator == 'Exists') || !has(self.value) "
                    "|| self.value == ''",
                    "message": "a toleration with operator Exists must not set a value; remove value or "
                    "use operator: Equal",
                },
                {
                    "rule": "!has(self.tolerationSeconds) "
                    "|| (has(self.effect) && self.effect == 'NoExecute')",
                    "message": "tolerationSeconds needs effect: NoExecute; set effect to NoExecute or "
                    "remove tolerationSeconds",
                },
            ]
        }
    )

    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None

    @pydantic.model_validator(mode="after")
    def _valid_for_a_pod(self) -> Toleration:
        if not self.key and self.operator != "Exists":
            raise ValueError(
                "a toleration without a key must set operator: Exists (it then tolerates every taint); "
                "give it a key or set operator to Exists"
            )
        if self.operator == "Exists" and self.value:
            raise ValueError(
                "a toleration with operator Exists must not set a value; remove value or use operator: Equal"
            )
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError(
                "tolerationSeconds needs effect: NoExecute; set effect to NoExecute or remove "
                "tolerationSeconds"
            )
        return self


class Workers(base.ApiModel):
    """The GPU worker group: one Ray Train worker (one DDP rank per GPU) per pod."""

    replicas: Annotated[int, pydantic.Field(ge=1, le=4096)] = 1
    gpus_per_worker: Annotated[int, pydantic.Field(ge=0, le=16)] = pydantic.Field(
        default=1, description="GPUs per worker pod; 0 trains on CPU with gloo."
    )
    cpus_per_worker: Annotated[float, pydantic.Field(gt=0.0, le=1024)] = 4
    memory_per_worker: base.Quantity = "16Gi"
    shared_memory: base.Quantity = pydantic.Field(
        default="8Gi", description="Size of the memory-backed /dev/shm (NCCL and DataLoader workers use it)."
    )
    node_selector: dict[str, str] = pydantic.Field(default_factory=dict)
    tolerations: list[Toleration] = pydantic.Field(default_factory=list)
    priority_class_name: str | None = None
    termination_grace_period_seconds: Annotated[
        int, pydantic.Field(ge=MIN_TERMINATION_GRACE_PERIOD_SECONDS, le=3600)
    ] = pydantic.Field(
        default=DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS,
        description=(
            "terminationGracePeriodSeconds of the worker pods. When a worker pod is deleted or evicted "
            "(preemption, node drain), its preStop hook asks the training processes to checkpoint and "
            "waits for them up to this many seconds less 5; raise it when a checkpoint takes longer."
        ),
    )


class Storage(base.ApiModel):
    """The checkpoint volume: a claim trainop creates, or one that already exists."""

    size: base.Quantity = "50Gi"
    storage_class_name: str | None = None
    access_mode: AccessMode = AccessMode.READ_WRITE_ONCE
    existing_claim: Annotated[str, pydantic.Field(pattern=CLAIM_NAME_PATTERN)] | None = None
    delete_with_job: bool = pydantic.Field(
        default=False,
        description="Delete the created claim with the job (checkpoints outlive jobs by default).",
    )


class Checkpoint(base.ApiModel):
    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.intervalSteps) || has(self.intervalMinutes)",
                    "message": "set checkpoint.intervalSteps or checkpoint.intervalMinutes",
                }
            ]
        }
    )

    interval_steps: Annotated[int, pydantic.Field(ge=1)] | None = None
    interval_minutes: Annotated[float, pydantic.Field(gt=0.0, le=1440)] | None = 10.0
    keep_last: Annotated[int, pydantic.Field(ge=1, le=100)] = 3
    storage: Storage = pydantic.Field(default_factory=Storage)

    @pydantic.model_validator(mode="after")
    def _has_interval(self) -> Checkpoint:
        if self.interval_steps is None and self.interval_minutes is None:
            raise ValueError("set checkpoint.intervalSteps or checkpoint.intervalMinutes")
        return self


class FailurePolicy(base.ApiModel):
    max_restarts: Annotated[int, pydantic.Field(ge=0, le=100)] = pydantic.Field(
        default=3, description="New attempts of the whole job (a new RayJob) before the job is Failed."
    )
    backoff_seconds: Annotated[int, pydantic.Field(ge=0, le=3600)] = pydantic.Field(
        default=10, description="Wait before the first restart; doubles each restart up to maxBackoffSeconds."
    )
    max_backoff_seconds: Annotated[int, pydantic.Field(ge=0, le=86400)] = 600
    max_worker_failures: Annotated[int, pydantic.Field(ge=0, le=100)] = pydantic.Field(
        default=2,
        description="Worker-group restarts inside one attempt (Ray Train FailureConfig.max_failures).",
    )


class Network(base.ApiModel):
    profile: NetworkProfile = NetworkProfile.AUTO
    nccl_env: dict[Annotated[str, pydantic.Field(pattern=NCCL_ENV_KEY_PATTERN)], str] = pydantic.Field(
        default_factory=dict,
        max_length=64,
        description="Explicit NCCL_* (or UCX_/FI_) variables; they win over the profile.",
    )
    probe: bool = pydantic.Field(default=True, description="Measure all-reduce bus bandwidth at start-up.")
    probe_megabytes: Annotated[int, pydantic.Field(ge=1, le=4096)] = 256


class Reporting(base.ApiModel):
    """How often the trainer reports; never every step (ray.train.report is a barrier across ranks)."""

    every_steps: Annotated[int, pydantic.Field(ge=1)] = 50
    every_seconds: Annotated[float, pydantic.Field(gt=0.0)] = 15.0
    metrics_port: Annotated[int, pydantic.Field(ge=1024, le=65535)] = 9090


class TrainingJobSpec(base.ApiModel):
    image: str = pydantic.Field(default="ghcr.io/trainop/trainer:0.1.0", min_length=1)
    ray_version: Annotated[str, pydantic.Field(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")] = "2.60.0"
    workload: Workload
    hyperparameters: Hyperparameters
    precision: Precision = Precision.BF16
    compile: bool = pydantic.Field(default=False, description="Wrap the model in torch.compile.")
    workers: Workers = pydantic.Field(default_factory=Workers)
    checkpoint: Checkpoint = pydantic.Field(default_factory=Checkpoint)
    failure_policy: FailurePolicy = pydantic.Field(default_factory=FailurePolicy)
    network: Network = pydantic.Field(default_factory=Network)
    reporting: Reporting = pydantic.Field(default_factory=Reporting)
    suspend: bool = False
    active_deadline_seconds: Annotated[int, pydantic.Field(ge=1, le=MAX_DURATION_SECONDS)] | None = None
    ttl_seconds_after_finished: Annotated[int, pydantic.Field(ge=0, le=MAX_DURATION_SECONDS)] | None = None

    @pydantic.model_validator(mode="after")
    def _precision_fits_device(self) -> TrainingJobSpec:
        if self.workers.gpus_per_worker == 0 and self.precision == Precision.FP16:
            raise ValueError("precision fp16 needs GPUs: set workers.gpusPerWorker >= 1 or use bf16/fp32")
        return self

    @pydantic.model_validator(mode="after")
    def _metrics_ports_are_free(self) -> TrainingJobSpec:
        # One metrics port per Train worker of a pod (one per GPU): metricsPort + local rank.
        first = self.reporting.metrics_port
        last = first + max(1, self.workers.gpus_per_worker) - 1
        if last > 65535:
            raise ValueError(
                f"reporting.metricsPort {first} leaves no room for one port per GPU (up to {last}); "
                "choose a lower metricsPort"
            )
        for port, user in RAY_POD_PORTS.items():
            if first <= port <= last:
                raise ValueError(
                    f"reporting.metricsPort: the trainer's metrics ports {first}-{last} (one per GPU of a "
                    f"worker) include {port}, which {user} uses in the same pod; choose another metricsPort"
                )
        return self


# Fields that cannot change while a job exists: changing them would make the next attempt unable to
# resume from the checkpoints already written (other model, other world size, other volume).
IMMUTABLE_FIELDS: tuple[tuple[str, ...], ...] = (
    ("workload", "model"),
    ("workload", "entrypoint"),
    ("workers", "replicas"),
    ("workers", "gpusPerWorker"),
    ("checkpoint", "storage"),
)


class Progress(base.ApiModel):
    """Written by the trainer's rank 0 only."""

    step: int = 0
    total_steps: int | None = None
    epoch: int = 0
    loss: float | None = None
    samples_per_second: float | None = None
    percent: float | None = None
    eta_seconds: float | None = None
    worker_restarts: int = pydantic.Field(default=0, description="Worker-group restarts inside this attempt.")
    updated: str | None = None


class CheckpointStatus(base.ApiModel):
    """Written by the trainer's rank 0 only."""

    step: int
    epoch: int = 0
    path: str
    time: str
    metrics: dict[str, float] = pydantic.Field(default_factory=dict)


class NetworkStatus(base.ApiModel):
    """Written by the trainer's rank 0 only."""

    profile: str
    backend: str | None = None
    # Explicit alias: to_camel would give "...GbPerSecond"; the wire name spells the unit (GB/s) exactly.
    all_reduce_bus_bandwidth_gb_per_second: float | None = pydantic.Field(
        default=None,
        alias="allReduceBusBandwidthGBPerSecond",
        description="All-reduce bus bandwidth measured at start-up, in GB/s (gigabytes per second, 1e9 "
        "bytes/s; nccl-tests' busbw). Renamed in v1alpha1, without a conversion, from a name that read as "
        "gigabits per second; the value and its unit did not change.",
    )
    probe_bytes: int | None = None
    world_size: int | None = None
    measured: str | None = None


class TrainingJobOperatorStatus(operator_status.OperatorStatus):
    """The operator's part of a TrainingJob's status: every kind's, and the sizes its columns show."""

    workers: int | None = None
    gpus: int | None = None


class TrainingJobStatus(TrainingJobOperatorStatus):
    # Trainer-owned (rank 0); everything above is the operator's.
    progress: Progress | None = None
    checkpoint: CheckpointStatus | None = None
    network: NetworkStatus | None = None


class TrainingJob(base.ApiModel):
    api_version: Literal["trainop.dev/v1alpha1"] = "trainop.dev/v1alpha1"
    kind: Literal["TrainingJob"] = "TrainingJob"
    metadata: base.ObjectMeta
    spec: TrainingJobSpec
    status: TrainingJobStatus | None = None
