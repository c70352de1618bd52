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
from pydantic import alias_generators

from trainop.api import base, cel, experiment, model_config, operator_status

# Defined once in operator_status (both kinds share them); named here too, where a job's users look.
Phase = operator_status.Phase
Failure = operator_status.Failure
Children = operator_status.Children
MAX_FAILURE_HISTORY = operator_status.MAX_FAILURE_HISTORY

ENTRYPOINT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
NCCL_ENV_KEY_PATTERN = r"^(NCCL|TORCH_NCCL|UCX|FI)_[A-Z0-9_]+$"
# A claim's and a Secret's name: what Kubernetes accepts as their names (single dots: "a..b" is refused).
CLAIM_NAME_PATTERN = base.DNS_SUBDOMAIN_PATTERN
SECRET_NAME_PATTERN = CLAIM_NAME_PATTERN
TOLERATION_KEY_PATTERN = "^$|" + base.LABEL_KEY_PATTERN  # empty: every taint (with operator Exists)
# S3's bucket naming rules (3-63 characters: lower-case letters, digits, dots and hyphens).
BUCKET_PATTERN = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"
# A key prefix or sub-directory: segments joined by single slashes, none of them "." or "..", no leading or
# trailing slash. Without look-around: the apiserver's regular expressions are Go's (RE2).
_SEGMENT = r"(?:[^/\s.][^/\s]*|\.[^/\s.][^/\s]*|\.\.[^/\s]+)"
PREFIX_PATTERN = rf"^{_SEGMENT}(/{_SEGMENT})*$"
ENDPOINT_PATTERN = r"^https?://[A-Za-z0-9.:\[\]_-]+/?$"
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
    DIGITS = (
        "digits"  # scikit-learn's bundled 8x8 handwritten digits: a real dataset that ships with a package
    )


class Precision(enum.StrEnum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"


class CompileWrapper(enum.StrEnum):
    PYTHON = "python"  # Inductor's default: each compiled graph launches its kernels from generated Python
    CPP = "cpp"  # Inductor's C++ wrapper (torch._inductor.config.cpp_wrapper): launches from compiled C++


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
                    "self.kind in ['synthetic', 'digits'] || (has(self.path) && self.path != '')",
                    "path is required when kind is not synthetic: set the directory or file",
                    cel.format("path is required when kind is %s: set the directory or file", "self.kind"),
                )
            ]
        }
    )

    kind: DatasetKind = DatasetKind.SYNTHETIC
    """Where samples come from: synthetic (the default: generated on the fly, nothing to prepare), cifar10
    (the python-pickle data_batch_* files under path), imagefolder (one sub-directory of images per class
    under path), tokens (a flat little-endian uint16 token file at path, memory-mapped) or digits
    (scikit-learn's bundled 1,797 8x8 handwritten digits, 10 classes, no path: a real dataset for the mlp).
    Image kinds feed resnet18, resnet50 and vit-b16, tokens feeds the gpt models and bert-base, digits feeds
    mlp, synthetic fits every model; another pairing is refused."""
    path: str | None = pydantic.Field(
        default=None,
        description="The data as the pods see it, required by every kind but synthetic and digits: the "
        "cifar10 or imagefolder directory, or the tokens file. A relative path is inside spec.data (/data in "
        "the pods), e.g. tokens/train.bin; an absolute one is taken as it is, e.g. /checkpoints/data/... on "
        "the checkpoint claim.",
    )
    num_samples: Annotated[int, pydantic.Field(ge=1)] = pydantic.Field(
        default=50_000,
        description="Samples per epoch of the synthetic dataset (real datasets have their own). "
        "Default 50000.",
    )
    image_size: Annotated[int, pydantic.Field(ge=8, le=1024)] = 224
    """Side of the square images fed to resnet18/resnet50, in pixels: synthetic images are generated at this
    size, real ones cropped and resized to it. Default 224, ImageNet's."""
    num_classes: Annotated[int, pydantic.Field(ge=2)] = 1000
    """Classes of the classification models (resnet18, resnet50, mlp): the width of the output layer and the
    label range of synthetic data. Default 1000, ImageNet's."""
    sequence_length: Annotated[int, pydantic.Field(ge=8, le=32768)] = 1024
    """Tokens per training sequence of gpt-small/gpt-tiny (the context length). Default 1024, GPT-2's."""
    num_workers: Annotated[int, pydantic.Field(ge=0, le=64)] = pydantic.Field(
        default=2,
        description="DataLoader worker processes per rank, which prepare batches in parallel with training. "
        "Also sizes the worker pods when cpusPerWorker/memoryPerWorker are unset. Default 2; 0 loads in the "
        "training process.",
    )

    @pydantic.model_validator(mode="after")
    def _path_needed(self) -> Dataset:
        if self.kind not in (DatasetKind.SYNTHETIC, DatasetKind.DIGITS) and not self.path:
            raise ValueError(f"path is required when kind is {self.kind.value}: set the directory or file")
        return self


class Evaluation(base.ApiModel):
    """Validation during training: every N steps and/or epochs, on a held-out split or a separate dataset."""

    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel.rule(
                    "has(self.everySteps) || has(self.everyEpochs)",
                    "set evaluation.everySteps or evaluation.everyEpochs (or both)",
                )
            ]
        }
    )

    every_steps: Annotated[int, pydantic.Field(ge=1)] | None = None
    """Evaluate every this many optimizer steps. Set everySteps, everyEpochs or both; the model is also
    evaluated after the last step."""
    every_epochs: Annotated[int, pydantic.Field(ge=1)] | None = None
    """Evaluate at the end of every this many epochs."""
    holdout_fraction: Annotated[float, pydantic.Field(gt=0.0, le=0.5)] = pydantic.Field(
        default=0.1,
        description="Without evaluation.dataset: the fraction of workload.dataset held out for evaluation "
        "(a fixed, seeded choice of samples; training never sees them). Default 0.1.",
    )
    dataset: Dataset | None = None
    """A separate evaluation dataset (the same fields as workload.dataset). Unset: a held-out split of
    workload.dataset (holdoutFraction)."""
    max_batches: Annotated[int, pydantic.Field(ge=1)] | None = None
    """Evaluate on at most this many batches per rank (a quicker, partial evaluation). Unset: the whole
    evaluation set, split over the ranks."""
    batch_size_per_worker: Annotated[int, pydantic.Field(ge=1, le=65536)] | None = None
    """Samples per evaluation batch on each rank. Unset: the training batchSizePerWorker."""

    @pydantic.model_validator(mode="after")
    def _has_a_period(self) -> Evaluation:
        if self.every_steps is None and self.every_epochs is None:
            raise ValueError("set evaluation.everySteps or evaluation.everyEpochs (or both)")
        return self


WORKLOAD_EXACTLY_ONE = (
    "set exactly one of workload.model (a built-in model), workload.entrypoint (your own "
    "pkg.module:function) or workload.rayTrain (a Ray Train train_loop_per_worker)"
)


#: What each built-in model trains on: (what it reads, the dataset kinds that hold it).
MODEL_DATA: tuple[tuple[frozenset[BuiltinModel], str, tuple[DatasetKind, ...]], ...] = (
    (
        frozenset({BuiltinModel.RESNET18, BuiltinModel.RESNET50, BuiltinModel.VIT_B16}),
        "images",
        (DatasetKind.SYNTHETIC, DatasetKind.CIFAR10, DatasetKind.IMAGEFOLDER),
    ),
    (
        frozenset(
            {
                BuiltinModel.GPT_SMALL,
                BuiltinModel.GPT_MEDIUM,
                BuiltinModel.GPT_XL,
                BuiltinModel.GPT_TINY,
                BuiltinModel.BERT_BASE,
            }
        ),
        "tokens",
        (DatasetKind.SYNTHETIC, DatasetKind.TOKENS),
    ),
    (
        frozenset({BuiltinModel.MLP}),
        "feature vectors",
        (DatasetKind.SYNTHETIC, DatasetKind.DIGITS),
    ),
)
#: The features of dataset kind digits (scikit-learn's 8x8 images): the mlp's inputDim on it.
DIGITS_FEATURES = 64
MODEL_DATASET_MISMATCH = (
    "workload.dataset.kind {kind} does not fit model {model}, which trains on {what}: use {allowed}"
)


