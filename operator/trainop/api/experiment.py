"""The experiment around a run: evaluation, the best checkpoint, tracking, profiling and cost (API models).

Spec fragments (written by the user; ``spec.evaluation`` is ``trainingjob.Evaluation``, next to the
``Dataset`` it may name): ``KeepBest``
(``spec.checkpoint.keepBest``), ``Tracking`` (``spec.tracking``: MLflow and TensorBoard). Status records
(written by the trainer's rank 0, or by the Ray Train callback for ``workload.rayTrain``):
``EvaluationStatus``, ``BestCheckpoint``, ``ProfileStatus``, ``CommunicationStatus``, ``CostStatus``,
``TrackingStatus``. The annotations a user puts on a running job to ask for a profile or a communication
report are named here too, so the trainer and the docs use one spelling.

Kept apart from ``trainingjob`` (which imports it) because these fields describe what is measured and
recorded about a run, not how it trains. Like every API module, it must not import anything heavier than
pydantic.
"""

from __future__ import annotations

import enum
from typing import Annotated

import pydantic

from trainop.api import base, cel

# A user asks a running job for a torch profiler window of N steps on every rank.
PROFILE_ANNOTATION = "trainop.dev/profile"
# A user asks a running job for a one-off communication report (any new value asks again).
COMMUNICATION_REPORT_ANNOTATION = "trainop.dev/communication-report"
# The price of one GPU-hour for this job (overrides the chart's cost.pricePerGpuHour).
PRICE_ANNOTATION = "trainop.dev/price-per-gpu-hour"
MAX_PROFILE_STEPS = 100
METRIC_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_./-]*$"


class BestMode(enum.StrEnum):
    MIN = "min"
    MAX = "max"


class KeepBest(base.ApiModel):
    """Keep the best checkpoint by an evaluation metric, apart from the rolling keepLast ones."""

    metric: Annotated[str, pydantic.Field(pattern=METRIC_NAME_PATTERN, max_length=64)]
    """The evaluation metric that ranks checkpoints, as status.evaluation.metrics names it: loss, accuracy,
    top5Accuracy, perplexity, or a key your evaluate hook returns."""
    mode: BestMode
    """min (lower is better, e.g. loss) or max (higher is better, e.g. accuracy)."""


class SecretKeyRef(base.ApiModel):
    """A key of a Secret in the job's namespace."""

    name: Annotated[
        str, pydantic.Field(max_length=base.MAX_DNS_SUBDOMAIN, pattern=base.DNS_SUBDOMAIN_PATTERN)
    ]
    """The Secret's name."""
    key: Annotated[str, pydantic.Field(max_length=253, pattern=base.SECRET_KEY_PATTERN)]
    """The key inside the Secret whose value is used."""


class MlflowTracking(base.ApiModel):
    """An MLflow tracking server: one MLflow run per job, continued by every attempt."""

    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel.rule(
                    "has(self.trackingUri) != has(self.trackingUriSecret)",
                    "set exactly one of tracking.mlflow.trackingUri or tracking.mlflow.trackingUriSecret",
                )
            ]
        }
    )

    tracking_uri: Annotated[str, pydantic.Field(min_length=1, max_length=2048)] | None = None
    """The tracking server's URI as the Ray pods reach it, e.g. http://mlflow.mlops:5000. Set trackingUri or
    trackingUriSecret."""
    tracking_uri_secret: SecretKeyRef | None = None
    """A Secret key holding the tracking URI (for URIs with credentials); the operator passes it to the Ray
    pods as MLFLOW_TRACKING_URI."""
    experiment: Annotated[str, pydantic.Field(min_length=1, max_length=256)] = pydantic.Field(
        default="trainop",
        description="The MLflow experiment the job's run is created in (created when missing). Default "
        "trainop.",
    )

    @pydantic.model_validator(mode="after")
    def _exactly_one_uri(self) -> MlflowTracking:
        if (self.tracking_uri is None) == (self.tracking_uri_secret is None):
            raise ValueError(
                "set exactly one of tracking.mlflow.trackingUri or tracking.mlflow.trackingUriSecret"
            )
        return self


class Tracking(base.ApiModel):
    """Where a run's parameters and metrics are recorded besides the status: MLflow and TensorBoard."""

    mlflow: MlflowTracking | None = None
    """Record parameters (the resolved spec), metrics at every report and evaluation, the best and final
    checkpoints (as references) and tags (job, attempt, image) in MLflow. Unset: no MLflow."""
    tensorboard: bool = pydantic.Field(
        default=False,
        description="Write TensorBoard event files (training and evaluation scalars) to "
        "<run>/tensorboard on the checkpoint volume (docs/trainer.md says how to view them). Default false.",
    )


