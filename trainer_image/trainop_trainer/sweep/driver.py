"""The sweep driver: a ``SweepConfig`` -> a Ray Tune experiment over TorchTrainer trials -> an outcome.

``run`` builds, from the sweep spec:

- the search: ``random`` = Tune's ``BasicVariantGenerator(random_state=seed)`` over the domains of
  ``space.param_space``; ``grid`` = the same generator over ``tune.grid_search`` values (one trial per grid
  point, ``numTrials`` is the grid's size); ``optuna`` = ``OptunaSearch(seed=seed)`` (Optuna's TPE sampler)
  behind a ``ConcurrencyLimiter``. ``maxConcurrentTrials`` bounds running trials in every case.
- the scheduler: ``ASHAScheduler(time_attr="step", grace_period, max_t, reduction_factor)`` or none (FIFO);
  ``objective.metric``/``mode`` go to Tune once (``TuneConfig``), which hands them to both.
- the stopper and the status callback (``monitor``): goal, failure budget, status.
- ``RunConfig(name=experimentName, storage_path=storagePath)``: the experiment directory on the volume.
  Tune-level retries are off (``FailureConfig(max_failures=0)``): a trial's worker failures are already
  retried by its own TorchTrainer (``template.failurePolicy.maxWorkerFailures``), and a failed trial is
  what ``maxFailedTrials`` counts.

Restart: when ``Tuner.can_restore`` finds the experiment (a new attempt of the sweep: same experiment name
and storage path), the driver calls ``Tuner.restore(..., resume_errored=True)`` instead. Finished trials
are kept, not run again; trials that were running or had failed run again under their own trial id, so
their TorchTrainer resumes from their last checkpoint; the searcher, the callback's books and the
stopper come back with the experiment. A restored experiment keeps the settings it was created with
(numTrials, maxConcurrentTrials, maxFailedTrials, scheduler): Tune restores them from its own state.

Ending early: ``objective.goal`` ends the sweep for good (the trials still running are stopped and
count as early-stopped). More than ``maxFailedTrials`` failed trials end only this attempt: the trials
still running or waiting stay unfinished in the experiment, so the next attempt runs them
(``monitor.SweepStopper`` says how).

Outcome: ``failed`` when more than ``maxFailedTrials`` trials failed (the stopper's limit, the one the
experiment was created with; the reason names the count, the limit and the first failure) or when no
trial that did not fail reported ``objective.metric`` (the reason names the first trial error, if any);
else ``succeeded``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from trainop.api import trainer_config, tuningsweep
from trainop_trainer.sweep import book as book_module
from trainop_trainer.sweep import layout, monitor, space, trial

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SweepResult:
    outcome: str  # "succeeded" | "failed" | "interrupted"
    reason: str | None
    status: dict[str, Any]  # the driver-owned status fields as published (trials, bestTrial, updated)
    restored: bool

    @property
    def exit_code(self) -> int:
        """0 succeeded, 1 failed, 130 interrupted (a Ctrl+C: trials left to resume, as a shell reports it)."""
        return {"succeeded": 0, "interrupted": INTERRUPTED_EXIT_CODE}.get(self.outcome, 1)


INTERRUPTED_EXIT_CODE = 130


def search_algorithm(spec: tuningsweep.TuningSweepSpec) -> Any:
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.basic_variant import BasicVariantGenerator

    if spec.algorithm == tuningsweep.Algorithm.OPTUNA:
        from ray.tune.search.optuna import OptunaSearch

        return ConcurrencyLimiter(OptunaSearch(seed=spec.seed), max_concurrent=spec.max_concurrent_trials)
    # Tune ignores TuneConfig.max_concurrent_trials for a generator it did not build, so it goes here.
    return BasicVariantGenerator(max_concurrent=spec.max_concurrent_trials, random_state=spec.seed)


def scheduler(spec: tuningsweep.TuningSweepSpec) -> Any:
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if spec.scheduler.type == "none":
        return FIFOScheduler()  # type: ignore[no-untyped-call]
    return ASHAScheduler(
        time_attr=space.TIME_ATTR,
        grace_period=spec.scheduler.grace_period,
        max_t=spec.scheduler.max_t,
        reduction_factor=spec.scheduler.reduction_factor,
    )


def num_samples(spec: tuningsweep.TuningSweepSpec) -> int:
    """Tune repeats a grid num_samples times: a grid sweep samples it once (numTrials = grid size)."""
    return 1 if spec.algorithm == tuningsweep.Algorithm.GRID else spec.num_trials


def trial_dirname(trial: Any) -> str:
    """Tune's directory of a trial: its id (the default embeds every parameter value in the name)."""
    return str(trial.trial_id)


