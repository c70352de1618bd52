"""One trial: the sampled parameters -> a TrainerConfig -> a TorchTrainer run of the packaged trainer.

``run_trial`` is the Tune function trainable. It writes the parameters into the template
(``space.spec_for_trial``), names the run ``<sweep>-<trial id>`` under ``<experiment>/trials/`` (stable, so
a trial Tune runs again resumes from its own checkpoints), and runs a ``TorchTrainer`` whose workers run
the packaged trainer's ``ray_train.train_loop_per_worker`` — the same worker code, scaling, failure config
and worker environment as ``python -m trainop_trainer`` — so Tune sees exactly the metrics the trainer
reports: ``step``, ``epoch``, ``loss``, ``samples_per_second``, ``checkpoint_step``. The trial's
TrainerConfig is written next to its checkpoints (``<run>/trainer.json``).

The driver side is ``ray_train.torch_trainer``, the TorchTrainer of ``ray_train.run`` (scaling, launch
settings, failure budget, worker env), plus the trial's report callback; not ``ray_train.run`` itself,
which reads a job's outcome files and takes no callbacks. A trial's workers get no ``statusTarget``: the
TuningSweep's status belongs to the sweep driver.

Reports: Train's reports reach Tune through ``ObjectiveReportCallback``, Ray's ``TuneReportCallback``
minus the reports that lack the objective's metric (Tune would fail the whole experiment on one; the
trainer sends one when a trial resumes from its final checkpoint: no new steps, no loss).

Resources (``driver_resources``): the trial function is only a Train driver (it waits on ``fit()``), so it
asks for no CPU and no GPU: every CPU and GPU stays for Train workers, which is what lets the operator size
the worker group as exactly ``maxConcurrentTrials x replicas`` pods. Ray refuses an all-zero request
(``{"cpu": 0}`` makes an empty placement-group bundle), so the trial asks, in this order:

- one unit of the custom resource ``trainop_trial_driver`` when the cluster has it: a cluster that
  advertises it on the head (``rayStartParams.resources``) pins every trial driver, and with it the
  trial's Train controller, to the head, sized for them;
- else ``TRIAL_DRIVER_MEMORY_BYTES`` of Ray's logical ``memory`` resource: an estimate of what the trial
  process and its Train controller hold (each imports torch), which Train workers never ask for, so it
  cannot take their place. Ray then places trial drivers wherever that memory is free.

Train V2 places each run's controller (0 CPU) on the node of its trial function.
"""

from __future__ import annotations

import dataclasses
import pathlib
import uuid
from collections.abc import Mapping
from typing import Any

from ray.tune.integration.ray_train import TuneReportCallback

from trainop.api import trainer_config, trainingjob
from trainop_trainer import ray_train
from trainop_trainer.sweep import layout, space

TRIAL_DRIVER_RESOURCE = "trainop_trial_driver"
# Ray's logical ``memory`` a trial asks for without that resource: its own process and its Train
# controller's, which follows it to its node (each about 0.7 GB resident, measured with torch imported).
TRIAL_DRIVER_MEMORY_BYTES = 3 * 512 * 1024**2


def driver_resources(cluster_resources: Mapping[str, float]) -> dict[str, float]:
    """What one trial function asks Ray for (see the module docstring): never CPU or GPU."""
    if cluster_resources.get(TRIAL_DRIVER_RESOURCE, 0) > 0:
        return {"cpu": 0, "gpu": 0, TRIAL_DRIVER_RESOURCE: 1}
    return {"cpu": 0, "gpu": 0, "memory": TRIAL_DRIVER_MEMORY_BYTES}


@dataclasses.dataclass(frozen=True)
class TrialSetup:
    """What every trial needs besides its parameters (picklable; Tune ships it to each trial)."""

    sweep_name: str
    template_json: str
    trials_root: str
    attempt: int
    metric: str
    inject_failure_at_step: int | None = None
    tracking_parent_run_id: str | None = None  # the sweep's MLflow run: every trial's run is its child

    @classmethod
    def for_config(
        cls,
        config: trainer_config.SweepConfig,
        *,
        inject_failure_at_step: int | None = None,
        tracking_parent_run_id: str | None = None,
    ) -> TrialSetup:
        paths = layout.SweepPaths.for_config(config)
        return cls(
            sweep_name=config.sweep_name,
            template_json=config.spec.template.model_dump_json(by_alias=True),
            trials_root=str(paths.trials_root),
            attempt=config.attempt,
            metric=config.spec.objective.metric,
            inject_failure_at_step=inject_failure_at_step,
            tracking_parent_run_id=tracking_parent_run_id,
        )

    def trainer_config(self, trial_id: str, parameters: dict[str, Any]) -> trainer_config.TrainerConfig:
        template = trainingjob.TrainingJobSpec.model_validate_json(
            self.template_json, by_alias=True, by_name=False
        )
        run_name = layout.trial_run_name(self.sweep_name, trial_id)
        return trainer_config.TrainerConfig(
            job_name=run_name,
            run_name=run_name,
            storage_path=self.trials_root,
            attempt=self.attempt,
            spec=space.spec_for_trial(template, parameters),
            status_target=None,
            tracking_parent_run_id=self.tracking_parent_run_id,
        )


class ObjectiveReportCallback(TuneReportCallback):
    """Train -> Tune reports, without those that lack the objective's metric.

    Tune refuses a result without its metric by failing the whole experiment, and the trainer can send
    one: a trial resumed from its final checkpoint ends with a report of no new steps and no loss. Such a
    report carries nothing to tune on, so it is not forwarded. (A training that never reports the metric
    then ends with no result, and the sweep says so, naming ``spec.objective.metric``.)
    """

    def __init__(self, metric: str) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.metric = metric

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        if metrics and self.metric in metrics[0]:
            super().after_report(run_context, metrics, checkpoint)


def fit(
    config: trainer_config.TrainerConfig, *, metric: str, inject_failure_at_step: int | None = None
) -> None:
    """Run ``config`` as a TorchTrainer whose reports (those with ``metric``) go to the current Tune
    trial; raises if the training fails."""
    trainer = ray_train.torch_trainer(
        config,
        launch_id=uuid.uuid4().hex,
        inject_failure_at_step=inject_failure_at_step,
        callbacks=[ObjectiveReportCallback(metric)],
    )
    trainer.fit()


def run_trial(params: dict[str, Any], setup: TrialSetup) -> None:
    """The Tune function trainable: one TorchTrainer run with the sampled ``params``."""
    from ray import tune

    trial_id = tune.get_context().get_trial_id()
    parameters = {name: space.plain(value) for name, value in params.items()}
    config = setup.trainer_config(trial_id, parameters)
    # What this trial trains, next to its checkpoints (as local mode does for a job).
    run_dir = pathlib.Path(config.storage_path) / config.run_name
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "trainer.json").write_text(trainer_config.dumps(config))
    fit(config, metric=setup.metric, inject_failure_at_step=setup.inject_failure_at_step)


def trainable(setup: TrialSetup) -> Any:
    """``run_trial`` bound to ``setup`` and sized as a driver (no CPU, no GPU); needs Ray initialised."""
    import ray
    from ray import tune

    resources = driver_resources(ray.cluster_resources())  # type: ignore[no-untyped-call]
    return tune.with_resources(tune.with_parameters(run_trial, setup=setup), resources)