# ------------------------------------------------------------------------------------------ status records
class EvaluationStatus(base.ApiModel):
    """Written by the trainer's rank 0 after every evaluation."""

    step: int
    """The optimizer step the model was evaluated after."""
    epoch: int = 0
    """The epoch of that step, counted from 0."""
    metrics: dict[str, float] = pydantic.Field(default_factory=dict)
    """The evaluation's metrics: loss, and accuracy and top5Accuracy for classifiers or perplexity for
    language models (or what the evaluate hook returned)."""
    samples: int | None = None
    """Samples evaluated, over all ranks."""
    time: str
    """When the evaluation finished (RFC 3339, UTC)."""


class BestCheckpoint(base.ApiModel):
    """The checkpoint kept by checkpoint.keepBest."""

    step: int
    """The optimizer step of the best checkpoint."""
    metric: str
    """The metric it is best by (checkpoint.keepBest.metric)."""
    value: float
    """The metric's value at that step."""
    path: str
    """The checkpoint's directory as the Ray pods see it; it is never pruned by keepLast."""


class ProfileState(enum.StrEnum):
    RECORDING = "Recording"
    COMPLETED = "Completed"
    FAILED = "Failed"


class ProfileStatus(base.ApiModel):
    """The outcome of the last trainop.dev/profile annotation."""

    request: str
    """The annotation's value that asked for this profile (the number of steps)."""
    state: ProfileState
    """Recording (the window is open), Completed (traces written) or Failed (see message)."""
    steps: int
    """Optimizer steps recorded."""
    start_step: int | None = None
    """The first step recorded."""
    path: str | None = None
    """The directory of the traces: one Chrome trace (JSON, open in Perfetto or chrome://tracing) per rank,
    on the checkpoint volume."""
    message: str = ""
    """What happened, in one sentence."""
    time: str
    """When the state was reached (RFC 3339, UTC)."""


class CollectiveResult(base.ApiModel):
    """One collective at one message size."""

    op: str
    """all_reduce, all_gather or broadcast."""
    bytes: int
    """Message size in bytes (the tensor each rank contributes; all_gather's output is world size times
    larger)."""
    seconds: float
    """Mean time of one collective, the slowest rank's."""
    bus_bandwidth_gb_per_second: float = pydantic.Field(
        alias="busBandwidthGBPerSecond",
        description="nccl-tests' bus bandwidth in GB/s (1e9 bytes/s): comparable across ops and world sizes.",
    )


class CommunicationStatus(base.ApiModel):
    """The last communication report (trainop.dev/communication-report)."""

    request: str
    """The annotation's value that asked for it."""
    backend: str
    """nccl or gloo."""
    world_size: int
    """Ranks that took part."""
    results: list[CollectiveResult] = pydantic.Field(default_factory=list)
    """Every op at every size."""
    path: str | None = None
    """The report as JSON on the checkpoint volume."""
    time: str
    """When the report finished (RFC 3339, UTC)."""


class CostStatus(base.ApiModel):
    """What the run has used: GPU time, its price, and the share of it spent not training."""

    gpus: int
    """GPUs of the job (replicas x gpusPerWorker); 0 for a CPU job, whose GPU-hours and cost are 0."""
    allocated_seconds: float
    """Seconds the job's Ray workers have existed, over every attempt: from the start of each attempt's
    trainer to its end."""
    training_seconds: float
    """Seconds of those spent in training steps (including evaluation and checkpoint stalls)."""
    idle_seconds: float
    """allocatedSeconds - trainingSeconds: start-up, worker restarts, waits and stalls."""
    gpu_hours: float
    """gpus x allocatedSeconds / 3600."""
    idle_gpu_hours: float
    """gpus x idleSeconds / 3600: GPUs allocated but not training."""
    price_per_gpu_hour: float | None = None
    """The price used: the job's trainop.dev/price-per-gpu-hour annotation, else the chart's
    cost.pricePerGpuHour. Unset: no estimate."""
    currency: str | None = None
    """The price's currency (the chart's cost.currency)."""
    estimated_cost: float | None = None
    """gpuHours x pricePerGpuHour."""
    updated: str
    """When rank 0 computed this record (RFC 3339, UTC)."""


class TrackingStatus(base.ApiModel):
    """Where this run is recorded."""

    mlflow_run_id: str | None = None
    """The MLflow run of this job (every attempt continues it)."""
    mlflow_experiment_id: str | None = None
    """The MLflow experiment holding that run."""
    tensorboard_log_dir: str | None = None
    """The TensorBoard event files' directory on the checkpoint volume."""
