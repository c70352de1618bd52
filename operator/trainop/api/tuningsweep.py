"""The TuningSweep API (trainop.dev/v1alpha1): a TrainingJob template searched over by Ray Tune.

A sweep is one RayJob whose driver runs Ray Tune; every trial is a TorchTrainer run of the packaged
trainer built from ``spec.template`` with the sampled parameters written into it. Parameter names are
dotted paths into the template (``hyperparameters.learningRate``) or NCCL variables
(``nccl.NCCL_ALGO``), so one sweep can tune the optimiser and the network alike.
"""

from __future__ import annotations

import enum
import functools
import json
import math
import typing
from typing import Annotated, Any, Literal

import pydantic

from trainop.api import base, cel, operator_status, trainingjob

MAX_DURATION = trainingjob.MAX_DURATION_SECONDS

PARAMETER_NAME_PATTERN = r"^(nccl\.(NCCL|TORCH_NCCL)_[A-Z0-9_]+|[a-z][A-Za-z0-9]*(\.[a-z][A-Za-z0-9]*)+)$"


GRACE_ABOVE_MAX_T = "scheduler.gracePeriod must not exceed scheduler.maxT"

# What the packaged trainer reports at every report (``runtime.Runtime.report``), and, with
# ``template.evaluation``, the last evaluation as ``eval_<metric>`` (top5Accuracy for classifiers,
# perplexity for language models). A user entrypoint may report names of its own.
TRAINER_METRICS = ("loss", "samples_per_second", "step", "epoch")
EVALUATION_METRICS = ("eval_loss", "eval_accuracy", "eval_top5Accuracy", "eval_perplexity")
METRIC_NEEDS_EVALUATION = (
    "spec.objective.metric '{metric}' is reported only when spec.template.evaluation is set: set it, or "
    "use one of " + ", ".join(TRAINER_METRICS)
)
METRIC_NOT_REPORTED = (
    "spec.objective.metric '{metric}' is not reported by the built-in trainer: use one of "
    + ", ".join(TRAINER_METRICS)
    + " (and with spec.template.evaluation "
    + ", ".join(EVALUATION_METRICS)
    + "), or report it from a workload.entrypoint"
)
GRID_NEEDS_GRID_ALGORITHM = "searchSpace type grid needs algorithm grid"
# Tune's randint draws integers between the bounds; a fractional bound would be truncated silently.
RANDINT_NEEDS_WHOLE_BOUNDS = "randint needs whole-number lower and upper (upper excluded), e.g. 1 and 9"
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
    """One parameter of the search space: how its values are drawn (type), from a range (lower, upper)
    or from a list (values)."""

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
                cel.rule(
                    "self.type != 'randint' || !has(self.lower) || !has(self.upper) || "
                    "(self.lower == double(int(self.lower)) && self.upper == double(int(self.upper)))",
                    RANDINT_NEEDS_WHOLE_BOUNDS,
                ),
            ]
        }
    )

    type: DistributionKind
    """How values are drawn: uniform (floats in [lower, upper)), loguniform (floats in [lower, upper), evenly
    in log space; lower > 0), randint (integers in [lower, upper): upper excluded), choice (one of values
    at random) or grid (every one of values; needs algorithm grid)."""
    lower: float | None = None
    """Lowest value, included: required by uniform, loguniform and randint."""
    upper: float | None = None
    """Bound the values stay below (excluded): required by uniform, loguniform and randint."""
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
    """The candidates of choice and grid: numbers, strings or booleans, as the template field takes them
    (strings for nccl.* variables)."""

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
            if self.type == DistributionKind.RANDINT and not (
                self.lower.is_integer() and self.upper.is_integer()
            ):
                raise ValueError(RANDINT_NEEDS_WHOLE_BOUNDS)
        return self

    def extremes(self) -> list[Any]:
        """The values this distribution can draw that a field's type and range decide on: every choice and
        grid value, randint's lowest and highest integer, a uniform's lower bound and the largest float
        below its upper one."""
        if self.values is not None and self.type in (DistributionKind.CHOICE, DistributionKind.GRID):
            return list(self.values)
        assert self.lower is not None and self.upper is not None  # _bounds
        if self.type == DistributionKind.RANDINT:
            return [int(self.lower), int(self.upper) - 1]
        return [self.lower, math.nextafter(self.upper, self.lower)]