def _either(kinds_: tuple[DatasetKind, ...]) -> str:
    """'synthetic, cifar10 or imagefolder'."""
    *others, last = [k.value for k in kinds_]
    return f"{', '.join(others)} or {last}" if others else last


def dataset_mismatch(model: BuiltinModel | None, kind: DatasetKind) -> str | None:
    """Why a dataset of ``kind`` cannot feed the built-in ``model`` (MODEL_DATASET_MISMATCH), or None."""
    for models, what, allowed in MODEL_DATA:
        if model in models and kind not in allowed:
            return MODEL_DATASET_MISMATCH.format(
                kind=kind.value, model=model.value, what=what, allowed=_either(allowed)
            )
    return None


def _model_dataset_rules() -> list[cel.Rule]:
    """The CEL twins of ``Workload._dataset_fits_the_model``, one per kind of data."""
    rules = []
    for models, what, allowed in MODEL_DATA:
        names = cel.strings(m.value for m in sorted(models))
        kinds_ = cel.strings(k.value for k in allowed)
        text = MODEL_DATASET_MISMATCH.replace("{what}", what).replace("{allowed}", _either(allowed))
        rules.append(
            cel.rule(
                f"!has(self.model) || !(self.model in {names}) || !has(self.dataset) "
                f"|| !has(self.dataset.kind) || self.dataset.kind in {kinds_}",
                text.format(kind="<kind>", model="<model>"),
                cel.format(text.format(kind="%s", model="%s"), "self.dataset.kind", "self.model"),
            )
        )
    return rules


