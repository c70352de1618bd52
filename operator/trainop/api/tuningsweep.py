"""The TuningSweep API (trainop.dev/v1alpha1): a TrainingJob template searched over by Ray Tune.

A sweep is one RayJob whose driver runs Ray Tune; every trial is a TorchTrainer run of the packaged
trainer built from ``spec.template`` with the sampled parameters written into it. Parameter names are
dotted paths into the template (``hyperparameters.learningRate``) or NCCL variables
(``nccl.NCCL_ALGO``), so one sweep can tune the optimiser and the network alike.
"""

from __future__ import annotations

import enum
import re
from typing import Annotated, Any, Literal

import pydantic

from trainop.api import base, operator_status, trainingjob

MAX_DURATION = trainingjob.MAX_DURATION_SECONDS

PARAMETER_NAME_PATTERN = r"^(nccl\.(NCCL|TORCH_NCCL)_[A-Z0-9_]+|[a-z][A-Za-z0-9]*(\.[a-z][A-Za-z0-9]*)+)$"


class DistributionKind(enum.StrEnum):
    UNIFORM = "uniform"
    LOGUNIFORM = "loguniform"
    RANDINT = "randint"
    CHOICE = "choice"
    GRID = "grid"


class Algorithm(enum.StrEnum):
    RANDOM = "random"
    GRID = "grid"
    OPTUNA = "optuna"


class Mode(enum.StrEnum):
    MIN = "min"
    MAX = "max"


class Distribution(base.ApiModel):
    """One dimension of the search space."""

    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                # `values` holds untyped items, which CEL cannot see, so "choice and grid need values"
                # is checked by the models (trainop validate, and the operator on admission) only.
                {
                    "rule": "self.type in ['choice', 'grid'] || "
                    "(has(self.lower) && has(self.upper) && self.lower < self.upper)",
                    "message": "uniform, loguniform and randint need lower < upper",
                },
                {
                    "rule": "self.type != 'loguniform' || (has(self.lower) && self.lower > 0.0)",
                    "message": "loguniform needs lower > 0",
                },
            ]
        }
    )

    type: DistributionKind
    lower: float | None = None
    upper: float | None = None
    values: (
        Annotated[
            list[
                Annotated[
                    Any, pydantic.Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})
                ]
            ],
            pydantic.Field(min_length=1, max_length=1000),
        ]
        | None
    ) = None

    @pydantic.model_validator(mode="after")
    def _bounds(self) -> Distribution:
        if self.type in (DistributionKind.CHOICE, DistributionKind.GRID):
            if not self.values:
                raise ValueError(f"{self.type.value} needs a non-empty values list")
        else:
            if self.lower is None or self.upper is None or not self.lower < self.upper:
                raise ValueError(f"{self.type.value} needs lower < upper")
            if self.type == DistributionKind.LOGUNIFORM and self.lower <= 0:
                raise ValueError("loguniform needs lower > 0")
        return self


class Objective(base.ApiModel):
    metric: Annotated[str, pydantic.Field(min_length=1)] = "loss"
    mode: Mode = Mode.MIN
    goal: float | None = pydantic.Field(
        default=None, description="End the sweep as soon as a trial reaches this value."
    )


class Scheduler(base.ApiModel):
    type: Literal["asha", "none"] = "asha"
    grace_period: Annotated[int, pydantic.Field(ge=1)] = 1
    max_t: Annotated[int, pydantic.Field(ge=1)] = 100
    reduction_factor: Annotated[float, pydantic.Field(gt=1.0)] = 3.0

    @pydantic.model_validator(mode="after")
    def _grace_within_max(self) -> Scheduler:
        if self.type == "asha" and self.grace_period > self.max_t:
            raise ValueError("scheduler.gracePeriod must not exceed scheduler.maxT")
        return self


