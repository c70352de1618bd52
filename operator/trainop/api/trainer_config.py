"""The trainer's config: what the operator (or local mode) hands the packaged trainer.

It is the TrainingJob spec itself plus the runtime facts only the launcher knows (run name, storage
path, attempt, where to report status). The operator renders it as JSON into the job's ConfigMap; local
mode writes the same JSON to ./.trainop/<name>/. The trainer reads it with ``load`` and never parses a
manifest itself, so there is exactly one schema for both.

Environment overrides (documented for the e2e stand-in and for users running the trainer by hand):
``TRAINOP_CONFIG`` is the config file path, ``TRAINOP_STORAGE_PATH`` replaces ``storagePath``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pathlib
from collections.abc import Mapping
from typing import Literal

import pydantic

from trainop.api import base, experiment, resources, trainingjob, tuningsweep

log = logging.getLogger(__name__)

CONFIG_ENV = "TRAINOP_CONFIG"
STORAGE_PATH_ENV = "TRAINOP_STORAGE_PATH"
DEFAULT_CONFIG_PATH = "/etc/trainop/trainer.json"
CONFIG_KEY = "trainer.json"
# Where the operator mounts the checkpoint claim in every Ray pod.
CHECKPOINT_MOUNT_PATH = "/checkpoints"
# Where every worker pod sees spec.data: the claim (read-only), or the pod-local copy of an S3 prefix.
DATA_MOUNT_PATH = "/data"
DATA_DIR_ENV = "TRAINOP_DATA_DIR"
# Object storage credentials. The Secret an S3Bucket's credentialsSecret names holds these keys (the AWS
# SDKs' own environment names, so the same Secret serves other tools); the operator hands them to every Ray
# container as environment variables prefixed by their use (s3_env), since a job may write checkpoints
# and read data with different credentials. The trainer never sees them in the config or the status.
S3_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
S3_REQUIRED_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
S3Use = Literal["CHECKPOINT", "DATA"]
S3_CHECKPOINT: S3Use = "CHECKPOINT"
S3_DATA: S3Use = "DATA"
# Ray Train settings of every trainop run, in the environment of every Ray process (the operator puts them
# on every Ray container; the trainer's driver sets them before a local Ray starts). Ray Train's
# preemption watcher is off: it lets a training function ask ray.train.get_preemption_info() about node
# drains, which the trainer never does (a preempted worker pod gets SIGTERM through its preStop hook and
# checkpoints); the tests run without it; and every start of it logs an error-level line ("PreemptionWatcher
# ... has constructor arguments in the object store and max_restarts > 0").
RAY_TRAIN_ENV = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}

#: Warm spare workers (trainop_trainer.restart_policy.WarmSpares): "1" on a TrainingJob's Ray pods, where
#: the Ray cluster is the job's own. Unset elsewhere (a sweep's trials share one cluster; so do tests).
WARM_SPARES_ENV = "TRAINOP_WARM_SPARES"
#: Read by each raylet when it starts: every Python worker it starts imports these first (Ray's
#: ``preload_python_modules`` system setting), so that a spare is ready to run a Train worker at once.
PRELOAD_ENV = "RAY_preload_python_modules"
PRELOAD_MODULES = "torch,ray.train.torch,trainop_trainer.runtime"
#: With the preload list, the raylet would also prestart, preloaded, the idle workers it starts for a new
#: job's first driver (up to one per CPU of the node: gigabytes on a GPU node, for nothing the spares do not
#: do better). Off: only the spares wait preloaded.
PRESTART_FIRST_DRIVER_ENV = "RAY_prestart_worker_first_driver"


def spare_raylet_env() -> dict[str, str]:
    """The raylet's environment where warm spares are kept: preload, and no other preloaded idle workers."""
    return {PRELOAD_ENV: PRELOAD_MODULES, PRESTART_FIRST_DRIVER_ENV: "0"}


def warm_spares_enabled() -> bool:
    """Whether this process's Ray cluster is a TrainingJob's own (``WARM_SPARES_ENV`` is "1")."""
    return os.environ.get(WARM_SPARES_ENV, "") == "1"


def s3_env(use: S3Use, key: str) -> str:
    """The container variable of one Secret key for one use, e.g. ``TRAINOP_CHECKPOINT_AWS_ACCESS_KEY_ID``."""
    return f"TRAINOP_{use}_{key}"


def s3_secret_name_env(use: S3Use) -> str:
    """The container variable naming the credentials Secret (its name only), so that the trainer knows the
    keys must be there and can name the Secret when they are not."""
    return f"TRAINOP_{use}_S3_CREDENTIALS_SECRET"


