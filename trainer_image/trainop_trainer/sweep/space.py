"""The search space: ``spec.searchSpace`` -> Ray Tune domains, and sampled parameters -> a trial's spec.

Parameter names are the API's dotted paths (``hyperparameters.learningRate``, ``nccl.NCCL_ALGO``) and stay
so everywhere: they are the keys of Tune's ``param_space``, of every trial's config, of
``status.bestTrial.parameters`` and of the local table, so a user never meets a second naming.

``spec_for_trial`` writes the sampled values into a copy of the template on its wire form (camelCase, as a
manifest spells it) and validates the result with the API's own model: a sampled value the template
refuses (``momentum: 1.5``) fails that one trial with the field's name, before any worker starts.
``nccl.X`` lands in ``network.ncclEnv[X]`` as a string (environment variables are strings).

Distributions map one to one onto Tune's: ``uniform`` and ``loguniform`` over ``[lower, upper)``,
``randint`` over the integers ``lower <= n < upper`` (Tune's and numpy's convention: ``upper`` excluded),
``choice`` over ``values``, ``grid`` through ``tune.grid_search(values)``.

Nothing here starts Ray; ``ray.tune`` is imported only by ``param_space``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pydantic

from trainop.api import base, trainingjob, tuningsweep

NCCL_PREFIX = "nccl."

# What the packaged trainer reports to Ray Train (and so to Tune) at every report: ``runtime.Runtime.report``
# sends step, epoch, loss, samples_per_second (and checkpoint_step once a checkpoint exists). A user
# entrypoint may add its own names through ``ctx.step_done(metrics=...)``.
TRAINER_METRICS = tuningsweep.TRAINER_METRICS
# With ``template.evaluation`` every later report also carries the last evaluation as ``eval_<metric>``
# (``Trainer.report``; ``evaluation._metrics``: top5Accuracy for classifiers, perplexity for language models).
EVALUATION_METRICS = tuningsweep.EVALUATION_METRICS
# The scheduler's clock: optimizer steps, so gracePeriod/maxT read as steps whatever the report pace.
TIME_ATTR = "step"


class SearchSpaceError(ValueError):
    """A sweep spec that cannot be searched; the message names the field and the fix."""


def validate(spec: tuningsweep.TuningSweepSpec) -> None:
    """What the API models do not check: Optuna gets only scalar choices. (Whole randint bounds, values
    that fit the fields they set and the objective's metric are the API's to check: ``TuningSweepSpec``.)"""
    for name, distribution in spec.search_space.items():
        field = f"spec.searchSpace[{name!r}]"
        if (
            spec.algorithm == tuningsweep.Algorithm.OPTUNA
            and distribution.type == tuningsweep.DistributionKind.CHOICE
            and any(
                not isinstance(v, (str, int, float, bool)) and v is not None
                for v in distribution.values or ()
            )
        ):
            raise SearchSpaceError(
                f"{field}: algorithm optuna needs scalar choice values (strings, numbers, booleans)"
            )


def param_space(spec: tuningsweep.TuningSweepSpec) -> dict[str, Any]:
    """Tune's ``param_space``: one domain per dotted parameter name."""
    from ray import tune

    space: dict[str, Any] = {}
    for name, d in spec.search_space.items():
        kind = d.type
        if kind == tuningsweep.DistributionKind.CHOICE:
            space[name] = tune.choice(list(d.values or ()))
        elif kind == tuningsweep.DistributionKind.GRID:
            space[name] = tune.grid_search(list(d.values or ()))
        else:
            assert d.lower is not None and d.upper is not None  # the API model requires both
            if kind == tuningsweep.DistributionKind.UNIFORM:
                space[name] = tune.uniform(d.lower, d.upper)
            elif kind == tuningsweep.DistributionKind.LOGUNIFORM:
                space[name] = tune.loguniform(d.lower, d.upper)
            else:
                space[name] = tune.randint(int(d.lower), int(d.upper))
    return space


def plain(value: Any) -> Any:
    """A JSON-safe Python value (Tune's samplers hand out numpy scalars)."""
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, (str, bytes)):
        return item()
    return value


def parameters_of(config: Mapping[str, Any], spec: tuningsweep.TuningSweepSpec) -> dict[str, Any]:
    """The sampled values of one trial, by dotted name (Tune's config may carry other keys)."""
    return {name: plain(config[name]) for name in spec.search_space if name in config}


def spec_for_trial(
    template: trainingjob.TrainingJobSpec, parameters: Mapping[str, Any]
) -> trainingjob.TrainingJobSpec:
    """The template with ``parameters`` written in; ``SearchSpaceError`` if the template refuses a value."""
    wire = template.model_dump(mode="json", by_alias=True)
    for name, raw in parameters.items():
        value = plain(raw)
        if name.startswith(NCCL_PREFIX):
            network = wire.setdefault("network", {})
            env = network.get("ncclEnv") or {}
            env[name[len(NCCL_PREFIX) :]] = str(value)
            network["ncclEnv"] = env
            continue
        *parents, leaf = name.split(".")
        node = wire
        for part in parents:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            node = child
        node[leaf] = value
    try:
        return trainingjob.TrainingJobSpec.model_validate(wire, by_alias=True, by_name=False)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = base.error_path(first["loc"])
        sampled = ", ".join(f"{k}={plain(v)!r}" for k, v in parameters.items())
        raise SearchSpaceError(
            f"the sampled parameters ({sampled}) make spec.template.{where} invalid: {first['msg']}; "
            "narrow spec.searchSpace to values the template accepts"
        ) from None