class Workload(base.ApiModel):
    """What to train: a built-in model + dataset, a user function ``pkg.module:function``, or an unmodified
    Ray Train function."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=lambda schema: schema.setdefault("x-kubernetes-validations", []).extend(
            [
                {
                    "rule": "[has(self.model), has(self.entrypoint), has(self.rayTrain)]"
                    ".filter(set, set).size() == 1",
                    "message": WORKLOAD_EXACTLY_ONE,
                },
                *_model_dataset_rules(),
            ]
        )
    )

    model: BuiltinModel | None = None
    """A built-in model: resnet18 or resnet50 (torchvision image classifiers), gpt-small (GPT-2 small shape,
    about 124M parameters), gpt-tiny (2 layers, for CPU tests), mlp (a small multilayer perceptron: the CPU
    demo). Set model or entrypoint, not both; it cannot change while the job exists."""
    entrypoint: Annotated[str, pydantic.Field(pattern=ENTRYPOINT_PATTERN, max_length=256)] | None = (
        pydantic.Field(
            default=None,
            description="Your own training function as 'pkg.module:function', called as function(ctx) on "
            "every rank (docs/trainer.md, User workloads); its package must be importable in the image. Set "
            "entrypoint or model, not both; it cannot change while the job exists.",
        )
    )
    ray_train: Annotated[str, pydantic.Field(pattern=ENTRYPOINT_PATTERN, max_length=256)] | None = (
        pydantic.Field(
            default=None,
            description="An unmodified Ray Train V2 training function as 'pkg.module:train_loop_per_worker', "
            "written with ray.train.report, ray.train.get_checkpoint and ray.train.torch.prepare_model / "
            "prepare_data_loader: trainop runs it in a TorchTrainer with its storage path, NCCL environment, "
            "worker restarts and attempts, and maps its reports and checkpoints onto the status "
            "(docs/trainer.md, Ray Train functions). workload.config is its train_loop_config. Set one of "
            "model, entrypoint or rayTrain; it cannot change while the job exists.",
        )
    )
    dataset: Dataset = pydantic.Field(default_factory=Dataset)
    """The training data. Nothing is ever downloaded: synthetic data is generated, real data is read from
    dataset.path inside the pods (for example on the checkpoint volume)."""
    config: dict[str, Any] = pydantic.Field(
        default_factory=dict,
        description="Settings of the workload. For a built-in model only the keys it reads, each a positive "
        "integer but dropout (a number in [0, 1)) and maskTokenId (0 or more): the gpt models "
        "vocabSize, numLayers, numHeads, embedDim, dropout; bert-base those and maskTokenId; "
        "vit-b16 patchSize, numLayers, numHeads, embedDim, mlpDim; mlp inputDim, hiddenDim, "
        "numLayers (inputDim is 64 with dataset kind digits); resnet18 and resnet50 none. Any "
        "other key is refused, naming it. For an entrypoint, free-form: whatever it reads from "
        "ctx.config; for rayTrain, the train_loop_config its function receives.",
    )

    @pydantic.field_validator("config", mode="after")
    @classmethod
    def _config_fits_the_model(cls, config: dict[str, Any], info: pydantic.ValidationInfo) -> dict[str, Any]:
        model = info.data.get("model")
        if model is None:  # an entrypoint's or a Ray Train function's: free-form (or model itself is wrong)
            return config
        if base.accepted_before(info):  # a rule newer than some running jobs (base.ACCEPTED)
            return config
        found = model_config.problem(model.value, config)
        if found is not None:
            raise ValueError(found)
        dataset = info.data.get("dataset")
        input_dim = config.get(model_config.Key.INPUT_DIM.value)
        digits = dataset is not None and dataset.kind == DatasetKind.DIGITS
        if digits and input_dim not in (None, DIGITS_FEATURES):
            raise ValueError(
                f"workload.config.inputDim is {DIGITS_FEATURES} with dataset kind digits (8x8 images), not "
                f"{input_dim}: remove it"
            )
        return config

    @pydantic.model_validator(mode="after")
    def _exactly_one(self) -> Workload:
        if [self.model, self.entrypoint, self.ray_train].count(None) != 2:
            raise ValueError(WORKLOAD_EXACTLY_ONE)
        return self

    @pydantic.model_validator(mode="after")
    def _dataset_fits_the_model(self) -> Workload:
        mismatch = dataset_mismatch(self.model, self.dataset.kind)
        if mismatch is not None:
            raise ValueError(mismatch)
        return self


class Schedule(base.ApiModel):
    kind: ScheduleKind = ScheduleKind.COSINE
    """Shape of the learning rate after warmup: cosine (the default: a half cosine from learningRate down to
    learningRate x minLrRatio at the last step), linear (a straight line to the same floor) or constant
    (stays at learningRate)."""
    warmup_steps: Annotated[int, pydantic.Field(ge=0)] = 0
    """Optimizer steps at the start during which the learning rate rises linearly from
    learningRate/warmupSteps to learningRate. Default 0: no warmup."""
    min_lr_ratio: Annotated[float, pydantic.Field(ge=0.0, le=1.0)] = 0.0
    """The learning rate at the last step as a fraction of learningRate, for cosine and linear. Default 0:
    decay to zero."""


class LearningRateRule(enum.StrEnum):
    CONSTANT = "constant"  # learningRate as given, whatever batch the finder chose
    LINEAR = "linear"  # learningRate x batch / referenceBatchSize (Goyal et al., SGD)
    SQRT = "sqrt"  # learningRate x sqrt(batch / referenceBatchSize) (Adam-family optimizers)


AUTO = "auto"


class BatchSizeSearch(base.ApiModel):
    """With ``batchSizePerWorker: auto``: how the trainer finds the batch (docs/trainer.md, "Batch-size
    finder")."""

    max_batch_size: Annotated[int, pydantic.Field(ge=1, le=65536)] = pydantic.Field(
        default=4096, description="The largest per-worker batch the finder considers. Default 4096."
    )
    multiple_of: Annotated[int, pydantic.Field(ge=1, le=4096)] = pydantic.Field(
        default=1, description="The batch is a multiple of this (the finder's resolution). Default 1."
    )
    memory_headroom: Annotated[float, pydantic.Field(ge=0.0, le=0.5)] = pydantic.Field(
        default=0.0,
        description="Fraction of the accelerator memory the chosen batch leaves unused (0: the largest batch "
        "whose measured training step fits). Default 0.",
    )
    learning_rate_rule: LearningRateRule = pydantic.Field(
        default=LearningRateRule.CONSTANT,
        description="How learningRate follows the chosen batch: constant, linear or sqrt in "
        "batch / referenceBatchSize. Default constant.",
    )
    reference_batch_size: Annotated[int, pydantic.Field(ge=1, le=65536)] = pydantic.Field(
        default=32, description="The per-worker batch that learningRate was chosen for. Default 32."
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
    """Passes over the dataset. Set epochs, maxSteps or both: training ends at whichever comes first."""
    max_steps: Annotated[int, pydantic.Field(ge=1)] | None = pydantic.Field(
        default=None, description="Optimizer steps in total; ends training before epochs if both are set."
    )
    batch_size_per_worker: Annotated[int, pydantic.Field(ge=1, le=65536)] | Literal["auto"] = pydantic.Field(
        default=32,
        description="Samples per micro-batch on each rank (each GPU, or each CPU worker pod), or auto: the "
        "largest batch whose training step fits the accelerator's memory, found before training (see "
        "batchSizeSearch). The global batch of one optimizer step is batchSizePerWorker x ranks x "
        "gradientAccumulationSteps. Default 32.",
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
    """With batchSizePerWorker auto: the largest batch considered, its resolution, the memory left unused and
    how learningRate follows the chosen batch."""
    learning_rate: Annotated[float, pydantic.Field(gt=0.0, le=10.0)] = 0.1
    """Peak learning rate, reached after schedule.warmupSteps and then following schedule.kind. Default 0.1, a
    usual value for SGD on ResNets; adam and adamw usually want 1e-4 to 1e-3."""
    optimizer: OptimizerName = OptimizerName.SGD
    """The optimizer: sgd (the default, with momentum), adam, or adamw (decoupled weight decay). Fused kernels
    on CUDA."""
    momentum: Annotated[float, pydantic.Field(ge=0.0, lt=1.0)] = 0.9
    """SGD momentum; adam and adamw ignore it. Default 0.9."""
    weight_decay: Annotated[float, pydantic.Field(ge=0.0, le=1.0)] = 0.0
    """Weight decay of every parameter: an L2 penalty for sgd and adam, decoupled decay for adamw. Default 0:
    none."""
    schedule: Schedule = pydantic.Field(default_factory=Schedule)
    """The learning-rate schedule over the optimizer steps: linear warmup, then cosine, linear or constant."""
    gradient_accumulation_steps: Annotated[int, pydantic.Field(ge=1, le=1024)] = 1
    """Micro-batches whose gradients are summed before each optimizer step (DDP all-reduces only on the last).
    Raises the global batch without more memory. Default 1."""
    gradient_clip_norm: Annotated[float, pydantic.Field(gt=0.0)] | None = None
    """Clip the gradients' global L2 norm to this value before each optimizer step. Unset: no clipping."""
    # NumPy's and Ray Tune's generators take seeds below 2^32 (the trainer seeds seed + rank).
    seed: Annotated[int, pydantic.Field(ge=0, le=MAX_SEED)] = 0
    """Seed of model initialisation, data order and dropout; rank r uses seed + r. The same seed and spec
    repeat the same run (bitwise on CPU). Default 0."""

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
                    "rule": f"!has(self.key) || {base.label_key_prefix_rule('self.key')}",
                    "message": base.LABEL_KEY_PREFIX_TOO_LONG,
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

    key: (
        Annotated[
            str,
            pydantic.Field(pattern=TOLERATION_KEY_PATTERN, max_length=base.MAX_LABEL_KEY_LENGTH),
            pydantic.AfterValidator(base.check_label_key_prefix),
        ]
        | None
    ) = None
    """The taint key this toleration matches, a label key such as nvidia.com/gpu. Empty with operator Exists:
    every taint."""
    operator: Literal["Exists", "Equal"] | None = None
    """Exists (any value of the key) or Equal (the default in Kubernetes: the taint's value must equal
    value)."""
    value: base.LabelValue | None = None
    """The taint value to match with operator Equal (a label value); empty with Exists."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """The taint effect to match: NoSchedule, PreferNoSchedule or NoExecute. Empty: every effect."""
    toleration_seconds: int | None = None
    """With effect NoExecute: how long the pod stays on a node after the taint appears, in seconds. Unset:
    forever."""

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
    """Worker pods. Each runs one DDP rank per GPU (one rank on CPU), so the job trains with replicas x
    gpusPerWorker ranks (replicas on CPU). Cannot change while the job exists: checkpoints are written for
    one world size. Default 1."""
    gpus_per_worker: Annotated[int, pydantic.Field(ge=0, le=16)] = pydantic.Field(
        default=1,
        description="GPUs (nvidia.com/gpu) of each worker pod, one DDP rank per GPU, over NCCL; 0 trains on "
        "CPU with gloo, one rank per pod. Sizes the pods when cpusPerWorker/memoryPerWorker are unset. "
        "Cannot change while the job exists. Default 1.",
    )
    # The three sizes below default to None: the pod is then sized for the job (trainop.api.resources),
    # which a static CRD default could not do (a CPU job and an 8-GPU job need different pods).
    cpus_per_worker: Annotated[float, pydantic.Field(gt=0.0, le=1024)] | None = None
    """CPU cores of each worker pod (requests = limits), shared by its ranks; fractions allowed (0.5 is 500m).
    Unset (the default): sized for the job, 1 + dataset.numWorkers on CPU workers (the rank and its
    DataLoader workers), gpusPerWorker x (2 + dataset.numWorkers) on GPU workers (per rank also a core for
    CUDA launches and NCCL's proxy thread)."""
    memory_per_worker: base.Quantity | None = None
    """Memory of each worker pod (requests = limits), a Kubernetes quantity such as 16Gi; /dev/shm
    (sharedMemory) is part of it. Unset (the default): sized for the job, 2Gi + 512Mi per DataLoader worker
    (dataset.numWorkers) on CPU workers; gpusPerWorker x (12Gi + 2Gi per DataLoader worker) on GPU workers,
    for the CUDA context, pinned checkpoint snapshots and loaders of full-size batches."""
    shared_memory: base.Quantity | None = None
    """Size of each worker pod's memory-backed /dev/shm, a Kubernetes quantity. NCCL's intra-node buffers,
    DataLoader workers' batches and Ray's object store (30% of the pod's memory) live there, and it counts
    against memoryPerWorker. Unset (the default): half of the pod's memory."""
    node_selector: dict[base.LabelKey, base.LabelValue] = pydantic.Field(
        default_factory=dict,
        max_length=64,
        json_schema_extra={
            "x-kubernetes-validations": [
                cel.rule(f"self.all(k, {base.label_key_prefix_rule('k')})", base.LABEL_KEY_PREFIX_TOO_LONG)
            ]
        },
    )
    """Node labels the worker pods require (the pod's nodeSelector), e.g. nvidia.com/gpu.product:
    NVIDIA-H100-80GB-HBM3; keys and values as Kubernetes checks them in a pod. The Ray head pod is not
    constrained."""
    tolerations: list[Toleration] = pydantic.Field(default_factory=list, max_length=64)
    """Tolerations of the worker pods, e.g. of the taint on GPU nodes (key nvidia.com/gpu, operator Exists,
    effect NoSchedule). The Ray head pod gets none."""
    priority_class_name: str | None = None
    """PriorityClass of the worker pods; it must exist in the cluster. A higher priority may preempt other
    pods when nodes are full; preempted workers checkpoint within terminationGracePeriodSeconds."""
    termination_grace_period_seconds: Annotated[
        int, pydantic.Field(ge=MIN_TERMINATION_GRACE_PERIOD_SECONDS, le=3600)
    ] = pydantic.Field(
        default=DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS,
        description=(
            "terminationGracePeriodSeconds of the worker pods. When a worker pod is deleted or evicted "
            "(preemption, node drain), its preStop hook asks the training processes to checkpoint and "
            "waits for them up to this many seconds less 5; raise it when a checkpoint takes longer. "
            "Default 120."
        ),
    )


S3_WITH_EXISTING_CLAIM = (
    "checkpoint.storage.s3 and checkpoint.storage.existingClaim are two places for the same checkpoints: "
    "set one of them"
)
S3_WITH_DELETE_WITH_JOB = (
    "checkpoint.storage.deleteWithJob deletes a claim trainop created; with checkpoint.storage.s3 there is "
    "none, and trainop never deletes objects: remove deleteWithJob (or delete the prefix yourself)"
)
DATA_NEEDS_ONE_SOURCE = "set exactly one of data.existingClaim (a volume) or data.s3 (a bucket prefix)"
DATA_SUB_PATH_NEEDS_A_CLAIM = (
    "data.subPath selects a directory of data.existingClaim; with data.s3 put it into data.s3.prefix"
)


class S3Bucket(base.ApiModel):
    """A prefix in an S3-compatible bucket: AWS S3, or any server speaking its API (MinIO, Ceph RGW,
    versitygw; Google Cloud Storage through its XML API with HMAC keys, docs/storage.md). The trainer reads
    and writes it with pyarrow's S3 client; credentials come from a Secret, never from the spec."""

    bucket: Annotated[str, pydantic.Field(pattern=BUCKET_PATTERN)]
    """The bucket, which must exist: trainop never creates or deletes buckets."""
    prefix: Annotated[str, pydantic.Field(pattern=PREFIX_PATTERN, max_length=512)] | None = None
    """Key prefix inside the bucket, without leading or trailing slash (e.g. team-a/checkpoints). Unset (the
    default): the bucket's top level."""
    endpoint: Annotated[str, pydantic.Field(pattern=ENDPOINT_PATTERN, max_length=256)] | None = None
    """The server's URL, http:// or https:// with host and optional port, no path (e.g.
    http://minio.storage:9000, https://storage.googleapis.com). Unset (the default): AWS S3 in region."""
    region: Annotated[str, pydantic.Field(pattern=r"^[a-z0-9-]+$", max_length=64)] = pydantic.Field(
        default="us-east-1",
        description="The bucket's region (signs every request; most other servers accept any value). "
        "Default us-east-1.",
    )
    credentials_secret: (
        Annotated[str, pydantic.Field(pattern=SECRET_NAME_PATTERN, max_length=base.MAX_DNS_SUBDOMAIN)] | None
    ) = None
    """A Secret in the job's namespace with the keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and
    AWS_SESSION_TOKEN for temporary credentials), handed to the Ray containers as environment variables.
    Unset (the default): the pods' own AWS credentials (IRSA / EKS Pod Identity, an instance profile)."""


class Storage(base.ApiModel):
    """The checkpoint volume: a claim trainop creates, or one that already exists; or an S3 bucket."""

    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel.rule("!has(self.s3) || !has(self.existingClaim)", S3_WITH_EXISTING_CLAIM),
                cel.rule("!has(self.s3) || !self.deleteWithJob", S3_WITH_DELETE_WITH_JOB),
            ]
        }
    )

    size: base.Quantity = "50Gi"
    """Storage requested for the checkpoint claim trainop creates (ignored with existingClaim). It must hold
    keepLast checkpoints plus one being written; with adam or adamw a checkpoint takes about 12 bytes per
    model parameter. Default 50Gi."""
    storage_class_name: str | None = None
    """StorageClass of the created claim. Unset: the cluster's default StorageClass. Worker pods on several
    nodes need a class whose volumes every node can mount at once (accessMode ReadWriteMany)."""
    access_mode: AccessMode = AccessMode.READ_WRITE_ONCE
    """Access mode of the created claim: ReadWriteOnce (the default: one node at a time, enough when the head
    and every worker share a node), ReadWriteMany (a shared file system: needed when pods run on several
    nodes) or ReadWriteOncePod."""
    existing_claim: (
        Annotated[str, pydantic.Field(pattern=CLAIM_NAME_PATTERN, max_length=base.MAX_DNS_SUBDOMAIN)] | None
    ) = None
    """A PersistentVolumeClaim in the job's namespace to keep checkpoints on (and to read datasets from);
    trainop then creates no claim and never deletes it. Unset: trainop creates <job>-ckpt."""
    delete_with_job: bool = pydantic.Field(
        default=False,
        description="Delete the created claim with the job. Default false: checkpoints outlive the job, and "
        "a job created again under the same name resumes from them.",
    )
    s3: S3Bucket | None = None
    """Keep checkpoints in an S3-compatible bucket instead of on a volume, under <prefix>/<job name>/: no
    claim is created or mounted, so the Ray pods may run on any nodes (a multi-node job needs no
    ReadWriteMany storage class). size, storageClassName and accessMode are then ignored; existingClaim and
    deleteWithJob are refused (trainop never deletes objects: checkpoints outlive the job). Unset (the
    default): the volume."""

    @pydantic.model_validator(mode="after")
    def _one_place(self) -> Storage:
        if self.s3 is not None and self.existing_claim is not None:
            raise ValueError(S3_WITH_EXISTING_CLAIM)
        if self.s3 is not None and self.delete_with_job:
            raise ValueError(S3_WITH_DELETE_WITH_JOB)
        return self


class DataSource(base.ApiModel):
    """A read-only dataset every worker sees at /data: an existing claim, or a prefix of an S3 bucket."""

    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel.rule("has(self.existingClaim) != has(self.s3)", DATA_NEEDS_ONE_SOURCE),
                cel.rule("!has(self.subPath) || has(self.existingClaim)", DATA_SUB_PATH_NEEDS_A_CLAIM),
            ]
        }
    )

    existing_claim: (
        Annotated[str, pydantic.Field(pattern=CLAIM_NAME_PATTERN, max_length=base.MAX_DNS_SUBDOMAIN)] | None
    ) = None
    """A PersistentVolumeClaim in the job's namespace holding the data, mounted read-only at /data in every
    worker pod (several nodes at once need a ReadOnlyMany or ReadWriteMany volume). Unset (the default): see
    s3."""
    sub_path: Annotated[str, pydantic.Field(pattern=PREFIX_PATTERN, max_length=512)] | None = None
    """With existingClaim: mount only this directory of the volume at /data. Unset (the default): the
    whole volume."""
    s3: S3Bucket | None = None
    """A prefix of an S3-compatible bucket: before training, each worker pod copies the objects under it
    to /data (a pod-local emptyDir; files already there with the same size are kept, so a restarted worker
    group copies nothing again). Unset (the default): see existingClaim."""

    @pydantic.model_validator(mode="after")
    def _one_source(self) -> DataSource:
        if (self.existing_claim is None) == (self.s3 is None):
            raise ValueError(DATA_NEEDS_ONE_SOURCE)
        if self.sub_path is not None and self.existing_claim is None:
            raise ValueError(DATA_SUB_PATH_NEEDS_A_CLAIM)
        return self


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
    """Write a checkpoint every this many optimizer steps. Set intervalSteps, intervalMinutes or both
    (whichever comes first). A checkpoint is also written at the end and when the job is stopped or
    preempted."""
    interval_minutes: Annotated[float, pydantic.Field(gt=0.0, le=1440)] | None = 10.0
    """Write a checkpoint every this many minutes of training (rank 0's clock), at most 1440. Default 10: at
    most 10 minutes of training lost to a failure."""
    keep_last: Annotated[int, pydantic.Field(ge=1, le=100)] = 3
    """Checkpoints kept (on the volume or in the bucket); the oldest beyond this number are deleted after each
    successful write. Default 3, so a corrupt newest checkpoint still leaves older ones to resume from."""
    keep_best: experiment.KeepBest | None = None
    """Also keep the best checkpoint by an evaluation metric (metric, mode), apart from the keepLast newest:
    keepLast pruning never deletes it; status.checkpoint.best names it. Needs spec.evaluation (or an
    entrypoint's evaluate hook). Unset: only the keepLast newest are kept."""
    storage: Storage = pydantic.Field(default_factory=Storage)
    """Where checkpoints live: a volume mounted at /checkpoints in every Ray pod, or an S3 bucket (s3).
    Cannot change while the job exists: a new attempt must find the same checkpoints."""

    @pydantic.model_validator(mode="after")
    def _has_interval(self) -> Checkpoint:
        if self.interval_steps is None and self.interval_minutes is None:
            raise ValueError("set checkpoint.intervalSteps or checkpoint.intervalMinutes")
        return self