def s3_uri(bucket: trainingjob.S3Bucket) -> str:
    """``s3://<bucket>[/<prefix>]``."""
    return f"s3://{bucket.bucket}" + (f"/{bucket.prefix}" if bucket.prefix else "")


def storage_path_for(spec: trainingjob.TrainingJobSpec) -> str:
    """The storage path of a job in a cluster: its checkpoint bucket's ``s3://`` URI, or the claim's mount."""
    s3 = spec.checkpoint.storage.s3
    return s3_uri(s3) if s3 is not None else CHECKPOINT_MOUNT_PATH


class StatusTarget(base.ApiModel):
    """The custom resource whose status the trainer's rank 0 patches (progress/checkpoint/network)."""

    group: str = base.GROUP
    version: str = base.VERSION
    plural: Literal["trainingjobs", "tuningsweeps"] = "trainingjobs"
    namespace: str
    name: str


# The operator's price of one GPU-hour (the chart's cost.pricePerGpuHour and cost.currency put these in
# the operator's environment); a job's trainop.dev/price-per-gpu-hour annotation wins.
PRICE_ENV = "TRAINOP_PRICE_PER_GPU_HOUR"
CURRENCY_ENV = "TRAINOP_CURRENCY"
DEFAULT_CURRENCY = "USD"


class Pricing(base.ApiModel):
    """What one GPU-hour of this job costs, for status.cost (``trainop_trainer.cost``)."""

    price_per_gpu_hour: float | None = pydantic.Field(
        default=None, ge=0.0, description="Unset: GPU-hours are counted, no cost is estimated."
    )
    currency: str = DEFAULT_CURRENCY
    source: str = pydantic.Field(default="", description="Where the price came from, for people.")


def pricing_for(job: trainingjob.TrainingJob) -> Pricing:
    """The job's ``trainop.dev/price-per-gpu-hour`` annotation, else the operator's environment (chart
    values), else no price. A malformed annotation is ignored in favour of the chart's price, and a
    malformed environment value means no price: cost is an estimate and must never stop a job. Both are
    reported -- the annotation by the caller (``price_annotation_problem``: a Warning Event), the
    environment's here (a log line)."""
    currency = os.environ.get(CURRENCY_ENV) or DEFAULT_CURRENCY
    raw = job.metadata.annotations.get(experiment.PRICE_ANNOTATION)
    price = _price(raw) if raw is not None else None
    if price is not None:
        return Pricing(
            price_per_gpu_hour=price,
            currency=currency,
            source=f"annotation {experiment.PRICE_ANNOTATION}",
        )
    env = os.environ.get(PRICE_ENV)
    if env:
        env_price = _price(env)
        if env_price is not None:
            return Pricing(
                price_per_gpu_hour=env_price, currency=currency, source="chart cost.pricePerGpuHour"
            )
        log.warning(
            "%s is %r, not a price: set the chart's cost.pricePerGpuHour to a plain non-negative number "
            "such as 2.5 (or empty for no estimate); no cost is estimated meanwhile.",
            PRICE_ENV,
            env,
        )
    return Pricing(currency=currency)


def price_annotation_problem(annotations: Mapping[str, str]) -> str | None:
    """One sentence naming the job's malformed ``trainop.dev/price-per-gpu-hour`` annotation and its fix
    (for a Warning Event); None when the annotation is absent or a price."""
    raw = annotations.get(experiment.PRICE_ANNOTATION)
    if raw is None or _price(raw) is not None:
        return None
    return (
        f"Annotation {experiment.PRICE_ANNOTATION} is {raw!r}, not a price: write a plain non-negative "
        "number such as 2.50 (no currency sign; the currency is the chart's cost.currency); until then "
        "status.cost uses the chart's cost.pricePerGpuHour, if set."
    )


def _price(raw: str) -> float | None:
    """A price per GPU-hour: a finite, non-negative number; None for anything else."""
    try:
        price = float(raw)
    except ValueError:
        return None
    return price if math.isfinite(price) and price >= 0.0 else None


class TrainerConfig(base.ApiModel):
    job_name: str
    run_name: str = pydantic.Field(
        description="Ray Train run name; the same for every attempt so they resume."
    )
    storage_path: str = pydantic.Field(
        description="Ray Train storage path: the checkpoint volume's directory, or s3://<bucket>/<prefix> "
        "(connection settings from spec.checkpoint.storage.s3)."
    )
    attempt: int = 1
    spec: trainingjob.TrainingJobSpec
    status_target: StatusTarget | None = pydantic.Field(
        default=None, description="Set in a cluster; None in local mode (status goes to the terminal)."
    )
    pricing: Pricing = pydantic.Field(default_factory=Pricing)
    tracking_parent_run_id: str | None = pydantic.Field(
        default=None, description="A sweep's MLflow parent run: a trial's run becomes its child."
    )

    @property
    def failure_policy(self) -> trainingjob.FailurePolicy:
        """The job's failure policy (stallTimeoutSeconds, the per-class budgets, maxWorkerFailures): the
        spec's own, so the trainer and the operator read one definition. The operator's share of each
        budget (status.restartsByReason) is on the job's status, not here: it changes during the attempt's
        life only when a new attempt starts, and the driver reads the status anyway."""
        return self.spec.failure_policy


