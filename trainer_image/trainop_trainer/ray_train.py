"""Orchestration on Ray Train V2: the driver that builds the ``TorchTrainer`` and the worker function.

Driver (``run``): ``ScalingConfig`` from ``config.scaling_for`` (one worker per GPU),
``RunConfig(name=runName, storage_path=storagePath, failure_config=FailureConfig(max_failures=...))`` with
``spec.failurePolicy.maxWorkerFailures``. Failures inside an attempt are Ray Train's: it restarts the
worker group, and the workers resume from the newest valid checkpoint in
``<storagePath>/<runName>/checkpoints``. A new attempt is a new ``TorchTrainer`` with the same name and
storage path; it finds the same checkpoints (``checkpoint.py`` says why Ray's own registry is not used).

Worker (``train_loop_per_worker``): read the launch settings, start the ``Runtime``, run the built-in
``Trainer`` or the user's function, then end according to the outcome:
- completed / stopped: return normally (``fit()`` returns);
- preempted: the process that received SIGTERM exits 0 right after the checkpoint; the other ranks raise
  ``WorkerPreempted`` so Ray Train restarts the group from that checkpoint.

Environment for the workers (``RunConfig.worker_runtime_env``): the NCCL profile's variables when the profile
is explicit (``auto`` is resolved on each node by the worker), ``PYTHONPATH``, ``TRAINOP_PID_DIR`` and the
benchmark knobs (``config.BENCH_ENV``) of the driver if set, so user packages, the preStop hook and the GPU
benchmark work the same way locally. Every Ray worker process of the job runs ``logs.ray_worker_setup``
(Ray's ``worker_process_setup_hook``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

from trainop.api import trainer_config
from trainop_trainer import config as config_module
from trainop_trainer import nccl

log = logging.getLogger(__name__)

_FORWARDED_ENV = ("PYTHONPATH", config_module.PID_DIR_ENV, *config_module.BENCH_ENV)
# Where Ray (2.60) says, on every start of a local Ray, that it turned token authentication on.
_TOKEN_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"
_TOKEN_NOTICE = "Token authentication is enabled for this Ray cluster"
# Runs in every Ray worker process of the job (the Train controller, its workers, Ray Train's helpers).
_WORKER_SETUP_HOOK = "trainop_trainer.logs.ray_worker_setup"


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Runs on every Ray Train worker."""
    import ray.train

    from trainop_trainer import distributed, preempt
    from trainop_trainer.logs import configure_logging
    from trainop_trainer.runtime import Runtime, WorkerPreempted
    from trainop_trainer.step_schedule import Outcome

    started = time.perf_counter()
    launch = config_module.LaunchSettings.from_dict(loop_config)
    config = launch.config
    ctx = distributed.from_ray()
    configure_logging(rank=ctx.rank)
    runtime = Runtime.start(config=config, ctx=ctx, launch=launch, report_fn=ray.train.report)
    if ctx.is_rank0:
        log.info("runtime up in %.1fs (network, metrics, checkpointer, probe)", time.perf_counter() - started)
    try:
        outcome = run_workload(runtime)
    finally:
        runtime.close()
    if outcome == Outcome.PREEMPTED:
        if preempt.requested():
            log.warning("rank %d: received SIGTERM; checkpoint written, exiting 0", ctx.rank)
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        raise WorkerPreempted(
            f"rank {ctx.rank}: another worker received SIGTERM; its checkpoint is written and Ray Train "
            "restarts the worker group from it"
        )


def run_workload(runtime: Any) -> Any:
    """The built-in Trainer or the user's entrypoint, on an already started ``Runtime``."""
    from trainop_trainer import user, workloads
    from trainop_trainer.trainer import Trainer

    if runtime.spec.workload.entrypoint is not None:
        return user.run(runtime)
    # Every start of a worker group pays this: its time is part of a recovery (docs/benchmarks-gpu.md).
    started = time.perf_counter()
    workload = workloads.build(runtime.spec)
    built = time.perf_counter()
    trainer = Trainer(runtime=runtime, workload=workload)
    if runtime.ctx.is_rank0:
        log.info(
            "%s built in %.1fs; trainer set up in %.1fs (device, parallelism, optimizer, data)",
            workload.name,
            built - started,
            time.perf_counter() - built,
        )
    return trainer.train()


@dataclasses.dataclass(frozen=True)
class RunResult:
    outcome: str  # "completed" | "stopped" | "preempted" | "failed"
    step: int | None
    error: str | None = None

    @property
    def exit_code(self) -> int:
        return 1 if self.outcome == "failed" else 0


def worker_env(config: trainer_config.TrainerConfig) -> dict[str, str]:
    network = config.spec.network
    env = nccl.nccl_env(network.profile.value, network.nccl_env, None)
    for key in _FORWARDED_ENV:
        if os.environ.get(key):
            env[key] = os.environ[key]
    return env