class FailureBudgets(base.ApiModel):
    """How many failures of each class a job survives: in-attempt worker restarts and new attempts
    together (status.workerFailures.counts + status.restartsByReason). A failure of a class whose budget is
    used up fails the job, with a message naming the budget. Preemptions and node losses are the
    cluster's doing and are retried without limit in practice (the job's activeDeadlineSeconds still
    bounds them); a deterministic bug is not worth a second full attempt."""

    preempted: Annotated[int, pydantic.Field(ge=0, le=10000)] = pydantic.Field(
        default=1000,
        description="Preempted: a Ray pod was evicted or deleted with a grace period (spot reclaim, drain). "
        "Restarted at once, without backoff. Default 1000.",
    )
    node_lost: Annotated[int, pydantic.Field(ge=0, le=10000)] = pydantic.Field(
        default=1000,
        description="NodeLost: a Ray pod's node went away or stopped being Ready. Restarted at once, without "
        "backoff. Default 1000.",
    )
    oom_killed: Annotated[int, pydantic.Field(ge=0, le=10000)] = pydantic.Field(
        default=1,
        description="OOMKilled: a container was killed over its memory limit. Lower "
        "hyperparameters.batchSizePerWorker or raise workers.memoryPerWorker rather than this. Default 1.",
    )
    stalled: Annotated[int, pydantic.Field(ge=0, le=10000)] = pydantic.Field(
        default=3,
        description="Stalled: no training progress for stallTimeoutSeconds (a hung collective, a stuck data "
        "loader), seen by the trainer's watchdog or the operator's. Default 3.",
    )
    nccl_error: Annotated[int, pydantic.Field(ge=0, le=10000)] = pydantic.Field(
        default=3, description="NCCLError: a collective failed or timed out. Default 3."
    )
    user_code_error: Annotated[int, pydantic.Field(ge=0, le=10000)] = pydantic.Field(
        default=1,
        description="UserCodeError: the training function raised (exception type and last frame in "
        "status.failures). Default 1: one retry for a flaky cause, not ten for a bug.",
    )
    infra_error: Annotated[int, pydantic.Field(ge=0, le=10000)] = pydantic.Field(
        default=5,
        description="InfraError: an image could not be pulled, a pod could not be scheduled, or KubeRay or "
        "Ray did not start. Default 5.",
    )
    invalid_spec: Annotated[int, pydantic.Field(ge=0, le=10000)] = pydantic.Field(
        default=0,
        description="InvalidSpec: KubeRay refused the RayJob the spec produced; retrying cannot help. "
        "Default 0.",
    )
    unknown: Annotated[int, pydantic.Field(ge=0, le=10000)] = pydantic.Field(
        default=3, description="Unknown: none of the facts seen tells the class. Default 3."
    )

    def of(self, reason: operator_status.FailureReason) -> int:
        """The budget of one failure class."""
        return int(getattr(self, _BUDGET_FIELDS[reason]))

    @staticmethod
    def key(reason: operator_status.FailureReason) -> str:
        """The budget's field name as written in a manifest, e.g. userCodeError."""
        return alias_generators.to_camel(_BUDGET_FIELDS[reason])