class Objective(base.ApiModel):
    metric: Annotated[str, pydantic.Field(min_length=1)] = "loss"
    """The metric the sweep optimises, as the trainer reports it: loss (the default), samples_per_second, step
    or epoch for built-in models, and with spec.template.evaluation the last evaluation's eval_loss,
    eval_accuracy, eval_top5Accuracy or eval_perplexity; a user entrypoint may also report its own."""
    mode: Mode = Mode.MIN
    """min (the default) or max: whether smaller or larger values of the metric are better."""
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
    """asha (the default): ASHA early stopping, which stops trials that fall behind at each rung; none: every
    trial runs to its end."""
    grace_period: Annotated[int, pydantic.Field(ge=1)] = 1
    """ASHA: optimizer steps every trial runs before it may be stopped (the first rung). Default 1."""
    max_t: Annotated[int, pydantic.Field(ge=1)] = 100
    """ASHA: optimizer steps after which a trial is stopped in any case (the whole budget). Set it above
    hyperparameters.maxSteps to let trials finish by themselves. Default 100."""
    reduction_factor: Annotated[float, pydantic.Field(gt=1.0)] = 3.0
    """ASHA: at each rung only the best 1/reductionFactor of the trials go on. Default 3."""

    @pydantic.model_validator(mode="after")
    def _grace_within_max(self) -> Scheduler:
        if self.type == "asha" and self.grace_period > self.max_t:
            raise ValueError(GRACE_ABOVE_MAX_T)
        return self


def _in_a_fixed_section(key: str) -> str:
    """CEL: ``key`` (a searchSpace key) names a field every trial shares (``is_fixed_for_trials``)."""
    fields = cel.strings(FIXED_TEMPLATE_FIELDS)
    prefixes = " || ".join(f"{key}.startsWith({cel.string(prefix)})" for prefix in FIXED_TEMPLATE_SECTIONS)
    return f"{prefixes} || {key} in {fields}"


def _not_a_template_field(key: str) -> str:
    """CEL: ``key`` (a searchSpace key) names neither an NCCL variable, nor a field of a fixed section (its
    own rule), nor a scalar field of the template."""
    paths = cel.strings(sorted(TEMPLATE_PARAMETER_PATHS))
    return f"!({key}.startsWith('nccl.') || {_in_a_fixed_section(key)} || {key} in {paths})"


def _spec_rules() -> list[cel.Rule]:
    """The CEL twins of TuningSweepSpec's validator (same sentences, values filled in)."""
    all_grid = "self.searchSpace.all(k, self.searchSpace[k].type == 'grid')"
    metric = "self.objective.metric"
    builtin = f"!has(self.template.workload.entrypoint) && !({metric} in {cel.strings(TRAINER_METRICS)})"
    evaluated = f"{metric} in {cel.strings(EVALUATION_METRICS)}"
    return [
        cel.rule(
            f"!({builtin} && {evaluated} && !has(self.template.evaluation))",
            METRIC_NEEDS_EVALUATION.replace("{metric}", "<metric>"),
            cel.format(METRIC_NEEDS_EVALUATION.replace("{metric}", "%s"), metric),
        ),
        cel.rule(
            f"!({builtin} && !({evaluated}))",
            METRIC_NOT_REPORTED.replace("{metric}", "<metric>"),
            cel.format(METRIC_NOT_REPORTED.replace("{metric}", "%s"), metric),
        ),
        cel.rule(
            f"!self.searchSpace.exists(k, {_in_a_fixed_section('k')})",
            PARAMETER_IN_A_FIXED_SECTION.replace("%s", "<key>"),
            cel.format(
                PARAMETER_IN_A_FIXED_SECTION,
                f"self.searchSpace.filter(k, {_in_a_fixed_section('k')})[0]",
            ),
        ),
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
        cel.rule("!has(self.template.checkpoint.storage.s3)", SWEEP_KEEPS_CHECKPOINTS_ON_A_CLAIM),
        cel.rule("!has(self.template.data)", SWEEP_HAS_NO_DATA_SOURCE),
        cel.rule("!has(self.template.workload.rayTrain)", SWEEP_HAS_NO_RAY_TRAIN_FUNCTION),
    ]


