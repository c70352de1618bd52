"""The TrainingJob API (trainop.dev/v1alpha1): spec, status and the cross-field rules.

These models are the single source of truth: the CRD schema (crds/), the defaults the apiserver fills
in, the docs' field tables and the trainer's config are all derived from them. Cross-field rules are
written twice on purpose — once as a pydantic validator (for ``trainop validate`` and local mode) and
once as a CEL rule attached to the schema (so the apiserver refuses the same manifest, with the same
sentence) — and tests/integration/test_api_verdicts.py sends the invalid corpus and hypothesis-drawn
manifests to a real apiserver to check that both refuse the same manifests.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

import pydantic

from trainop.api import base, cel

ENTRYPOINT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
NCCL_ENV_KEY_PATTERN = r"^(NCCL|TORCH_NCCL|UCX|FI)_[A-Z0-9_]+$"
CLAIM_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
MAX_FAILURE_HISTORY = 10
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


class BuiltinModel(enum.StrEnum):
    RESNET18 = "resnet18"
    RESNET50 = "resnet50"
    GPT_SMALL = "gpt-small"  # GPT-2 small shape, ~124M parameters
    GPT_MEDIUM = "gpt-medium"  # GPT-3 Medium shape, ~354M parameters
    GPT_XL = "gpt-xl"  # GPT-3 XL shape, ~1.3B parameters
    GPT_TINY = "gpt-tiny"  # a few layers: CPU tests and the demo
    BERT_BASE = "bert-base"  # BERT-base shape, masked-LM on tokens, ~110M parameters
    VIT_B16 = "vit-b16"  # torchvision ViT-B/16, ~86M parameters
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


class ParallelismStrategy(enum.StrEnum):
    DDP = "ddp"  # every rank holds the whole model; gradients are all-reduced (DistributedDataParallel)
    FSDP = "fsdp"  # parameters, gradients and optimizer state sharded over every rank (FSDP2 fully_shard)
    HSDP = "hsdp"  # sharded over the GPUs of each worker pod, replicated across pods (FSDP2 on a 2-D mesh)


class ActivationCheckpointingMode(enum.StrEnum):
    NONE = "none"
    BLOCKS = "blocks"  # recompute the activations of the model's repeated blocks in the backward pass


class AccessMode(enum.StrEnum):
    READ_WRITE_ONCE = "ReadWriteOnce"
    READ_WRITE_MANY = "ReadWriteMany"
    READ_WRITE_ONCE_POD = "ReadWriteOncePod"


class Dataset(base.ApiModel):
    """Where the training data comes from. Nothing is downloaded: real datasets are read from a path."""

    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel.rule(
                    "self.kind == 'synthetic' || (has(self.path) && self.path != '')",
                    "path is required when kind is not synthetic: set the directory or file",
                    cel.format("path is required when kind is %s: set the directory or file", "self.kind"),
                )
            ]
        }
    )

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


class LearningRateRule(enum.StrEnum):
    CONSTANT = "constant"  # learningRate as given, whatever batch the finder chose
    LINEAR = "linear"  # learningRate x batch / referenceBatchSize (Goyal et al., SGD)
    SQRT = "sqrt"  # learningRate x sqrt(batch / referenceBatchSize) (Adam-family optimizers)


AUTO = "auto"


class BatchSizeSearch(base.ApiModel):
    """With ``batchSizePerWorker: auto``: how the trainer finds the batch (docs/trainer.md, "Batch-size
    finder")."""

    max_batch_size: Annotated[int, pydantic.Field(ge=1, le=65536)] = pydantic.Field(
        default=4096, description="The largest per-worker batch the finder considers."
    )
    multiple_of: Annotated[int, pydantic.Field(ge=1, le=4096)] = pydantic.Field(
        default=1, description="The batch is a multiple of this (the finder's resolution)."
    )
    memory_headroom: Annotated[float, pydantic.Field(ge=0.0, le=0.5)] = pydantic.Field(
        default=0.0,
        description="Fraction of the accelerator memory the chosen batch leaves unused (0: the largest batch "
        "whose measured training step fits).",
    )
    learning_rate_rule: LearningRateRule = pydantic.Field(
        default=LearningRateRule.CONSTANT,
        description="How learningRate follows the chosen batch: constant, linear or sqrt in "
        "batch / referenceBatchSize.",
    )
    reference_batch_size: Annotated[int, pydantic.Field(ge=1, le=65536)] = pydantic.Field(
        default=32, description="The per-worker batch that learningRate was chosen for."
    )


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
    batch_size_per_worker: Annotated[int, pydantic.Field(ge=1, le=65536)] | Literal["auto"] = pydantic.Field(
        default=32,
        description="Samples per worker and micro-batch, or auto: the largest batch whose training step fits "
        "the accelerator's memory, found before training (see batchSizeSearch).",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "type(self) == int ? (self >= 1 && self <= 65536) : self == 'auto'",
                    "message": "batchSizePerWorker must be an integer from 1 to 65536, or auto",
                }
            ]
        },
    )
    batch_size_search: BatchSizeSearch = pydantic.Field(default_factory=BatchSizeSearch)
    learning_rate: Annotated[float, pydantic.Field(gt=0.0, le=10.0)] = 0.1
    optimizer: OptimizerName = OptimizerName.SGD
    momentum: Annotated[float, pydantic.Field(ge=0.0, lt=1.0)] = 0.9
    weight_decay: Annotated[float, pydantic.Field(ge=0.0, le=1.0)] = 0.0
    schedule: Schedule = pydantic.Field(default_factory=Schedule)
    gradient_accumulation_steps: Annotated[int, pydantic.Field(ge=1, le=1024)] = 1
    gradient_clip_norm: Annotated[float, pydantic.Field(gt=0.0)] | None = None
    # NumPy's and Ray Tune's generators take seeds below 2^32 (the trainer seeds seed + rank).
    seed: Annotated[int, pydantic.Field(ge=0, le=MAX_SEED)] = 0

    @pydantic.field_validator("batch_size_per_worker", mode="before")
    @classmethod
    def _integer_or_auto(cls, value: Any) -> Any:
        # One message for both arms of the union (pydantic would report each arm's complaint).
        if value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65536):
            return value
        raise ValueError("must be an integer from 1 to 65536, or auto")

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