def _drop_token_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_TOKEN_NOTICE)


def ensure_ray(
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    log_to_driver: bool = True,
    quiet: bool = False,
) -> None:
    """Connect to the Ray cluster of RAY_ADDRESS (KubeRay sets it), or start a local one. ``quiet``: Ray's
    own INFO lines on this process (``Started a local Ray instance``) are not shown, its warnings are."""
    import ray

    if ray.is_initialized():
        return
    level = logging.WARNING if quiet else logging.INFO
    # trainer_config.RAY_TRAIN_ENV (the preemption watcher off), unless the environment says otherwise.
    # Before ray.init: a local raylet, and through it every Ray worker (a sweep's trial drivers call fit()
    # there), inherits it; fit() in this process hands it to the Train controller.
    for key, value in trainer_config.RAY_TRAIN_ENV.items():
        os.environ.setdefault(key, value)
    runtime_env = {"worker_process_setup_hook": _WORKER_SETUP_HOOK}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=log_to_driver, logging_level=level, runtime_env=runtime_env)
        return
    # A local Ray turns token authentication on by default (good: nothing else on the machine can submit
    # work to it) and says so at WARNING level on every run, although there is nothing to act on. The
    # notice is dropped; the mode is Ray's default either way (RAY_AUTH_MODE still decides).
    logging.getLogger(_TOKEN_NOTICE_LOGGER).addFilter(_drop_token_notice)
    # address="local": always a new runtime of our size, even when another Ray runs on this machine
    # (without it ray.init joins that one and refuses num_cpus).
    ray.init(
        address="local",
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        include_dashboard=False,
        log_to_driver=log_to_driver,
        logging_level=level,
        runtime_env=runtime_env,
    )


def _read_outcome(paths: config_module.RunPaths, launch_id: str) -> tuple[str, int | None]:
    path = paths.run_dir / "trainop" / "outcome.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return "completed", None
    if data.get("launch") != launch_id:
        return "completed", None
    return str(data["outcome"]), int(data["step"])


def torch_trainer(
    config: trainer_config.TrainerConfig,
    *,
    launch_id: str,
    inject_failure_at_step: int | None,
    callbacks: Sequence[Any] = (),
) -> Any:
    """The TorchTrainer that runs ``config``: one worker per GPU (``config.scaling_for``), the launch
    settings as its loop config, the job's worker-failure budget and worker env. Shared by a job's run and
    a sweep's trials (which add their report callback)."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    spec = config.spec
    scaling = config_module.scaling_for(spec)
    launch = config_module.LaunchSettings(
        config_json=config_module.dumps(config),
        launch_id=launch_id,
        inject_failure_at_step=inject_failure_at_step,
        started_at=time.time(),
    )
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=launch.to_dict(),
        scaling_config=ScalingConfig(
            num_workers=scaling.num_workers,
            use_gpu=scaling.use_gpu,
            resources_per_worker=scaling.resources_per_worker,
        ),
        run_config=RunConfig(
            name=config.run_name,
            storage_path=config.storage_path,
            failure_config=FailureConfig(max_failures=spec.failure_policy.max_worker_failures),
            worker_runtime_env={"env_vars": worker_env(config)},
            callbacks=list(callbacks),
        ),  # type: ignore[call-arg]  # (mypy sees Ray Train V1's RunConfig; V2's has worker_runtime_env)
    )


def run(config: trainer_config.TrainerConfig, *, inject_failure_at_step: int | None = None) -> RunResult:
    """Train ``config`` on the connected Ray cluster (call ``ensure_ray`` first). Blocks until done."""
    from ray.train.v2.api.exceptions import TrainingFailedError

    from trainop_trainer import user

    spec = config.spec
    if spec.workload.entrypoint is not None:
        user.resolve(spec.workload.entrypoint)  # fail before any worker starts
    storage_path = os.path.abspath(config.storage_path)
    config = config.model_copy(update={"storage_path": storage_path})
    if spec.workload.ray_train is not None:
        from trainop_trainer import raytrain_function

        outcome, error = raytrain_function.run(config, worker_env=worker_env(config))
        return RunResult(outcome=outcome, step=None, error=error)
    launch_id = uuid.uuid4().hex
    trainer = torch_trainer(config, launch_id=launch_id, inject_failure_at_step=inject_failure_at_step)
    log.info("starting %s", config_module.describe(config))
    paths = config_module.paths_for(config)
    paths.stop_file.unlink(missing_ok=True)  # a stop request belongs to the launch that received it
    try:
        trainer.fit()
    except TrainingFailedError as exc:
        return RunResult(outcome="failed", step=None, error=str(exc))
    outcome, step = _read_outcome(paths, launch_id)
    return RunResult(outcome=outcome, step=step)
