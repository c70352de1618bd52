"""``spec.workload.rayTrain``: an unmodified Ray Train V2 training function under trainop.

A Ray Train user already has ``train_loop_per_worker(config)`` written against Ray's API
(``ray.train.report``, ``ray.train.get_checkpoint``, ``ray.train.torch.prepare_model`` /
``prepare_data_loader``). trainop runs it as it is and supplies what the built-in loop gets:

- **the TorchTrainer** (``run``): the job's worker layout (``config.scaling_for``), ``RunConfig(name=
  runName, storage_path=storagePath)`` on the checkpoint volume or, for ``s3://``, in the bucket with the
  filesystem of ``checkpoint.storage.s3`` (``run_config``, as the built-in loop), ``FailureConfig(
  max_failures=maxWorkerFailures)``, ``CheckpointConfig(num_to_keep=keepLast)``, the NCCL environment of
  the job's network profile, and ``workload.config`` as the function's ``train_loop_config``;
- **restarts**: Ray Train restarts the worker group after a worker dies and hands the function its newest
  checkpoint through ``ray.train.get_checkpoint()``; a new attempt (a new RayJob) builds a TorchTrainer
  with the same name and storage path, and Ray Train restores its checkpoint manager from the volume, so
  ``get_checkpoint()`` again returns the newest checkpoint;
- **status** (``StatusCallback``, Ray Train's ``UserCallback`` interface, run in the Train controller
  process; never by parsing logs): each ``ray.train.report`` becomes ``status.progress`` (``step``: the
  reported ``step`` or the number of reports, ``epoch``, ``loss``), ``status.evaluation`` when the report
  carries evaluation-like keys (``accuracy``, ``val_*``/``eval_*``), ``status.checkpoint`` when it carries
  a checkpoint (Ray's directory on the volume), ``status.cost`` and the tracking backends; a worker
  failure counts in ``status.progress.workerRestarts``; every report is also a line of
  ``<run>/trainop/events.jsonl`` (``report``: the metrics and the checkpoint), next to the worker
  group's ``start`` and ``resume`` lines written by trainop's wrapper;
- **the wrapper** (``run_function``, what the workers actually run): registers the worker's PID for the
  preStop hook, resolves the network profile, records the start, then calls the user's function with its
  config.

Checkpoints here are Ray Train's own (``checkpoint_<time>`` directories under the run directory), kept by
Ray's ``CheckpointConfig``: trainop's ``Checkpointer``, evaluation and ``keepBest`` are for the built-in
loop and user entrypoints (the API refuses them with ``rayTrain``).
"""

from __future__ import annotations

import atexit
import inspect
import json
import logging
import time
import uuid
from typing import Any

from ray.train import UserCallback

from trainop.api import experiment, trainer_config, trainingjob
from trainop_trainer import config as config_module
from trainop_trainer import cost, run_record, storage, user

log = logging.getLogger(__name__)

FIELD = "spec.workload.rayTrain"
_TRAINOP_KEY = "__trainop__"  # the wrapper's settings inside train_loop_config, removed before the call
_EVALUATION_KEYS = ("accuracy", "top5Accuracy", "perplexity")


def resolve(spec: trainingjob.TrainingJobSpec) -> user.UserFunction:
    """The user's function, or ``user.EntrypointError`` naming ``spec.workload.rayTrain``."""
    assert spec.workload.ray_train is not None
    return user.resolve(spec.workload.ray_train, field_name=FIELD)