class ActivationCheckpointing(base.ApiModel):
    """Trade compute for memory: activations of the chosen blocks are recomputed in the backward pass."""

    mode: ActivationCheckpointingMode = ActivationCheckpointingMode.NONE
    every: Annotated[int, pydantic.Field(ge=1, le=64)] = pydantic.Field(
        default=1,
        description="With mode blocks: checkpoint every n-th block (1: every block; 2: every other one).",
    )


class Parallelism(base.ApiModel):
    """How the model is spread over the workers (docs/trainer.md, "Parallelism": when to choose which)."""

    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.cpuOffload) || !self.cpuOffload "
                    "|| (has(self.strategy) && self.strategy != 'ddp')",
                    "message": "parallelism.cpuOffload offloads FSDP's shards: set parallelism.strategy to "
                    "fsdp or hsdp, or remove cpuOffload",
                }
            ]
        }
    )

    strategy: ParallelismStrategy = pydantic.Field(
        default=ParallelismStrategy.DDP,
        description="ddp (whole model on every GPU), fsdp (sharded over all GPUs, FSDP2) or hsdp (sharded "
        "within each worker pod, replicated across pods).",
    )
    reshard_after_forward: bool = pydantic.Field(
        default=True,
        description="fsdp/hsdp: free the gathered parameters after the forward pass and gather them again "
        "for the backward pass (less memory); false keeps them until the backward pass (less communication).",
    )
    cpu_offload: bool = pydantic.Field(
        default=False,
        description="fsdp/hsdp on GPUs: keep the sharded parameters, gradients and optimizer state in host "
        "memory (the optimizer step runs on the CPU): for models whose state does not fit the GPUs.",
    )
    activation_checkpointing: ActivationCheckpointing = pydantic.Field(
        default_factory=ActivationCheckpointing
    )

    @pydantic.model_validator(mode="after")
    def _offload_needs_sharding(self) -> Parallelism:
        if self.cpu_offload and self.strategy == ParallelismStrategy.DDP:
            raise ValueError(
                "parallelism.cpuOffload offloads FSDP's shards: set parallelism.strategy to fsdp or hsdp, or "
                "remove cpuOffload"
            )
        return self


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


def _spec_rules() -> list[cel.Rule]:
    """The CEL twins of TrainingJobSpec's validators (same sentences, values filled in)."""
    first = "self.reporting.metricsPort"
    gpus = "self.workers.gpusPerWorker"
    last = f"({first} + ({gpus} > 1 ? {gpus} : 1) - 1)"
    ray_ports = "[" + ", ".join(str(port) for port in RAY_POD_PORTS) + "]"
    users = "{" + ", ".join(f"{port}: {cel.string(user)}" for port, user in RAY_POD_PORTS.items()) + "}"
    clash = f"{ray_ports}.filter(p, {first} <= p && p <= {last})[0]"
    return [
        cel.rule("self.precision != 'fp16' || self.workers.gpusPerWorker >= 1", FP16_NEEDS_GPUS),
        cel.rule(
            "self.parallelism.strategy == 'ddp' || self.precision != 'fp16'",
            FP16_NEEDS_DDP.format(strategy="fsdp/hsdp"),
            cel.format(FP16_NEEDS_DDP.replace("{strategy}", "%s"), "self.parallelism.strategy"),
        ),
        cel.rule("!self.parallelism.cpuOffload || self.workers.gpusPerWorker >= 1", CPU_OFFLOAD_NEEDS_GPUS),
        cel.rule(
            "!has(self.workload.entrypoint) || type(self.hyperparameters.batchSizePerWorker) == int",
            AUTO_BATCH_NEEDS_A_BUILTIN_MODEL,
        ),
        cel.rule(
            f"{last} <= 65535",
            "reporting.metricsPort leaves no room for one port per GPU; choose a lower metricsPort",
            cel.format(
                "reporting.metricsPort %d leaves no room for one port per GPU (up to %d); choose a lower "
                "metricsPort",
                first,
                last,
            ),
        ),
        cel.rule(
            f"{ray_ports}.all(p, p < {first} || p > {last})",
            "reporting.metricsPort: the trainer's metrics ports (one per GPU of a worker) include a port "
            "Ray uses in the same pod; choose another metricsPort",
            cel.format(
                "reporting.metricsPort: the trainer's metrics ports %d-%d (one per GPU of a worker) include "
                "%d, which %s uses in the same pod; choose another metricsPort",
                first,
                last,
                clash,
                f"{users}[{clash}]",
            ),
        ),
    ]


