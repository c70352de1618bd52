"""The TuningSweep API (trainop.dev/v1alpha1): a TrainingJob template searched over by Ray Tune.

A sweep is one RayJob whose driver runs Ray Tune; every trial is a TorchTrainer run of the packaged
trainer built from ``spec.template`` with the sampled parameters written into it. Parameter names are
dotted paths into the template (``hyperparameters.learningRate``) or NCCL variables
(``nccl.NCCL_ALGO``), so one sweep can tune the optimiser and the network alike.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

import pydantic

from trainop.api import base, cel, trainingjob

MAX_DURATION = trainingjob.MAX_DURATION_SECONDS

PARAMETER_NAME_PATTERN = r"^(nccl\.(NCCL|TORCH_NCCL)_[A-Z0-9_]+|[a-z][A-Za-z0-9]*(\.[a-z][A-Za-z0-9]*)+)$"


GRACE_ABOVE_MAX_T = "scheduler.gracePeriod must not exceed scheduler.maxT"
GRID_NEEDS_GRID_ALGORITHM = "searchSpace type grid needs algorithm grid"
MAX_SEARCH_SPACE_KEYS = 32


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
                # `values` holds untyped items, which CEL cannot see (the field is undefined to it), so
                # "choice and grid need values" is checked by the models only (manifest.OPERATOR_ONLY_RULES).
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
    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel.rule("self.type != 'asha' || self.gracePeriod <= self.maxT", GRACE_ABOVE_MAX_T)
            ]
        }
    )

    type: Literal["asha", "none"] = "asha"
    grace_period: Annotated[int, pydantic.Field(ge=1)] = 1
    max_t: Annotated[int, pydantic.Field(ge=1)] = 100
    reduction_factor: Annotated[float, pydantic.Field(gt=1.0)] = 3.0

    @pydantic.model_validator(mode="after")
    def _grace_within_max(self) -> Scheduler:
        if self.type == "asha" and self.grace_period > self.max_t:
            raise ValueError(GRACE_ABOVE_MAX_T)
        return self


def _not_a_template_field(key: str) -> str:
    """CEL: ``key`` (a searchSpace key) names neither an NCCL variable nor a scalar field of the template."""
    paths = "[" + ", ".join(cel.string(path) for path in sorted(TEMPLATE_PARAMETER_PATHS)) + "]"
    return f"!({key}.startsWith('nccl.') || {key} in {paths})"


def _spec_rules() -> list[cel.Rule]:
    """The CEL twins of TuningSweepSpec's validator (same sentences, values filled in)."""
    all_grid = "self.searchSpace.all(k, self.searchSpace[k].type == 'grid')"
    return [
        cel.rule(
            f"!self.searchSpace.exists(k, {_not_a_template_field('k')})",
            "every searchSpace key must be a field of the template: use a dotted path such as "
            "hyperparameters.learningRate or nccl.NCCL_ALGO",
            cel.format(
                "searchSpace key '%s' is not a field of the template: use a dotted path such as "
                "hyperparameters.learningRate or nccl.NCCL_ALGO",
                f"self.searchSpace.filter(k, {_not_a_template_field('k')})[0]",
            ),
        ),
        cel.rule(
            f"self.algorithm != 'grid' || {all_grid}",
            "algorithm grid needs every searchSpace entry to be type grid",
            cel.format(
                "algorithm grid needs every searchSpace entry to be type grid; not: %s",
                "self.searchSpace.filter(k, self.searchSpace[k].type != 'grid')[0]",
            ),
        ),
        cel.rule(
            "self.algorithm == 'grid' || !self.searchSpace.exists(k, self.searchSpace[k].type == 'grid')",
            GRID_NEEDS_GRID_ALGORITHM,
        ),
    ]


class TuningSweepSpec(base.ApiModel):
    model_config = pydantic.ConfigDict(json_schema_extra=lambda schema: _with_rules(schema, _spec_rules()))

    template: trainingjob.TrainingJobSpec
    search_space: Annotated[
        dict[Annotated[str, pydantic.Field(pattern=PARAMETER_NAME_PATTERN)], Distribution],
        pydantic.Field(min_length=1, max_length=MAX_SEARCH_SPACE_KEYS),
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
            if not name.startswith("nccl.") and name not in TEMPLATE_PARAMETER_PATHS:
                raise ValueError(
                    f"searchSpace key {name!r} is not a field of the template: use a dotted path such as "
                    "hyperparameters.learningRate or nccl.NCCL_ALGO"
                )
        if self.algorithm == Algorithm.GRID:
            bad = [k for k, d in self.search_space.items() if d.type != DistributionKind.GRID]
            if bad:  # the first one only, as the CRD's rule (CEL cannot join a list within its cost budget)
                raise ValueError(
                    f"algorithm grid needs every searchSpace entry to be type grid; not: {bad[0]}"
                )
            if self.num_trials != self.grid_size:
                raise ValueError(
                    f"numTrials must be {self.grid_size} with algorithm grid (one trial per grid point)"
                )
        elif any(d.type == DistributionKind.GRID for d in self.search_space.values()):
            raise ValueError(GRID_NEEDS_GRID_ALGORITHM)
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


def _scalar_paths(model: type[pydantic.BaseModel], prefix: str = "") -> list[str]:
    """Dotted camelCase paths of every field of ``model`` that is not itself a model (a sweep parameter)."""
    paths: list[str] = []
    for name, info in model.model_fields.items():
        path = prefix + (info.alias or name)
        nested = _model_in(info.annotation)
        paths.extend([path] if nested is None else _scalar_paths(nested, path + "."))
    return paths


def _model_in(annotation: Any) -> type[pydantic.BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


#: What a searchSpace key may name besides nccl.* variables: a scalar field of the template.
TEMPLATE_PARAMETER_PATHS = frozenset(_scalar_paths(trainingjob.TrainingJobSpec))


def _with_rules(schema: dict[str, Any], rules: list[cel.Rule]) -> None:
    schema.setdefault("x-kubernetes-validations", []).extend(rules)


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


class TuningSweepStatus(base.ApiModel):
    # Operator-owned.
    phase: trainingjob.Phase | None = None
    conditions: list[base.Condition] = pydantic.Field(default_factory=list)
    observed_generation: int | None = None
    attempt: int = 0
    restarts: int = 0
    failures: list[trainingjob.Failure] = pydantic.Field(
        default_factory=list, max_length=trainingjob.MAX_FAILURE_HISTORY
    )
    children: trainingjob.Children | None = None
    start_time: str | None = None
    completion_time: str | None = None
    next_restart_time: str | None = None
    # Driver-owned.
    trials: TrialCounts | None = None
    best_trial: BestTrial | None = None
    updated: str | None = None


class TuningSweep(base.ApiModel):
    api_version: Literal["trainop.dev/v1alpha1"] = "trainop.dev/v1alpha1"
    kind: Literal["TuningSweep"] = "TuningSweep"
    metadata: base.ObjectMeta
    spec: TuningSweepSpec
    status: TuningSweepStatus | None = None