_BUDGET_FIELDS: dict[operator_status.FailureReason, str] = {
    operator_status.FailureReason.PREEMPTED: "preempted",
    operator_status.FailureReason.NODE_LOST: "node_lost",
    operator_status.FailureReason.OOM_KILLED: "oom_killed",
    operator_status.FailureReason.STALLED: "stalled",
    operator_status.FailureReason.NCCL_ERROR: "nccl_error",
    operator_status.FailureReason.USER_CODE_ERROR: "user_code_error",
    operator_status.FailureReason.INFRA_ERROR: "infra_error",
    operator_status.FailureReason.INVALID_SPEC: "invalid_spec",
    operator_status.FailureReason.UNKNOWN: "unknown",
}

# Failure classes the cluster causes, not the job: restarted at once (the pods are gone anyway).
NO_BACKOFF_REASONS = frozenset(
    {operator_status.FailureReason.PREEMPTED, operator_status.FailureReason.NODE_LOST}
)
# The lowest stallTimeoutSeconds: low enough for a test job, far below any real one.
MIN_STALL_TIMEOUT_SECONDS = 10
# The lowest stuckPodTimeoutSeconds: kubelet's first image pull retries come within it.
MIN_STUCK_POD_TIMEOUT_SECONDS = 30


class FailurePolicy(base.ApiModel):
    """How failures are retried. Every failed attempt (and every in-attempt worker restart) is classified
    (Preempted, NodeLost, OOMKilled, Stalled, NCCLError, UserCodeError, InfraError, InvalidSpec, Unknown)
    and counted against its class's budget; docs/operator.md, "Failures", says how each is detected."""

    max_restarts: Annotated[int, pydantic.Field(ge=0, le=10000)] | None = pydantic.Field(
        default=None,
        description="Optional cap on new attempts of the whole job (each a new RayJob, resuming from the "
        "newest checkpoint) whatever their class. Unset (the default): only the per-class budgets count.",
    )
    backoff_seconds: Annotated[int, pydantic.Field(ge=0, le=3600)] = pydantic.Field(
        default=10,
        description="Seconds to wait before a new attempt after a failure of a class; the wait doubles "
        "with each earlier restart of the same class, up to maxBackoffSeconds. Preempted and NodeLost "
        "attempts are restarted at once, without backoff. Default 10.",
    )
    max_backoff_seconds: Annotated[int, pydantic.Field(ge=0, le=86400)] = 600
    """Upper bound of the wait before a restart, in seconds. Default 600."""
    max_worker_failures: Annotated[int, pydantic.Field(ge=0, le=100)] = pydantic.Field(
        default=2,
        description="Worker-group restarts inside one attempt (Ray Train's FailureConfig.max_failures): a "
        "failed worker restarts every worker of the attempt from the newest checkpoint, within seconds, "
        "before the attempt fails. Default 2.",
    )
    stall_timeout_seconds: Annotated[int, pydantic.Field(ge=MIN_STALL_TIMEOUT_SECONDS, le=86400)] = (
        pydantic.Field(
            default=900,
            description="A rank that makes no training progress for this many seconds is stalled: the "
            "trainer dumps its stacks and fails the attempt as Stalled. The operator also restarts an "
            "attempt whose status.progress is not updated for this long plus twice reporting.everySeconds. "
            "Keep it "
            "well above the longest checkpoint write, compile or evaluation, and, for a workload.rayTrain "
            "function, above the longest gap between its ray.train.report calls. Default 900 (15 min), "
            "at least 10.",
        )
    )
    stuck_pod_timeout_seconds: Annotated[int, pydantic.Field(ge=MIN_STUCK_POD_TIMEOUT_SECONDS, le=86400)] = (
        pydantic.Field(
            default=600,
            description="An attempt whose Ray pods still wait on something that will not fix itself (an "
            "image that cannot be pulled, an invalid image name, a container config error such as a missing "
            "Secret or ConfigMap, a crash loop) this many seconds after its RayJob was created fails as "
            "InfraError (counted against budgets.infraError). Pods that no node can take yet "
            "(Unschedulable) are not failures: a node may join. Default 600 (10 min), at least 30.",
        )
    )
    trainer_watchdog: bool = pydantic.Field(
        default=True,
        description="Whether the trainer's own per-rank watchdog runs (heartbeats shared between ranks, "
        "the stuck rank named, its stacks dumped to <runDir>/stalls/, the attempt failed as Stalled after "
        "stallTimeoutSeconds). false leaves stall detection to the operator's watchdog alone (no stacks, "
        "a new attempt instead of an in-attempt restart). Default true.",
    )
    budgets: FailureBudgets = pydantic.Field(
        default_factory=FailureBudgets,
        description="Failures survived per class (in-attempt restarts and new attempts together); a failure "
        "over its class's budget fails the job.",
    )