FP16_NEEDS_GPUS = "precision fp16 needs GPUs: set workers.gpusPerWorker >= 1 or use bf16/fp32"
FP16_NEEDS_DDP = (
    "precision fp16 is not supported with parallelism.strategy {strategy} (its loss scaling is per rank, "
    "and sharded gradients need one decision for all): use bf16"
)
CPU_OFFLOAD_NEEDS_GPUS = (
    "parallelism.cpuOffload moves sharded state from the GPUs to host memory: set "
    "workers.gpusPerWorker >= 1 or remove cpuOffload"
)
AUTO_BATCH_NEEDS_A_BUILTIN_MODEL = (
    "hyperparameters.batchSizePerWorker auto probes a built-in model's training step; a user "
    "entrypoint chooses its own batch: set an integer batchSizePerWorker"
)


class TrainingJobSpec(base.ApiModel):
    model_config = pydantic.ConfigDict(json_schema_extra=lambda schema: _with_rules(schema, _spec_rules()))

    image: str = pydantic.Field(default="ghcr.io/trainop/trainer:0.1.0", min_length=1)
    ray_version: Annotated[str, pydantic.Field(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")] = "2.60.0"
    workload: Workload
    hyperparameters: Hyperparameters
    precision: Precision = Precision.BF16
    compile: bool = pydantic.Field(default=False, description="Wrap the model in torch.compile.")
    parallelism: Parallelism = pydantic.Field(default_factory=Parallelism)
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
            raise ValueError(FP16_NEEDS_GPUS)
        return self

    @pydantic.model_validator(mode="after")
    def _auto_batch_needs_a_builtin_model(self) -> TrainingJobSpec:
        if self.hyperparameters.batch_size_per_worker == AUTO and self.workload.entrypoint is not None:
            raise ValueError(AUTO_BATCH_NEEDS_A_BUILTIN_MODEL)
        return self

    @pydantic.model_validator(mode="after")
    def _sharding_fits_precision_and_device(self) -> TrainingJobSpec:
        sharded = self.parallelism.strategy != ParallelismStrategy.DDP
        if sharded and self.precision == Precision.FP16:
            raise ValueError(FP16_NEEDS_DDP.format(strategy=self.parallelism.strategy.value))
        if self.parallelism.cpu_offload and self.workers.gpus_per_worker == 0:
            raise ValueError(CPU_OFFLOAD_NEEDS_GPUS)
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


def _with_rules(schema: dict[str, Any], rules: list[cel.Rule]) -> None:
    """json_schema_extra as a function: the rules are built once the models they read exist."""
    schema.setdefault("x-kubernetes-validations", []).extend(rules)


class Failure(base.ApiModel):
    attempt: int
    reason: str
    message: str = ""
    time: str


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
    batch_size_per_worker: int | None = pydantic.Field(
        default=None,
        description="The batch each worker trains with (with batchSizePerWorker auto: the finder's choice).",
    )
    learning_rate: float | None = pydantic.Field(
        default=None, description="The learning rate of the last step (schedule and batch rule applied)."
    )
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


class Children(base.ApiModel):
    ray_job: str | None = None
    config_map: str | None = None
    persistent_volume_claim: str | None = None
    service_account: str | None = None


class TrainingJobStatus(base.ApiModel):
    # Operator-owned.
    phase: Phase | None = None
    conditions: list[base.Condition] = pydantic.Field(default_factory=list)
    observed_generation: int | None = None
    attempt: int = 0
    restarts: int = 0
    failures: list[Failure] = pydantic.Field(default_factory=list, max_length=MAX_FAILURE_HISTORY)
    children: Children | None = None
    workers: int | None = None
    gpus: int | None = None
    start_time: str | None = None
    completion_time: str | None = None
    next_restart_time: str | None = None
    # Trainer-owned (rank 0).
    progress: Progress | None = None
    checkpoint: CheckpointStatus | None = None
    network: NetworkStatus | None = None


class TrainingJob(base.ApiModel):
    api_version: Literal["trainop.dev/v1alpha1"] = "trainop.dev/v1alpha1"
    kind: Literal["TrainingJob"] = "TrainingJob"
    metadata: base.ObjectMeta
    spec: TrainingJobSpec
    status: TrainingJobStatus | None = None