# A sweep's trials keep their Ray Tune experiment and checkpoints on the sweep's claim (docs/sweep.md); the
# object storage and data sources of issue #18 are TrainingJob features for now.
SWEEP_KEEPS_CHECKPOINTS_ON_A_CLAIM = (
    "template.checkpoint.storage.s3 is not supported by TuningSweep: its trials keep their experiment on "
    "the sweep's claim; remove s3 (TrainingJob supports it)"
)
SWEEP_HAS_NO_DATA_SOURCE = (
    "template.data is not supported by TuningSweep yet: put the dataset on the sweep's claim and set "
    "template.workload.dataset.path to it (TrainingJob supports data)"
)
# Every trial runs the packaged trainer (space.spec_for_trial, trial.trainable): a built-in model or a user
# entrypoint, never a Ray Train function of its own.
SWEEP_HAS_NO_RAY_TRAIN_FUNCTION = (
    "spec.template.workload.rayTrain is not supported by TuningSweep: its trials run the packaged trainer; "
    "set workload.model or workload.entrypoint, or use a TrainingJob for a Ray Train function"
)


class TuningSweepSpec(base.ApiModel):
    model_config = pydantic.ConfigDict(json_schema_extra=lambda schema: _with_rules(schema, _spec_rules()))

    template: trainingjob.TrainingJobSpec
    """The TrainingJob spec every trial trains, with the sampled parameters written into it. Its workers
    section sizes each trial's worker pods; its failurePolicy also governs restarts of the sweep's driver."""
    search_space: Annotated[
        dict[Annotated[str, pydantic.Field(pattern=PARAMETER_NAME_PATTERN)], Distribution],
        pydantic.Field(min_length=1, max_length=MAX_SEARCH_SPACE_KEYS),
    ]
    """The parameters to tune, 1 to 32. A key is a dotted path into template (hyperparameters.learningRate) or
    nccl.<variable> (written into template.network.ncclEnv); its value says how to draw it. Cannot change
    while the sweep exists."""
    objective: Objective = pydantic.Field(default_factory=Objective)
    """What makes a trial better: the metric, its direction, and an optional goal that ends the sweep early.
    Cannot change while the sweep exists."""
    algorithm: Algorithm = Algorithm.RANDOM
    """How trials are proposed: random (the default: independent draws), grid (every combination of the grid
    values; numTrials must equal their product) or optuna (Optuna's TPE sampler, which learns from finished
    trials). Cannot change while the sweep exists."""
    seed: Annotated[int, pydantic.Field(ge=0, le=trainingjob.MAX_SEED)] | None = None
    """Seed of the search algorithm: the same seed proposes the same trials (random and grid always; optuna
    its first 10). Unset: different trials every run."""
    scheduler: Scheduler = pydantic.Field(default_factory=Scheduler)
    """Early stopping of trials that fall behind (ASHA), or none."""
    num_trials: Annotated[int, pydantic.Field(ge=1, le=10000)] = 8
    """Trials to run in all. Default 8."""
    max_concurrent_trials: Annotated[int, pydantic.Field(ge=1, le=1024)] = 2
    """Trials that run at once. The Ray cluster gets maxConcurrentTrials x template.workers.replicas worker
    pods, and its head room for one trial driver per concurrent trial (2Gi each). Default 2."""
    max_failed_trials: Annotated[int, pydantic.Field(ge=0)] = 2
    """Failed trials the sweep tolerates; one more ends the attempt as failed (unfinished trials run again in
    the next attempt, if the budget of the failure's class in template.failurePolicy allows one).
    Default 2."""
    suspend: bool = False
    """true stops the sweep: its RayJob and Ray pods are deleted, trial checkpoints stay on the volume, phase
    becomes Suspended. Setting it back to false starts a new attempt that restores the experiment (not
    counted as a restart). Default false."""
    active_deadline_seconds: Annotated[int, pydantic.Field(ge=1, le=MAX_DURATION)] | None = None
    """Seconds the sweep may run, counted from status.startTime (the clock restarts when a suspended sweep
    resumes). When exceeded the sweep fails with reason DeadlineExceeded. Unset: no limit."""
    ttl_seconds_after_finished: Annotated[int, pydantic.Field(ge=0, le=MAX_DURATION)] | None = None
    """Seconds after the sweep Succeeded or Failed before the operator deletes it, with the children it owns;
    the checkpoint claim stays unless template.checkpoint.storage.deleteWithJob is true. Unset: kept until
    you delete it."""

    @pydantic.field_validator("search_space", mode="after")
    @classmethod
    def _draws_fit_the_template(
        cls, search_space: dict[str, Distribution], info: pydantic.ValidationInfo
    ) -> dict[str, Distribution]:
        if base.accepted_before(info):  # a rule newer than some running sweeps (base.ACCEPTED)
            return search_space
        for name, distribution in search_space.items():
            found = draw_problem(name, distribution)
            if found is not None:
                raise ValueError(found)
        return search_space

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> TuningSweepSpec:
        for name in self.search_space:
            if is_fixed_for_trials(name):
                raise ValueError(PARAMETER_IN_A_FIXED_SECTION % name)
            if not name.startswith("nccl.") and name not in TEMPLATE_PARAMETER_PATHS:
                raise ValueError(
                    f"searchSpace key {name!r} is not a field of the template: use a dotted path such as "
                    "hyperparameters.learningRate or nccl.NCCL_ALGO"
                )
        metric = self.objective.metric
        if self.template.workload.entrypoint is None and metric not in TRAINER_METRICS:
            if metric in EVALUATION_METRICS and self.template.evaluation is None:
                raise ValueError(METRIC_NEEDS_EVALUATION.format(metric=metric))
            if metric not in EVALUATION_METRICS:
                raise ValueError(METRIC_NOT_REPORTED.format(metric=metric))
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
        if self.template.checkpoint.storage.s3 is not None:
            raise ValueError(SWEEP_KEEPS_CHECKPOINTS_ON_A_CLAIM)
        if self.template.data is not None:
            raise ValueError(SWEEP_HAS_NO_DATA_SOURCE)
        if self.template.workload.ray_train is not None:
            raise ValueError(SWEEP_HAS_NO_RAY_TRAIN_FUNCTION)
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