def evaluation_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The evaluation-like numbers of one report: accuracy and friends, ``val_*`` / ``eval_*`` keys."""
    found: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if key in _EVALUATION_KEYS:
            found[key] = float(value)
        for prefix in ("val_", "eval_", "validation_"):
            if key.startswith(prefix) and len(key) > len(prefix):
                found[key[len(prefix) :]] = float(value)
    return found


# ------------------------------------------------------------------------------------- on the workers
def run_function(loop_config: dict[str, Any]) -> None:
    """What every Ray Train worker runs: trainop's set-up, then the user's function, unmodified."""
    import ray.train

    from trainop_trainer import distributed, preempt
    from trainop_trainer.logs import configure_logging

    loop_config = dict(loop_config)
    settings = config_module.LaunchSettings.from_dict(loop_config.pop(_TRAINOP_KEY))
    config = settings.config
    context = ray.train.get_context()
    rank = context.get_world_rank()
    configure_logging(rank=rank)
    multi_node = context.get_world_size() > context.get_local_world_size()
    distributed.apply_network(config.spec.network, multi_node=multi_node)
    pid_file = preempt.register_pid(run_name=config.run_name, rank=rank)
    paths = config_module.paths_for(config)
    record = run_record.RunRecord(paths=paths, launch_id=settings.launch_id, is_rank0=rank == 0)
    record.started(attempt=config.attempt, world_size=context.get_world_size())
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None and rank == 0:
        record.resumed(step=-1, path=checkpoint.path)
        log.info("resuming from Ray Train checkpoint %s", checkpoint.path)
    function = resolve(config.spec)
    try:
        if _takes_config(function):
            function(loop_config)  # type: ignore[arg-type]
        else:
            function()  # type: ignore[call-arg]
    finally:
        preempt.unregister_pid(pid_file)


def _takes_config(function: Any) -> bool:
    try:
        return len(inspect.signature(function).parameters) > 0
    except (TypeError, ValueError):
        return True


# ------------------------------------------------------------------------------------ in the controller
class StatusCallback(UserCallback):
    """Ray Train ``UserCallback``: the function's reports -> status, events, cost and tracking. Built on the
    driver, pickled to the Train controller, where its sinks are opened on first use; the driver's own
    copy closes the account after ``fit()`` (``finish``)."""

    def __init__(self, *, config_json: str, launch_id: str, started_at: float) -> None:
        self.config_json = config_json
        self.launch_id = launch_id
        self.started_at = started_at
        self._opened = False

    def _open(self) -> None:
        from trainop_trainer import tracking
        from trainop_trainer.status import StatusReporter

        self.config = trainer_config.TrainerConfig.model_validate_json(
            self.config_json, by_alias=True, by_name=False
        )
        self.paths = config_module.paths_for(self.config)
        self.paths.run_dir.mkdir(parents=True, exist_ok=True)
        self.status = StatusReporter.for_config(self.config, status_file=self.paths.status_file)
        self.tracking = tracking.Tracking.start(self.config, run_dir=self.paths.run_dir)
        # A report never waits for the tracking thread: in an MLflow outage it backs off for up to a minute,
        # and the function's next ray.train.report would wait for this callback. What is queued is sent
        # when this process ends (the controller's copy has no ``finish``; Ray ends it gracefully), or by
        # ``finish`` (the driver's copy).
        atexit.register(self.tracking.flush)
        if self.tracking.active:
            self.status.record("tracking", self.tracking.status())
            self.tracking.attempt(0, self.config.attempt)
        self.ledger = cost.CostLedger(
            path=self.paths.run_dir / "trainop" / cost.LEDGER,
            launch_id=self.launch_id,
            started_at=self.started_at,
        )
        self.record = run_record.RunRecord(paths=self.paths, launch_id=self.launch_id, is_rank0=True)
        self.reports = 0
        self.worker_restarts = 0
        self._last_report_time = time.time()
        self._opened = True

    def __getstate__(self) -> dict[str, Any]:
        # Only the settings travel to the controller: sinks and threads are opened there.
        return {"config_json": self.config_json, "launch_id": self.launch_id, "started_at": self.started_at}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.config_json = state["config_json"]
        self.launch_id = state["launch_id"]
        self.started_at = state["started_at"]
        self._opened = False

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        try:
            self._after_report(metrics[0] if metrics else {}, checkpoint)
        except Exception:
            log.exception("trainop status callback failed (training goes on)")

    def _after_report(self, reported: dict[str, Any], checkpoint: Any) -> None:
        if not self._opened:
            self._open()
        self.reports += 1
        now = time.time()
        # Reports come from the function's loop: the time between them is training time.
        self.ledger.training_seconds += now - self._last_report_time
        self._last_report_time = now
        step = _as_int(reported.get("step"), self.reports)
        epoch = _as_int(reported.get("epoch"), 0)
        loss = _as_float(reported.get("loss"))
        self.status.progress(
            step=step,
            total_steps=None,
            epoch=epoch,
            loss=loss,
            samples_per_second=_as_float(reported.get("samples_per_second")),
            eta_seconds=None,
            worker_restarts=self.worker_restarts,
        )
        evaluation = evaluation_metrics(reported)
        if evaluation:
            self.status.record(
                "evaluation",
                experiment.EvaluationStatus(
                    step=step, epoch=epoch, metrics=evaluation, time=run_record.utc_now()
                ),
            )
        path = getattr(checkpoint, "path", None)
        if path is not None:
            self.status._publish(
                {
                    "checkpoint": trainingjob.CheckpointStatus(
                        step=step,
                        epoch=epoch,
                        path=str(path),
                        time=run_record.utc_now(),
                        metrics={k: float(v) for k, v in reported.items() if _as_float(v) is not None},
                    ).to_wire()
                }
            )
        numbers = {k: float(v) for k, v in reported.items() if _as_float(v) is not None}
        self.tracking.report(step, numbers)
        if evaluation:
            self.tracking.evaluation(step, evaluation)
        if path is not None:
            self.tracking.checkpoint("latest", path=str(path), step=step, metrics=numbers)
        self.record._event("report", step=step, epoch=epoch, metrics=numbers, checkpoint=path)
        self._publish_cost()

    def _publish_cost(self) -> None:
        self.ledger.save()
        allocated, training = self.ledger.totals()
        spec = self.config.spec
        self.status.record(
            "cost",
            cost.cost_status(
                gpus=spec.workers.replicas * spec.workers.gpus_per_worker,
                allocated_seconds=allocated,
                training_seconds=training,
                pricing=self.config.pricing,
                updated=run_record.utc_now(),
            ),
        )

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        try:
            if not self._opened:
                self._open()
            self.worker_restarts += 1
            self._last_report_time = time.time()  # the restart is idle time
            first = next(iter(worker_exceptions.values()), None)
            log.warning(
                "worker group failed (%s); Ray Train restarts it from the newest checkpoint if failures "
                "are left",
                f"{type(first).__name__}: {first}" if first is not None else "?",
            )
        except Exception:
            log.exception("trainop status callback failed (training goes on)")

    def finish(self, *, completed: bool) -> None:
        """On the driver, after ``fit()``: the last cost record, the MLflow run's end."""
        if not self._opened:
            self._open()
        self._publish_cost()
        self.tracking.close(completed=completed)
        self.status.close()