class TuningSweepSpec(base.ApiModel):
    template: trainingjob.TrainingJobSpec
    search_space: Annotated[
        dict[Annotated[str, pydantic.Field(pattern=PARAMETER_NAME_PATTERN)], Distribution],
        pydantic.Field(min_length=1, max_length=32),
    ]
    objective: Objective = pydantic.Field(default_factory=Objective)
    algorithm: Algorithm = Algorithm.RANDOM
    seed: Annotated[int, pydantic.Field(ge=0, le=trainingjob.MAX_SEED)] | None = None
    scheduler: Scheduler = pydantic.Field(default_factory=Scheduler)
    num_trials: Annotated[int, pydantic.Field(ge=1, le=10000)] = 8
    max_concurrent_trials: Annotated[int, pydantic.Field(ge=1, le=1024)] = 2
    max_failed_trials: Annotated[int, pydantic.Field(ge=0)] = 2
    suspend: bool = False
    active_deadline_seconds: Annotated[int, pydantic.Field(ge=1, le=MAX_DURATION)] | None = None
    ttl_seconds_after_finished: Annotated[int, pydantic.Field(ge=0, le=MAX_DURATION)] | None = None

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> TuningSweepSpec:
        for name in self.search_space:
            if not name.startswith("nccl.") and not _template_has_path(name):
                raise ValueError(
                    f"searchSpace key {name!r} is not a field of the template: use a dotted path such as "
                    "hyperparameters.learningRate or nccl.NCCL_ALGO"
                )
        if self.algorithm == Algorithm.GRID:
            bad = [k for k, d in self.search_space.items() if d.type != DistributionKind.GRID]
            if bad:
                raise ValueError(f"algorithm grid needs every searchSpace entry to be type grid; not: {bad}")
            if self.num_trials != self.grid_size:
                raise ValueError(
                    f"numTrials must be {self.grid_size} with algorithm grid (one trial per grid point)"
                )
        elif any(d.type == DistributionKind.GRID for d in self.search_space.values()):
            raise ValueError("searchSpace type grid needs algorithm grid")
        return self

    @property
    def grid_size(self) -> int:
        size = 1
        for distribution in self.search_space.values():
            if distribution.type == DistributionKind.GRID and distribution.values:
                size *= len(distribution.values)
        return size


# Fields that cannot change while a sweep exists: a new attempt restores the Ray Tune experiment, whose
# searcher state and trial checkpoints were made for these values.
IMMUTABLE_FIELDS: tuple[tuple[str, ...], ...] = (
    ("searchSpace",),
    ("objective",),
    ("algorithm",),
    *(("template", *path) for path in trainingjob.IMMUTABLE_FIELDS),
)


def _template_has_path(dotted: str) -> bool:
    """True when ``dotted`` (camelCase, as in a manifest) names a scalar field of TrainingJobSpec."""
    model: type[pydantic.BaseModel] = trainingjob.TrainingJobSpec
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", part).lower()
        field = model.model_fields.get(snake)
        if field is None:
            return False
        annotation = field.annotation
        nested = _model_in(annotation)
        if i == len(parts) - 1:
            return nested is None
        if nested is None:
            return False
        model = nested
    return False


def _model_in(annotation: Any) -> type[pydantic.BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


class TrialCounts(base.ApiModel):
    total: int = 0
    pending: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    early_stopped: int = 0


class BestTrial(base.ApiModel):
    id: str
    parameters: dict[str, Any] = pydantic.Field(
        default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    metric: str
    value: float
    checkpoint: str | None = None


class TuningSweepStatus(operator_status.OperatorStatus):
    # Driver-owned; everything in OperatorStatus is the operator's.
    trials: TrialCounts | None = None
    best_trial: BestTrial | None = None
    updated: str | None = None


class TuningSweep(base.ApiModel):
    api_version: Literal["trainop.dev/v1alpha1"] = "trainop.dev/v1alpha1"
    kind: Literal["TuningSweep"] = "TuningSweep"
    metadata: base.ObjectMeta
    spec: TuningSweepSpec
    status: TuningSweepStatus | None = None