def _scalar_fields(model: type[pydantic.BaseModel], prefix: str = "") -> dict[str, pydantic.fields.FieldInfo]:
    """Every field of ``model`` that is not itself a model (a sweep parameter), by dotted camelCase path.
    Fields of models in a list or a map have no such path (``spec_for_trial`` cannot write them): none."""
    fields: dict[str, pydantic.fields.FieldInfo] = {}
    for name, info in model.model_fields.items():
        path = prefix + (info.alias or name)
        if _models_in_a_container(info.annotation):
            continue
        nested = _model_in(info.annotation)
        fields.update({path: info} if nested is None else _scalar_fields(nested, path + "."))
    return fields


def _models_in_a_container(annotation: Any) -> bool:
    if typing.get_origin(annotation) in (list, dict, tuple, set, frozenset):
        return any(_model_in(arg) is not None for arg in typing.get_args(annotation))
    return any(_models_in_a_container(arg) for arg in getattr(annotation, "__args__", ()))


def _model_in(annotation: Any) -> type[pydantic.BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


#: Template fields a trial cannot vary, because every trial shares what the operator or the sweep's driver
#: makes from them once: the Ray pods (sized from workers.*, with the template's data mount, metrics ports
#: and tracking secret), the checkpoint claim, the sweep's restart budget, and the sweep's tracking run
#: (trials are its child runs). A sampled value there would not reach them. (Top-level fields, such as image
#: or suspend, are no parameter at all: PARAMETER_NAME_PATTERN wants a dotted path.)
FIXED_TEMPLATE_SECTIONS = (
    "workers.",
    "checkpoint.storage.",
    "tracking.",
    "failurePolicy.budgets.",
)
FIXED_TEMPLATE_FIELDS = (
    "data.existingClaim",
    "data.subPath",
    "data.s3.credentialsSecret",
    "reporting.metricsPort",
    "failurePolicy.maxRestarts",
    "failurePolicy.backoffSeconds",
    "failurePolicy.maxBackoffSeconds",
    "failurePolicy.stuckPodTimeoutSeconds",
)
PARAMETER_IN_A_FIXED_SECTION = (
    "spec.searchSpace.%s cannot vary between trials: every trial shares the sweep's Ray pods, claim, "
    "restarts and tracking run, made once from spec.template; set it in spec.template instead"
)


def is_fixed_for_trials(path: str) -> bool:
    """Whether ``path`` (a searchSpace key) names a template field every trial shares."""
    return path.startswith(FIXED_TEMPLATE_SECTIONS) or path in FIXED_TEMPLATE_FIELDS


#: What a searchSpace key may name besides nccl.* variables: a scalar field of the template below its top
#: level, outside the fixed sections and outside lists.
TEMPLATE_PARAMETER_FIELDS: dict[str, pydantic.fields.FieldInfo] = {
    path: info
    for path, info in _scalar_fields(trainingjob.TrainingJobSpec).items()
    if "." in path and not is_fixed_for_trials(path)
}
TEMPLATE_PARAMETER_PATHS = frozenset(TEMPLATE_PARAMETER_FIELDS)


@functools.cache
def _field_adapter(path: str) -> pydantic.TypeAdapter[Any]:
    """The type and range of the template field at ``path`` (its own validators aside)."""
    info = TEMPLATE_PARAMETER_FIELDS[path]
    annotated: Any = info.annotation  # a type built at run time
    if info.metadata:
        annotated = typing.Annotated[annotated, *info.metadata]
    return pydantic.TypeAdapter(annotated)


def draw_problem(name: str, distribution: Distribution) -> str | None:
    """Why a value ``distribution`` can draw would make every trial that draws it invalid (the field's
    type or range refuses it, read as strictly as a manifest), or None. The trial would fail with the same
    complaint only once it drew the value (``spec_for_trial`` in the trainer)."""
    if name not in TEMPLATE_PARAMETER_FIELDS:  # nccl.* (strings: any value) or not a field (its own rule)
        return None
    adapter = _field_adapter(name)
    for value in distribution.extremes():
        try:
            adapter.validate_json(json.dumps(value), strict=True)
        except pydantic.ValidationError as exc:
            error = exc.errors()[0]
            drawn = f"{name} ({distribution.type.value}) can draw {value!r}"
            if error["type"] == "int_type" and isinstance(value, float):
                return f"{drawn}, but spec.template.{name} takes integers: use randint or choice"
            said = str(error["msg"]).removeprefix("Value error, ").replace("Input should be ", "must be ", 1)
            return f"{drawn}, which spec.template.{name} refuses ({said}): draw only values the field takes"
    return None


def _with_rules(schema: dict[str, Any], rules: list[cel.Rule]) -> None:
    schema.setdefault("x-kubernetes-validations", []).extend(rules)


class TrialCounts(base.ApiModel):
    total: int = 0
    """Trials started so far: pending + running + succeeded + failed + earlyStopped."""
    pending: int = 0
    """Trials waiting for a slot, or left unfinished by an attempt that spent its failure budget."""
    running: int = 0
    """Trials whose training runs now."""
    succeeded: int = 0
    """Trials that trained to the end, or that ASHA stopped at maxT (their whole budget)."""
    failed: int = 0
    """Trials whose training failed."""
    early_stopped: int = 0
    """Trials stopped before their end: cut by ASHA at a rung, or stopped when the goal ended the sweep."""


class BestTrial(base.ApiModel):
    id: str
    """Ray Tune's id of the trial."""
    parameters: dict[str, Any] = pydantic.Field(
        default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """The trial's sampled parameters, by their searchSpace names (hyperparameters.learningRate: 0.01)."""
    metric: str
    """The objective's metric (spec.objective.metric)."""
    value: float
    """The best value of the metric the trial reported (the lowest for mode min, the highest for max)."""
    checkpoint: str | None = None
    """The trial's newest checkpoint directory on the volume, as the Ray pods see it."""

    def to_wire(self) -> dict[str, Any]:
        """With ``checkpoint: null`` when there is none: the driver merge-patches the status, and a missing
        key would keep the previous best trial's checkpoint."""
        return {**super().to_wire(), "checkpoint": self.checkpoint}


class TuningSweepStatus(operator_status.OperatorStatus):
    # Driver-owned; everything in OperatorStatus is the operator's (the same fields, meaning the same, as a
    # TrainingJob's: the sweep's driver runs in the attempt's RayJob <name>-s<attempt>).
    trials: TrialCounts | None = None
    """Trials by state, written by the sweep's driver."""
    best_trial: BestTrial | None = None
    """The best trial so far among those that did not fail, written by the sweep's driver."""
    updated: str | None = None
    """When the sweep's driver last published trials and bestTrial (RFC 3339, UTC)."""


class TuningSweep(base.ApiModel):
    """A hyperparameter (or NCCL setting) search with Ray Tune: every trial trains spec.template with
    sampled parameters, in one KubeRay RayJob whose driver runs the search; the status carries the trial
    counts and the best trial."""

    api_version: Literal["trainop.dev/v1alpha1"] = "trainop.dev/v1alpha1"
    """The API group and version: trainop.dev/v1alpha1."""
    kind: Literal["TuningSweep"] = "TuningSweep"
    """The object's kind: TuningSweep."""
    metadata: base.ObjectMeta
    """The object's metadata; the name is at most 40 characters (child names add suffixes)."""
    spec: TuningSweepSpec
    """What to search and how: the desired state, written by you."""
    status: TuningSweepStatus | None = None
    """What happened, written by the operator and by the sweep's driver."""