class ActivationCheckpointing(base.ApiModel):
    """Trade compute for memory: activations of the chosen blocks are recomputed in the backward pass."""

    mode: ActivationCheckpointingMode = ActivationCheckpointingMode.NONE
    """none (the default: every activation is kept for the backward pass) or blocks (the model's
    transformer or residual blocks recompute theirs, see every)."""
    every: Annotated[int, pydantic.Field(ge=1, le=64)] = pydantic.Field(
        default=1,
        description="With mode blocks: checkpoint every n-th block (1: every block; 2: every other one). "
        "Default 1.",
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
        "within each worker pod, replicated across pods). Default ddp.",
    )
    reshard_after_forward: bool = pydantic.Field(
        default=True,
        description="fsdp/hsdp: free the gathered parameters after the forward pass and gather them again "
        "for the backward pass (less memory); false keeps them until the backward pass (less communication). "
        "Default true.",
    )
    cpu_offload: bool = pydantic.Field(
        default=False,
        description="fsdp/hsdp on GPUs: keep the sharded parameters, gradients and optimizer state in host "
        "memory (the optimizer step runs on the CPU): for models whose state does not fit the GPUs. Default "
        "false.",
    )
    activation_checkpointing: ActivationCheckpointing = pydantic.Field(
        default_factory=ActivationCheckpointing
    )
    """Recompute activations in the backward pass instead of keeping them: less memory for more compute."""

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
    """The fabric between GPUs, which picks the NCCL settings: auto (the default: each worker inspects its
    node at start-up and picks efa, infiniband, roce, nvlink or tcp), nvlink (one node, GPUs joined by
    NVLink/NVSwitch), infiniband (GPUDirect RDMA), roce (RDMA over Ethernet), efa (AWS, through the
    aws-ofi-nccl plugin) or tcp (plain sockets). CPU jobs (gloo) only record it."""
    nccl_env: dict[Annotated[str, pydantic.Field(pattern=NCCL_ENV_KEY_PATTERN)], str] = pydantic.Field(
        default_factory=dict,
        max_length=64,
        description="Explicit NCCL_* (or UCX_/FI_) variables; they win over the profile.",
    )
    probe: bool = pydantic.Field(
        default=True,
        description="Measure the all-reduce bus bandwidth at start-up (a few seconds) into "
        "status.network.allReduceBusBandwidthGBPerSecond. Default true.",
    )
    probe_megabytes: Annotated[int, pydantic.Field(ge=1, le=4096)] = 256
    """Message size of the start-up probe's all-reduces, in MiB (at most 16 on CPU). Larger messages measure
    closer to the fabric's peak bandwidth. Default 256."""


class Reporting(base.ApiModel):
    """How often the trainer reports; never every step (ray.train.report is a barrier across ranks)."""

    every_steps: Annotated[int, pydantic.Field(ge=1)] = 50
    """Rank 0 updates status.progress and the metrics every this many optimizer steps, or after everySeconds,
    whichever comes first. Default 50."""
    every_seconds: Annotated[float, pydantic.Field(gt=0.0)] = 15.0
    """Rank 0 updates status.progress and the metrics at least this often, in seconds, or every everySteps
    steps, whichever comes first. Default 15."""
    metrics_port: Annotated[int, pydantic.Field(ge=1024, le=65535)] = 9090
    """Port of the trainer's Prometheus metrics in each worker pod; a pod with several GPUs serves one per
    GPU, metricsPort + local rank (named metrics, metrics-1, ...). They must avoid Ray's ports 6379, 8080,
    8265 and 10001. Default 9090."""