def _new_tuner(
    config: trainer_config.SweepConfig, trainable: Any, paths: layout.SweepPaths, status_interval_s: float
) -> Any:
    from ray import tune

    spec = config.spec
    max_t = spec.scheduler.max_t if spec.scheduler.type == "asha" else None
    book = book_module.TrialBook(metric=spec.objective.metric, mode=spec.objective.mode, max_t=max_t)
    publisher = monitor.StatusPublisher(
        paths=paths, sweep_name=config.sweep_name, target=config.status_target
    )
    key = str(paths.experiment_dir)
    return tune.Tuner(
        trainable,
        param_space=space.param_space(spec),
        tune_config=tune.TuneConfig(
            metric=spec.objective.metric,
            mode=spec.objective.mode.value,
            search_alg=search_algorithm(spec),
            scheduler=scheduler(spec),
            num_samples=num_samples(spec),
            trial_dirname_creator=trial_dirname,
        ),
        run_config=tune.RunConfig(
            name=config.experiment_name,
            storage_path=str(paths.storage_path),
            stop=monitor.SweepStopper(
                key=key,
                metric=spec.objective.metric,
                mode=spec.objective.mode,
                goal=spec.objective.goal,
                max_failed_trials=spec.max_failed_trials,
            ),
            callbacks=[
                monitor.SweepMonitor(
                    book=book, publisher=publisher, spec=spec, key=key, min_interval_s=status_interval_s
                )
            ],
            failure_config=tune.FailureConfig(max_failures=0),
            verbose=0,
        ),
    )


def run(
    config: trainer_config.SweepConfig,
    *,
    status_interval_s: float = monitor.DEFAULT_MIN_INTERVAL_S,
    inject_failure_at_step: int | None = None,
) -> SweepResult:
    """Run (or resume) the sweep on the connected Ray cluster (call ``ray_train.ensure_ray`` first).

    Raises ``space.SearchSpaceError`` for a spec that cannot be searched."""
    from ray import tune

    spec = config.spec
    space.validate(spec)
    paths = layout.SweepPaths.for_config(config)
    from trainop_trainer import tracking

    parent_run = tracking.open_sweep_run(config, experiment_dir=paths.experiment_dir)
    setup = trial.TrialSetup.for_config(
        config, inject_failure_at_step=inject_failure_at_step, tracking_parent_run_id=parent_run
    )
    trainable = trial.trainable(setup)
    restored = tune.Tuner.can_restore(str(paths.experiment_dir))
    if restored:
        log.info("restoring sweep experiment %s (attempt %d)", paths.experiment_dir, config.attempt)
        tuner = tune.Tuner.restore(str(paths.experiment_dir), trainable=trainable, resume_errored=True)
    else:
        tuner = _new_tuner(config, trainable, paths, status_interval_s)
    grid = tuner.fit()
    # The budget the experiment ran under: a restored stopper keeps the limit it was created with.
    max_failed_trials = monitor.pop_failure_budget(str(paths.experiment_dir), spec.max_failed_trials)
    return _result(spec, paths, grid, restored=restored, max_failed_trials=max_failed_trials)


def _read_json(path: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _result(
    spec: tuningsweep.TuningSweepSpec,
    paths: layout.SweepPaths,
    grid: Any,
    *,
    restored: bool,
    max_failed_trials: int | None = None,
) -> SweepResult:
    """The outcome from Tune's results and the books as last published (``status.json``, ``trials.json``).

    ``max_failed_trials`` is the stopper's own limit (``spec.maxFailedTrials`` when it is not given)."""
    status: dict[str, Any] = _read_json(paths.status_file) or {}
    rows: list[dict[str, Any]] = (_read_json(paths.trials_file) or {}).get("trials") or []
    limit = spec.max_failed_trials if max_failed_trials is None else max_failed_trials
    errors = [r for r in grid if r.error is not None]
    metric = spec.objective.metric
    if len(errors) > limit:
        first = errors[0]
        trial_id = first.path.rstrip("/").rsplit("/", 1)[-1] if first.path else "?"
        reason = (
            f"{len(errors)} trials failed, more than spec.maxFailedTrials ({limit}); "
            f"first failure: trial {trial_id}: {monitor.error_summary(str(first.error))}"
        )
        return SweepResult(outcome="failed", reason=reason, status=status, restored=restored)
    trials = status.get("trials") or {}
    unfinished = int(trials.get("pending") or 0) + int(trials.get("running") or 0)
    if unfinished:
        # Tune returned with started trials unfinished and the budget not spent: a Ctrl+C (SIGINT) ended its
        # loop. Not a success: the next run of the same experiment resumes them (``monitor.SweepMonitor``).
        reason = (
            f"interrupted with {unfinished} started trial(s) unfinished; run the sweep again with the same "
            "state (not fresh) to resume them from their checkpoints"
        )
        return SweepResult(outcome="interrupted", reason=reason, status=status, restored=restored)
    # Success needs a trial that did not fail and reported the objective (the book's best trial).
    usable = [row for row in rows if row.get("state") != "failed" and row.get("best") is not None]
    if not usable or not status.get("bestTrial"):
        failed = [row for row in rows if row.get("state") == "failed"]
        if failed:
            first_failed = failed[0]
            reason = (
                f"no trial that did not fail reported spec.objective.metric {metric!r}; "
                f"{len(failed)} trial(s) failed, first failure: trial {first_failed.get('id')}: "
                f"{first_failed.get('error') or 'failed without an error message'}"
            )
        else:
            reason = (
                f"no trial reported spec.objective.metric {metric!r}: check that the training reports it "
                f"(the built-in trainer reports {', '.join(space.TRAINER_METRICS)})"
            )
        return SweepResult(outcome="failed", reason=reason, status=status, restored=restored)
    return SweepResult(outcome="succeeded", reason=None, status=status, restored=restored)