class SweepConfig(base.ApiModel):
    """What the operator hands a TuningSweep's driver (``python -m trainop_trainer.sweep``).

    The full sweep spec plus the same runtime facts as :class:`TrainerConfig`: the Ray Tune experiment
    name is stable across attempts so a new attempt restores the experiment from ``storage_path``.
    """

    sweep_name: str
    experiment_name: str = pydantic.Field(
        description="Ray Tune experiment name; the same for every attempt so Tuner.restore resumes it."
    )
    storage_path: str = pydantic.Field(description="Ray Tune storage path (the checkpoint volume).")
    attempt: int = 1
    spec: tuningsweep.TuningSweepSpec
    status_target: StatusTarget | None = pydantic.Field(
        default=None, description="Set in a cluster; None in local mode (status goes to the terminal)."
    )


def run_name_for(job_name: str) -> str:
    """The stable Ray Train run name: every attempt of a job (and a re-created job) resumes the same run."""
    return job_name


def for_job(
    job: trainingjob.TrainingJob, *, storage_path: str, attempt: int, in_cluster: bool
) -> TrainerConfig:
    """The config of one attempt. The workers' sizes are written out (``resources.resolved``): the Ray
    resources the trainer asks for must be the pod's, whatever defaults the trainer image has."""
    target = None
    if in_cluster:
        target = StatusTarget(namespace=job.metadata.namespace or "default", name=job.metadata.name)
    return TrainerConfig(
        job_name=job.metadata.name,
        run_name=run_name_for(job.metadata.name),
        storage_path=storage_path,
        attempt=attempt,
        spec=resources.resolved(job.spec),
        status_target=target,
        pricing=pricing_for(job),
    )


def for_sweep(
    sweep: tuningsweep.TuningSweep, *, storage_path: str, attempt: int, in_cluster: bool
) -> SweepConfig:
    target = None
    if in_cluster:
        target = StatusTarget(
            plural="tuningsweeps", namespace=sweep.metadata.namespace or "default", name=sweep.metadata.name
        )
    return SweepConfig(
        sweep_name=sweep.metadata.name,
        experiment_name=run_name_for(sweep.metadata.name),
        storage_path=storage_path,
        attempt=attempt,
        spec=sweep.spec.model_copy(update={"template": resources.resolved(sweep.spec.template)}),
        status_target=target,
    )


def dumps(config: TrainerConfig | SweepConfig) -> str:
    """The config as JSON. The runtime facts (names, storage path, attempt, status target) are always
    written; the spec without the fields left at their defaults, so that a trainer image older than the
    operator still loads it: its models refuse unknown fields, and a field added to the API later is only
    sent when a job sets it (then the old image's refusal names that field). ``load`` restores the
    defaults, so ``load(dumps(c)) == c``."""
    data = config.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["spec"] = config.spec.model_dump(
        mode="json", by_alias=True, exclude_none=True, exclude_defaults=True
    )
    return json.dumps(data, indent=2, sort_keys=True)


def load(path: str | os.PathLike[str] | None = None) -> TrainerConfig:
    """Read the config from ``path``, else $TRAINOP_CONFIG, else the in-cluster default path."""
    resolved = pathlib.Path(path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH)
    # Rendered by the operator from the spec it accepted (base.ACCEPTED).
    config = TrainerConfig.model_validate_json(
        resolved.read_text(), by_alias=True, by_name=False, context=base.ACCEPTED_BEFORE
    )
    storage_override = os.environ.get(STORAGE_PATH_ENV)
    if storage_override:
        config = config.model_copy(update={"storage_path": storage_override})
    return config


def load_sweep(path: str | os.PathLike[str] | None = None) -> SweepConfig:
    """Read a sweep driver's config, with the same path and environment rules as :func:`load`."""
    resolved = pathlib.Path(path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH)
    # Rendered by the operator from the spec it accepted (base.ACCEPTED).
    config = SweepConfig.model_validate_json(
        resolved.read_text(), by_alias=True, by_name=False, context=base.ACCEPTED_BEFORE
    )
    storage_override = os.environ.get(STORAGE_PATH_ENV)
    if storage_override:
        config = config.model_copy(update={"storage_path": storage_override})
    return config