def _as_int(value: Any, default: int) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _as_float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# ----------------------------------------------------------------------------------------- the driver
def run_config(
    config: trainer_config.TrainerConfig, *, worker_env: dict[str, str], callbacks: list[Any]
) -> Any:
    """Ray Train's ``RunConfig`` for ``config``: the run's name and where it is stored, as the built-in
    loop's TorchTrainer has them (``ray_train.torch_trainer``): a bucket's path with the filesystem of
    ``spec.checkpoint.storage.s3`` (endpoint, region, the environment's credentials), else the volume's."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig

    spec = config.spec
    where: dict[str, Any] = {"storage_path": config.storage_path}
    root = config_module.paths_for(config).run_dir.parent
    if isinstance(root, storage.StoragePath):
        where = {"storage_path": root.path, "storage_filesystem": root.fs}
    return RunConfig(
        name=config.run_name,
        **where,
        failure_config=FailureConfig(max_failures=spec.failure_policy.max_worker_failures),
        checkpoint_config=CheckpointConfig(num_to_keep=spec.checkpoint.keep_last),
        worker_runtime_env={"env_vars": worker_env},
        callbacks=callbacks,
    )  # type: ignore[call-arg]  # (mypy sees Ray Train V1's RunConfig; V2's has worker_runtime_env)


def run(config: trainer_config.TrainerConfig, *, worker_env: dict[str, str]) -> tuple[str, str | None]:
    """Train ``config``'s Ray Train function on the connected Ray cluster; (outcome, error)."""
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.train.v2.api.exceptions import TrainingFailedError

    spec = config.spec
    resolve(spec)  # fail before any worker starts
    scaling = config_module.scaling_for(spec)
    launch = config_module.LaunchSettings(
        config_json=config_module.dumps(config), launch_id=uuid.uuid4().hex, started_at=time.time()
    )
    callback = StatusCallback(
        config_json=launch.config_json,
        launch_id=launch.launch_id,
        started_at=launch.started_at or time.time(),
    )
    trainer = TorchTrainer(
        run_function,
        train_loop_config={**spec.workload.config, _TRAINOP_KEY: launch.to_dict()},
        scaling_config=ScalingConfig(
            num_workers=scaling.num_workers,
            use_gpu=scaling.use_gpu,
            resources_per_worker=scaling.resources_per_worker,
        ),
        run_config=run_config(config, worker_env=worker_env, callbacks=[callback]),
    )
    log.info("starting %s (Ray Train function %s)", config_module.describe(config), spec.workload.ray_train)
    paths = config_module.paths_for(config)
    error: str | None = None
    try:
        trainer.fit()
    except TrainingFailedError as exc:
        outcome, error = "failed", str(exc)
    else:
        outcome = "completed"
    try:
        callback.finish(completed=outcome == "completed")
    except Exception:
        log.exception("closing the run's status and tracking failed")
    (paths.run_dir / "trainop").mkdir(parents=True, exist_ok=True)
    (paths.run_dir / "trainop" / "outcome.json").write_text(
        json.dumps({"launch": launch.launch_id, "outcome": outcome, "step": None})
    )
    return outcome, error