def _spec_rules() -> list[cel.Rule]:
    """The CEL twins of TrainingJobSpec's validators (same sentences, values filled in)."""
    first = "self.reporting.metricsPort"
    gpus = "self.workers.gpusPerWorker"
    last = f"({first} + ({gpus} > 1 ? {gpus} : 1) - 1)"
    ray_ports = "[" + ", ".join(str(port) for port in RAY_POD_PORTS) + "]"
    users = "{" + ", ".join(f"{port}: {cel.string(user)}" for port, user in RAY_POD_PORTS.items()) + "}"
    clash = f"{ray_ports}.filter(p, {first} <= p && p <= {last})[0]"
    return [
        cel.rule(
            "!has(self.checkpoint.keepBest) || has(self.evaluation) || has(self.workload.entrypoint)",
            KEEP_BEST_NEEDS_EVALUATION,
        ),
        cel.rule(
            "!has(self.workload.rayTrain) || (!has(self.checkpoint.keepBest) && !has(self.evaluation))",
            RAY_TRAIN_EVALUATES_ITSELF,
        ),
        cel.rule("self.precision != 'fp16' || self.workers.gpusPerWorker >= 1", FP16_NEEDS_GPUS),
        cel.rule(
            "!has(self.compileWrapper) || (has(self.compile) && self.compile)",
            COMPILE_WRAPPER_NEEDS_COMPILE.format(wrapper="python/cpp"),
            cel.format(COMPILE_WRAPPER_NEEDS_COMPILE.replace("{wrapper}", "%s"), "self.compileWrapper"),
        ),
        cel.rule(
            "self.parallelism.strategy == 'ddp' || self.precision != 'fp16'",
            FP16_NEEDS_DDP.format(strategy="fsdp/hsdp"),
            cel.format(FP16_NEEDS_DDP.replace("{strategy}", "%s"), "self.parallelism.strategy"),
        ),
        cel.rule("!self.parallelism.cpuOffload || self.workers.gpusPerWorker >= 1", CPU_OFFLOAD_NEEDS_GPUS),
        cel.rule(
            "has(self.workload.model) || type(self.hyperparameters.batchSizePerWorker) == int",
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


KEEP_BEST_NEEDS_EVALUATION = (
    "checkpoint.keepBest ranks checkpoints by an evaluation metric: set spec.evaluation, or remove keepBest"
)
RAY_TRAIN_EVALUATES_ITSELF = (
    "a workload.rayTrain function evaluates and keeps checkpoints itself (ray.train.report and Ray Train's "
    "checkpoints): remove spec.evaluation and checkpoint.keepBest"
)
COMPILE_WRAPPER_NEEDS_COMPILE = (
    "compileWrapper {wrapper} applies only to a compiled model: set compile: true, or remove compileWrapper"
)
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
    "entrypoint or Ray Train function chooses its own batch: set an integer batchSizePerWorker"
)


class TrainingJobSpec(base.ApiModel):
    model_config = pydantic.ConfigDict(json_schema_extra=lambda schema: _with_rules(schema, _spec_rules()))

    image: str = pydantic.Field(default="ghcr.io/trainop/trainer:0.1.0", min_length=1)
    """Container image of every Ray pod, head and workers. It must hold the Ray version of rayVersion, PyTorch
    and the trainop_trainer package, plus any package workload.entrypoint imports. Default
    ghcr.io/trainop/trainer:0.1.0, the trainer image of this trainop release."""
    ray_version: Annotated[str, pydantic.Field(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")] = "2.60.0"
    """The Ray version inside image, as x.y.z; KubeRay configures the Ray cluster for it, so it must match
    the image. Default 2.60.0, the default image's."""
    workload: Workload
    """What to train: a built-in model (workload.model) or your own function (workload.entrypoint), exactly
    one of them, with its dataset and free-form settings."""
    hyperparameters: Hyperparameters
    """Optimisation settings: how long to train (epochs or maxSteps, at least one), batch size, learning rate
    and its schedule, optimizer, gradient accumulation and clipping, seed."""
    precision: Precision = Precision.BF16
    """Numeric precision of the forward and backward passes: bf16 (the default: mixed precision without loss
    scaling, on Ampere-or-newer GPUs and on CPUs), fp16 (GPUs only, with a gradient scaler) or fp32 (no
    mixed precision)."""
    compile: bool = pydantic.Field(
        default=False,
        description="Compile the model with torch.compile: faster steps on GPUs for a compilation of a "
        "minute or more at every start and restart. Default false.",
    )
    compile_wrapper: CompileWrapper | None = pydantic.Field(
        default=None,
        description="How the compiled graphs launch their kernels (with compile: true): python (Inductor's "
        "default) or cpp (Inductor's C++ wrapper: less host time per step, for models whose step the host's "
        "kernel launches limit, such as compiled ResNet-50; its first compilation takes minutes longer). "
        "Unset: Inductor's own setting (python, or the image's TORCHINDUCTOR_CPP_WRAPPER).",
    )
    parallelism: Parallelism = pydantic.Field(default_factory=Parallelism)
    """How the model is spread over the GPUs: ddp (a whole copy per GPU, the default), fsdp (parameters,
    gradients and optimizer state sharded over every GPU) or hsdp (sharded within a worker pod, replicated
    across pods), with activation checkpointing and CPU offload."""
    workers: Workers = pydantic.Field(default_factory=Workers)
    """The worker pods that train: how many, the GPUs, CPUs and memory of each, and where they may run. Sizes
    left unset are fitted to the job (see cpusPerWorker, memoryPerWorker, sharedMemory)."""
    checkpoint: Checkpoint = pydantic.Field(default_factory=Checkpoint)
    """When checkpoints are written, how many are kept and where (a volume or an S3 bucket). Worker
    restarts, new attempts and resumes continue from the newest valid checkpoint."""
    data: DataSource | None = None
    """A read-only dataset at /data in every worker pod: an existing claim, or a prefix of an S3 bucket
    copied there before training. workload.dataset.path, when relative, is inside it; user entrypoints find
    it as ctx.data_dir. Unset (the default): no data volume."""
    failure_policy: FailurePolicy = pydantic.Field(default_factory=FailurePolicy)
    """How failures are retried: worker-group restarts inside an attempt (maxWorkerFailures), then new
    attempts of the whole job (maxRestarts) after an exponential backoff."""
    network: Network = pydantic.Field(default_factory=Network)
    """NCCL set-up between GPU workers: a profile for the fabric, explicit NCCL variables, and an all-reduce
    bandwidth probe at start-up."""
    reporting: Reporting = pydantic.Field(default_factory=Reporting)
    """How often the trainer's rank 0 updates status.progress and its Prometheus metrics, and the port they
    are served on."""
    evaluation: Evaluation | None = None
    """Validation while training: every N steps or epochs on a held-out split (or a separate dataset), with
    loss, top-1/top-5 accuracy for classifiers and perplexity for language models on status.evaluation, as
    metrics and in the tracking backends. Unset: no evaluation."""
    tracking: experiment.Tracking = pydantic.Field(default_factory=experiment.Tracking)
    """Experiment tracking besides the status: an MLflow run per job (every attempt continues it) and
    TensorBoard event files on the checkpoint volume."""
    suspend: bool = False
    """true stops the job: its RayJob and Ray pods are deleted, checkpoints stay on the volume, phase becomes
    Suspended. Setting it back to false starts a new attempt that resumes from the newest checkpoint (not
    counted as a restart). Default false."""
    active_deadline_seconds: Annotated[int, pydantic.Field(ge=1, le=MAX_DURATION_SECONDS)] | None = None
    """Seconds the job may run, counted from status.startTime (the clock restarts when a suspended job
    resumes). When exceeded the job fails with reason DeadlineExceeded. Unset: no limit."""
    ttl_seconds_after_finished: Annotated[int, pydantic.Field(ge=0, le=MAX_DURATION_SECONDS)] | None = None
    """Seconds after the job Succeeded or Failed before the operator deletes it, with the children it owns;
    the checkpoint claim stays unless checkpoint.storage.deleteWithJob is true. Unset: kept until you
    delete it."""

    @pydantic.model_validator(mode="after")
    def _precision_fits_device(self) -> TrainingJobSpec:
        if self.workers.gpus_per_worker == 0 and self.precision == Precision.FP16:
            raise ValueError(FP16_NEEDS_GPUS)
        return self

    @pydantic.model_validator(mode="after")
    def _compile_wrapper_needs_compile(self) -> TrainingJobSpec:
        if self.compile_wrapper is not None and not self.compile:
            raise ValueError(COMPILE_WRAPPER_NEEDS_COMPILE.format(wrapper=self.compile_wrapper.value))
        return self

    @pydantic.model_validator(mode="after")
    def _auto_batch_needs_a_builtin_model(self) -> TrainingJobSpec:
        if self.hyperparameters.batch_size_per_worker == AUTO and self.workload.model is None:
            raise ValueError(AUTO_BATCH_NEEDS_A_BUILTIN_MODEL)
        return self

    @pydantic.model_validator(mode="after")
    def _experiment_fits_the_workload(self) -> TrainingJobSpec:
        if (
            self.checkpoint.keep_best is not None
            and self.evaluation is None
            and self.workload.entrypoint is None
        ):
            raise ValueError(KEEP_BEST_NEEDS_EVALUATION)
        if self.workload.ray_train is not None and (
            self.checkpoint.keep_best is not None or self.evaluation is not None
        ):
            raise ValueError(RAY_TRAIN_EVALUATES_ITSELF)
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
    ("workload", "rayTrain"),
    ("workers", "replicas"),
    ("workers", "gpusPerWorker"),
    ("checkpoint", "storage"),
)


def _with_rules(schema: dict[str, Any], rules: list[cel.Rule]) -> None:
    """json_schema_extra as a function: the rules are built once the models they read exist."""
    schema.setdefault("x-kubernetes-validations", []).extend(rules)


class Progress(base.ApiModel):
    """Written by the trainer's rank 0 only."""

    step: int = 0
    """Optimizer steps done."""
    total_steps: int | None = None
    """Optimizer steps the run takes in all: maxSteps, or epochs x steps per epoch, whichever is smaller."""
    epoch: int = 0
    """The epoch training is in, counted from 0."""
    loss: float | None = None
    """Training loss, the mean over ranks of the last report window."""
    samples_per_second: float | None = None
    """Global throughput of the last report window: samples per second over all ranks (sequences for
    gpt-small/gpt-tiny)."""
    percent: float | None = None
    """step / totalSteps, in percent."""
    eta_seconds: float | None = None
    """Estimated seconds until the last step, at the last window's pace."""
    worker_restarts: int = pydantic.Field(default=0, description="Worker-group restarts inside this attempt.")
    batch_size_per_worker: int | None = pydantic.Field(
        default=None,
        description="The batch each worker trains with (with batchSizePerWorker auto: the finder's choice).",
    )
    learning_rate: float | None = pydantic.Field(
        default=None, description="The learning rate of the last step (schedule and batch rule applied)."
    )
    updated: str | None = None
    """When rank 0 wrote this record (RFC 3339, UTC)."""


class WorkerFailure(base.ApiModel):
    """One failure the trainer saw inside an attempt. Written by the trainer's driver only."""

    attempt: int
    """The attempt it happened in."""
    reason: str
    """Its class (status.failures[].reason names the same classes)."""
    message: str = ""
    """One sentence: what failed and where, e.g. "ValueError: bad shape at model.py:42 (forward)"."""
    rank: int | None = None
    """The rank it happened on, when one rank is to blame."""
    step: int | None = None
    """The optimizer step training was at."""
    time: str
    """When the trainer saw it (RFC 3339, UTC)."""
    restarted: bool = False
    """true: the trainer restarted the workers inside the attempt; false: it ended the attempt."""


class WorkerFailures(base.ApiModel):
    """The trainer's account of failures inside attempts. Written by the trainer's driver only; the
    operator reads it to classify an attempt's end and to count budgets."""

    counts: dict[str, int] = pydantic.Field(default_factory=dict)
    """In-attempt restarts per failure class, over all the job's attempts."""
    last: list[WorkerFailure] = pydantic.Field(default_factory=list, max_length=10)
    """The newest failures, newest first, at most 10."""


class Goodput(base.ApiModel):
    """Productive training time over wall time, computed by the operator (docs/operator.md, "Goodput")."""

    ratio: float
    """productiveSeconds / wallSeconds, between 0 and 1."""
    productive_seconds: float
    """status.progress.step optimizer steps at the measured step time: the training the job kept."""
    wall_seconds: float
    """Seconds since startTime (to completionTime once finished): start-up, restarts, stalls and steps
    recomputed after a failure are the difference."""


class CheckpointStatus(base.ApiModel):
    """Written by the trainer's rank 0 only."""

    step: int
    """The optimizer step the checkpoint was taken after; training resumes from the step after it."""
    epoch: int = 0
    """The epoch of that step, counted from 0."""
    path: str
    """Where the checkpoint is: /checkpoints/<run>/checkpoints/step_<N> on the checkpoint volume, as the Ray
    pods see it, or s3://<bucket>/<prefix>/<run>/checkpoints/step_<N>."""
    time: str
    """When the checkpoint was complete on the volume (RFC 3339, UTC)."""
    metrics: dict[str, float] = pydantic.Field(default_factory=dict)
    """Metrics at that step, e.g. loss."""
    best: experiment.BestCheckpoint | None = None
    """With checkpoint.keepBest: the best checkpoint so far (step, metric, value, path)."""


class StorageStatus(base.ApiModel):
    """Written by the trainer's driver when an attempt starts, before any worker: whether the checkpoint
    storage can be written with the credentials the pods have. The operator's StorageReady condition reads
    it for object storage."""

    location: str
    """Where this job's checkpoints go: /checkpoints/<run> on the volume, or s3://<bucket>/<prefix>/<run>."""
    ready: bool
    """Whether a test object could be written, read back and deleted there."""
    reason: str
    """In one CamelCase word: Writable, or why not (BucketNotFound, AccessDenied, CredentialsMissing,
    EndpointUnreachable, StorageError)."""
    message: str
    """One sentence: what was found, and what to do about it."""
    attempt: int
    """The attempt whose driver checked."""
    checked: str
    """When it was checked (RFC 3339, UTC)."""


class NetworkStatus(base.ApiModel):
    """Written by the trainer's rank 0 only."""

    profile: str
    """The network profile in effect: spec.network.profile, or what auto resolved to on the workers' nodes."""
    backend: str | None = None
    """The torch.distributed backend: nccl on GPUs, gloo on CPUs."""
    # Explicit alias: to_camel would give "...GbPerSecond"; the wire name spells the unit (GB/s) exactly.
    all_reduce_bus_bandwidth_gb_per_second: float | None = pydantic.Field(
        default=None,
        alias="allReduceBusBandwidthGBPerSecond",
        description="All-reduce bus bandwidth measured at start-up, in GB/s (gigabytes per second, 1e9 "
        "bytes/s; nccl-tests' busbw). Renamed in v1alpha1, without a conversion, from a name that read as "
        "gigabits per second; the value and its unit did not change.",
    )
    probe_bytes: int | None = None
    """Message size of the start-up all-reduce probe, in bytes."""
    world_size: int | None = None
    """Ranks that took part in the probe: the job's DDP world size."""
    measured: str | None = None
    """When the probe ran (RFC 3339, UTC)."""


class TrainingJobOperatorStatus(operator_status.OperatorStatus):
    """The operator's part of a TrainingJob's status: every kind's, and the sizes its columns show."""

    workers: int | None = None
    """Worker pods of the job (spec.workers.replicas), shown by kubectl get."""
    gpus: int | None = None
    """GPUs the job uses in all (replicas x gpusPerWorker), shown by kubectl get."""
    goodput: Goodput | None = None
    """Productive training time over wall time since the job started, updated by the operator on each of
    its reconciles once the trainer reports a step time."""


class TrainingJobStatus(TrainingJobOperatorStatus):
    # Trainer-owned (rank 0; storage: the driver); everything above is the operator's.
    progress: Progress | None = None
    """Training progress, written by the trainer's rank 0 every reporting interval."""
    checkpoint: CheckpointStatus | None = None
    """The newest checkpoint, written by the trainer's rank 0 after each complete write."""
    storage: StorageStatus | None = None
    """Whether the checkpoint storage was writable when the current attempt started, written by the
    trainer's driver."""
    worker_failures: WorkerFailures | None = None
    """Failures the trainer saw inside attempts (in-attempt restarts and the failure that ended an
    attempt), by class, written by the trainer's driver."""
    network: NetworkStatus | None = None
    """The network the trainer found and the all-reduce bandwidth it measured at start-up, written by
    rank 0."""
    evaluation: experiment.EvaluationStatus | None = None
    """The last evaluation (spec.evaluation), written by the trainer's rank 0."""
    profile: experiment.ProfileStatus | None = None
    """The outcome of the last trainop.dev/profile annotation: state and where the traces are."""
    communication: experiment.CommunicationStatus | None = None
    """The last communication report (trainop.dev/communication-report annotation): bus bandwidth of
    all-reduce, all-gather and broadcast at several sizes."""
    cost: experiment.CostStatus | None = None
    """GPU-hours, estimated cost and idle GPU time, updated by the trainer's rank 0 at every report."""
    tracking: experiment.TrackingStatus | None = None
    """The MLflow run and TensorBoard directory of this job."""


class TrainingJob(base.ApiModel):
    """Distributed PyTorch training on Ray: the operator runs it as a KubeRay RayJob (a Ray head and
    spec.workers.replicas worker pods), with checkpoints on a volume, restarts that resume from the newest
    checkpoint, and progress on the status. `trainop render` prints the objects a manifest creates."""

    api_version: Literal["trainop.dev/v1alpha1"] = "trainop.dev/v1alpha1"
    """The API group and version: trainop.dev/v1alpha1."""
    kind: Literal["TrainingJob"] = "TrainingJob"
    """The object's kind: TrainingJob."""
    metadata: base.ObjectMeta
    """The object's metadata; the name is at most 40 characters (child names add suffixes)."""
    spec: TrainingJobSpec
    """What to train and how: the desired state, written by you."""
    status: TrainingJobStatus | None = None
    """What happened, written by the operator and by the trainer's rank 0."""
