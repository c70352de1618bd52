"""Orchestration on Ray Train V2: the driver that builds the ``TorchTrainer`` and the worker function.

Driver (``run``): ``ScalingConfig`` from ``config.scaling_for`` (one worker per GPU),
``RunConfig(name=runName, storage_path=storagePath, failure_config=FailureConfig(max_failures=0))`` with
trainop's failure policy (``restart_policy``),
``TorchConfig(timeout_s=stallTimeoutSeconds + 60)``; with checkpoints in a bucket, ``storage_path`` is
``bucket/prefix`` on a pyarrow ``S3FileSystem`` (``storage_filesystem``), so Ray Train's own files go where
the checkpoints go and no Ray node needs a shared volume (``__main__`` first runs ``check_storage``: a test
object written where the checkpoints go, the verdict reported as ``status.storage``). Failures inside an
attempt are trainop's to decide (issue #17): each rank reports what it raised, classified (``failures``),
and the watchdog its Stalled verdict, through a TCPStore the driver serves (``watchdog``); trainop's failure
policy inside Ray Train's controller (``restart_policy``) picks the cause (``classify_run_failure``) and, for
UserCodeError, Stalled, NCCLError, OOMKilled and Unknown, while the class's budget
(``spec.failurePolicy.budgets``, used = the operator's restartsByReason + the trainer's counts) and
``maxWorkerFailures`` allow, restarts the worker group in the same controller: the new group resumes from
the newest valid checkpoint in ``<storagePath>/<runName>/checkpoints``. The driver records each decision on
``status.workerFailures`` (``FailureBook``). Otherwise the attempt fails, its entry ``restarted: false`` for
the operator. A failure the policy did not decide is the driver's, with the same rule (``failures.decide``):
it runs ``fit()`` again. A new attempt is a new ``TorchTrainer`` with the same name and storage
path; it finds the same checkpoints (``checkpoint.py`` says why Ray's own registry is not used).

Worker (``train_loop_per_worker``): read the launch settings, start the ``Runtime``, run the built-in
``Trainer`` or the user's function, then end according to the outcome:
- completed / stopped: return normally (``fit()`` returns);
- preempted: the process that received SIGTERM exits 0 right after the checkpoint; the other ranks raise
  ``WorkerPreempted``, classified Preempted: the attempt ends (its pod is going away), the next resumes;
- any exception: classified (``failures.classify_exception``), reported to the driver, raised again.

Environment for the workers (``RunConfig.worker_runtime_env``): the NCCL profile's variables when the profile
is explicit (``auto`` is resolved on each node by the worker), niceness 0 (``RAY_worker_niceness``; Ray's
default for its workers is 15: switches ``niceness``), ``PYTHONPATH``, ``TRAINOP_PID_DIR``,
``TRAINOP_DATA_DIR``, ``TRAINOP_RAY_REPORT_MIN_INTERVAL_S`` and the benchmark knobs (``config.BENCH_ENV``) of
the driver if set, so user packages, the preStop hook, spec.data, the report pace and the GPU benchmark work
the same way locally and in worker pods. Never the bucket credentials: a
runtime env is visible on Ray's dashboard; every Ray container has them from the Secret. Every Ray worker
process of the job runs ``logs.ray_worker_setup`` (Ray's ``worker_process_setup_hook``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

from trainop.api import trainer_config, trainingjob
from trainop_trainer import config as config_module
from trainop_trainer import nccl, storage, switches

log = logging.getLogger(__name__)

RAY_NICENESS_ENV = "RAY_worker_niceness"  # read by each Ray worker process as it starts
_FORWARDED_ENV = (
    "PYTHONPATH",
    RAY_NICENESS_ENV,
    config_module.PID_DIR_ENV,
    trainer_config.DATA_DIR_ENV,
    config_module.RAY_REPORT_MIN_INTERVAL_ENV,
    *config_module.BENCH_ENV,
)
# Where Ray (2.60) says, on every start of a local Ray, that it turned token authentication on.
_TOKEN_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"
_TOKEN_NOTICE = "Token authentication is enabled for this Ray cluster"
# Runs in every Ray worker process of the job (the Train controller, its workers, Ray Train's helpers).
_WORKER_SETUP_HOOK = "trainop_trainer.logs.ray_worker_setup"


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Runs on every Ray Train worker."""
    import ray.train

    from trainop_trainer import distributed, failures, preempt, watchdog
    from trainop_trainer.logs import configure_logging
    from trainop_trainer.runtime import Runtime, WorkerPreempted
    from trainop_trainer.step_schedule import Outcome

    started = time.perf_counter()
    launch = config_module.LaunchSettings.from_dict(loop_config)
    config = launch.config
    ctx = distributed.from_ray()
    configure_logging(rank=ctx.rank)
    store = watchdog.connect(launch.heartbeat_store)
    launch = dataclasses.replace(launch, attempt_try=watchdog.generation(store, launch.attempt_try))
    runtime: Runtime | None = None
    try:
        runtime = Runtime.start(
            config=config, ctx=ctx, launch=launch, report_fn=ray.train.report, store=store
        )
        if ctx.is_rank0:
            log.info(
                "runtime up in %.1fs (network, metrics, checkpointer, probe)", time.perf_counter() - started
            )
        try:
            outcome = run_workload(runtime)
        finally:
            runtime.close()
        if outcome == Outcome.PREEMPTED and not preempt.requested():
            raise WorkerPreempted(
                f"rank {ctx.rank}: another worker received SIGTERM and wrote a checkpoint; the attempt ends "
                "so that the next one resumes from it"
            )
    except BaseException as exc:
        # What this rank saw, classified, for the driver (which decides on a restart): through the store.
        step = runtime.heartbeat.step if runtime is not None else None
        failure = failures.classify_exception(exc, rank=ctx.rank, step=step)
        log.error("rank %d failed (%s): %s", ctx.rank, failure.reason, failure.message)
        report_failure(store, launch.attempt_try, ctx.rank, failure)
        raise
    if outcome == Outcome.PREEMPTED and preempt.requested():
        log.warning("rank %d: received SIGTERM; checkpoint written, exiting 0", ctx.rank)
        # Its own word before its process ends: the controller may find this rank dead before the other
        # ranks' WorkerPreempted reaches it, and a death nobody explained is Unknown (restarted inside the
        # attempt, on a pod that is going away). Seen on the cluster bed, 2026-11-28.
        step = runtime.heartbeat.step if runtime is not None else None
        report_failure(store, launch.attempt_try, ctx.rank, preempted(ctx.rank, step))
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def preempted(rank: int, step: int | None) -> Any:
    """The Preempted failure a rank that received SIGTERM reports once its checkpoint is written."""
    from trainop_trainer import failures

    at = f" at step {step}" if step is not None else ""
    return failures.Failure(
        failures.PREEMPTED,
        f"rank {rank} received SIGTERM (its pod is going away) and wrote a checkpoint{at}; the attempt ends "
        "so that the next one resumes from it",
        rank,
        step,
    )


def report_failure(store: Any, attempt_try: int, rank: int, failure: Any) -> None:
    """A rank's classified failure into the driver's store (nothing without one)."""
    from trainop_trainer import watchdog

    if store is None:
        return
    try:
        store.set(watchdog.store_key(attempt_try, "failure", rank), json.dumps(failure.to_dict()))
    except Exception as exc:
        log.warning("reporting the failure to the driver failed (%s)", exc)


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


def check_storage(config: trainer_config.TrainerConfig) -> storage.StorageError | None:
    """Before any worker starts: can this container write where the run's checkpoints go? A test object is
    written, read back and deleted under ``<storagePath>/<runName>``; the verdict goes to
    ``status.storage`` (when the config names a status target) and the log. Returns the problem, if any
    (a missing credentials Secret, a missing bucket, refused keys, an unreachable endpoint)."""
    from trainop_trainer.status import KubernetesSink, StatusReporter

    location = f"{config.storage_path.rstrip('/')}/{config.run_name}"
    problem: storage.StorageError | None = None
    try:
        storage.check_writable(config_module.paths_for(config).run_dir)
    except storage.StorageError as exc:
        problem = exc
    if problem is None:
        reason, message = "Writable", f"{location} is writable: a test object was written, read and deleted."
        log.info("checkpoint storage: %s", message)
    else:
        reason, message = problem.reason, problem.message
        log.error("checkpoint storage %s cannot be used: %s", location, message)
    if config.status_target is not None:
        reporter = StatusReporter([KubernetesSink(config.status_target)])
        reporter.storage(
            location=location, ready=problem is None, reason=reason, message=message, attempt=config.attempt
        )
        reporter.close()
    return problem


# The process-group (NCCL, gloo) timeout is this far above spec.failurePolicy.stallTimeoutSeconds, so the
# trainer's watchdog, which names the stuck rank and dumps stacks, speaks before NCCL's own.
PG_TIMEOUT_MARGIN_S = 60


def process_group_timeout_s(policy: trainingjob.FailurePolicy) -> int | None:
    """None: Ray Train's default (30 min), when the watchdog is off."""
    if not policy.trainer_watchdog or not policy.stall_timeout_seconds:
        return None
    return policy.stall_timeout_seconds + PG_TIMEOUT_MARGIN_S


def worker_env(config: trainer_config.TrainerConfig) -> dict[str, str]:
    network = config.spec.network
    env = nccl.nccl_env(network.profile.value, network.nccl_env, None)
    # A collective that times out aborts its communicator and raises, instead of hanging (PyTorch's default
    # since 2.2; set so that no image's or user's setting turns it off unnoticed).
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if switches.training_niceness():
        # Ray starts its workers at niceness 15; a training worker runs at 0, as under torchrun (switches.py).
        env[RAY_NICENESS_ENV] = "0"
    for key in _FORWARDED_ENV:
        if os.environ.get(key):
            env[key] = os.environ[key]
    return env


def _drop_token_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_TOKEN_NOTICE)


def _raylet_errors_to_log() -> None:
    """Quiet mode: the errors the raylet publishes to this driver go to this module's log, not to stdout.

    A Ray driver prints every error the raylet publishes to its job on stdout, whatever ``log_to_driver``
    says (Ray 2.60's ``ray._private.worker.listen_error_messages``). When a worker process dies that is a
    paragraph beginning "(raylet) A worker died or was killed while executing a task by an unexpected system
    error", which lists OOM and ``ray stop --force`` as causes. The trainer's own line right after it names
    the rank, the exit and what happens next (a restart from the newest checkpoint), so a quiet run shows
    that line only: the raylet's paragraph goes to this module's logger at INFO, which a quiet run does not
    show. It stays in the raylet's log of the Ray session, and ``--verbose`` prints it as Ray does. What the
    listener prints for others (the autoscaler) is printed as Ray prints it."""
    from ray._private import worker as ray_worker

    printer = ray_worker.print_to_stdstream
    if getattr(printer, "_trainop_quiet", False):
        return

    def print_or_log(data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") == "raylet":
            for line in data.get("lines") or ():
                log.info("raylet: %s", line)
            return
        printer(data, ignore_prefix)

    print_or_log._trainop_quiet = True  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = print_or_log


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
    if trainer_config.warm_spares_enabled():
        # A local runtime's raylet is started by ray.init below: its workers preload what a spare needs.
        for key, value in trainer_config.spare_raylet_env().items():
            os.environ.setdefault(key, value)
    runtime_env = {"worker_process_setup_hook": _WORKER_SETUP_HOOK}
    if quiet:
        _raylet_errors_to_log()
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
    try:
        data = json.loads(paths.outcome_file.read_text())
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
    max_failures: int | None = None,
    heartbeat_store: str | None = None,
    attempt_try: int = 0,
    failure_policy: Any = None,
) -> Any:
    """The TorchTrainer that runs ``config``: one worker per GPU (``config.scaling_for``), the launch
    settings as its loop config, the job's worker-failure budget and worker env. Shared by a job's run and
    a sweep's trials (which add their report callback). With ``failure_policy`` (a callable of Ray's
    ``FailureConfig``), its controller decides restarts with that policy (``restart_policy``)."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig

    from trainop_trainer.lean_trainer import LeanTorchTrainer

    spec = config.spec
    scaling = config_module.scaling_for(spec)
    launch = config_module.LaunchSettings(
        config_json=config_module.dumps(config),
        launch_id=launch_id,
        inject_failure_at_step=inject_failure_at_step,
        started_at=time.time(),
        heartbeat_store=heartbeat_store,
        attempt_try=attempt_try,
    )
    torch_config: dict[str, Any] = {}
    pg_timeout = process_group_timeout_s(spec.failure_policy)
    if pg_timeout is not None:
        from ray.train.torch import TorchConfig

        torch_config["torch_config"] = TorchConfig(timeout_s=pg_timeout)
    if max_failures is None:
        max_failures = spec.failure_policy.max_worker_failures
    where: dict[str, Any] = {"storage_path": config.storage_path}
    root = config_module.paths_for(config).run_dir.parent
    if isinstance(root, storage.StoragePath):
        where = {"storage_path": root.path, "storage_filesystem": root.fs}
    trainer_class: Any = LeanTorchTrainer
    policy_kwargs: dict[str, Any] = {}
    if failure_policy is not None:
        from trainop_trainer import restart_policy

        trainer_class = restart_policy.PolicyTorchTrainer
        policy_kwargs["failure_policy"] = failure_policy
        # Spares only serve in-attempt restarts: none where every failure ends the attempt.
        policy_kwargs["warm_spares"] = (
            trainer_config.warm_spares_enabled() and spec.failure_policy.max_worker_failures > 0
        )
    return trainer_class(
        train_loop_per_worker,
        train_loop_config=launch.to_dict(),
        scaling_config=ScalingConfig(
            num_workers=scaling.num_workers,
            use_gpu=scaling.use_gpu,
            resources_per_worker=scaling.resources_per_worker,
        ),
        run_config=RunConfig(
            name=config.run_name,
            **where,
            failure_config=FailureConfig(max_failures=max_failures),
            worker_runtime_env={"env_vars": worker_env(config)},
            callbacks=list(callbacks),
        ),  # type: ignore[call-arg]  # (mypy sees Ray Train V1's RunConfig; V2's has worker_runtime_env)
        **torch_config,
        **policy_kwargs,
    )


def run(config: trainer_config.TrainerConfig, *, inject_failure_at_step: int | None = None) -> RunResult:
    """Train ``config`` on the connected Ray cluster (call ``ensure_ray`` first). Blocks until done."""
    from ray.train.v2.api.exceptions import TrainingFailedError

    from trainop_trainer import user

    spec = config.spec
    if spec.workload.entrypoint is not None:
        user.resolve(spec.workload.entrypoint)  # fail before any worker starts
    if not storage.is_object_uri(config.storage_path):
        config = config.model_copy(update={"storage_path": os.path.abspath(config.storage_path)})
    if spec.workload.ray_train is not None:
        from trainop_trainer import raytrain_function

        outcome, error = raytrain_function.run(config, worker_env=worker_env(config))
        return RunResult(outcome=outcome, step=None, error=error)
    from trainop_trainer import failures, preempt, watchdog

    launch_id = uuid.uuid4().hex
    log.info("starting %s", config_module.describe(config))
    paths = config_module.paths_for(config)
    paths.stop_file.unlink(missing_ok=True)  # a stop request belongs to the launch that received it
    store, address = _heartbeat_store()
    book = FailureBook(config, status_file=paths.status_file)
    policy_spec = spec.failure_policy
    world_size = config_module.scaling_for(spec).num_workers
    restarts = 0
    in_controller = (
        store is not None
        and address is not None
        and switches.restarts_in_controller()
        and _policy_supported()
    )
    while True:
        # Restarts inside the attempt: decided by trainop's failure policy inside Ray Train's controller
        # (restart_policy: only the worker group restarts), else by this loop after fit() failed (a new
        # controller); either way classified first, so that each class's budget is enforced.
        group = watchdog.generation(store, restarts)
        watcher, policy = None, None
        if in_controller:
            from trainop_trainer import restart_policy

            policy = functools.partial(
                restart_policy.BudgetedFailurePolicy,
                config=config,
                store_address=address or "",
                world_size=world_size,
                used={reason: book.used(reason) for reason in failures.REASONS},
                restarts=restarts,
            )
            watcher = restart_policy.DecisionWatcher(
                store, functools.partial(_record_decision, book), first=group
            ).start()
        trainer = torch_trainer(
            config,
            launch_id=launch_id,
            inject_failure_at_step=inject_failure_at_step,
            max_failures=0,
            heartbeat_store=address,
            attempt_try=restarts,
            failure_policy=policy,
        )
        failed: TrainingFailedError | None = None
        try:
            fit_beside_driver_handler(trainer)
        except TrainingFailedError as exc:
            failed = exc
        decided = watcher.close() if watcher is not None else None
        if decided is not None:
            restarts = int(decided["restarts"])
        if failed is None:
            break
        if decided is None or not decided["why"]:
            # A failure the policy did not decide (a worker group that could not start, no policy): ours.
            group = watchdog.generation(store, restarts)
            failed_ranks = sorted(getattr(failed, "worker_failures", None) or {}) or None
            failure = classify_run_failure(store, group, world_size, str(failed), failed_ranks=failed_ranks)
            decided = failures.decide(
                failure,
                used=book.used(failure.reason),
                allowed=failures.budget(policy_spec, failure.reason),
                restarts=restarts,
                max_worker_failures=policy_spec.max_worker_failures,
                stopping=preempt.requested(),
                generation=group,
            )
            _record_decision(book, decided)
            if not decided["why"]:
                restarts = decided["restarts"]
                if store is not None:
                    store.add(watchdog.GENERATION_KEY, 1)
                continue
        failure = failures.Failure.from_dict(decided["failure"])
        return RunResult(
            outcome="failed", step=None, error=f"{failure.reason}: {failure.message} ({decided['why']})"
        )
    outcome, step = _read_outcome(paths, launch_id)
    return RunResult(outcome=outcome, step=step)


def fit_beside_driver_handler(trainer: Any) -> Any:
    """``trainer.fit()``, on a thread of its own while the driver's SIGTERM/SIGINT handler is installed
    (``preempt.install_driver_handler``) and this is the main thread.

    On the main thread Ray Train's fit() replaces the process's SIGINT handler with its own, which aborts
    the controller: the workers are stopped without trainop's checkpoint-and-stop, and the driver exits 1
    printing nothing (seen 2026-11-29: Ctrl+C on `trainop run`). Off the main thread fit() leaves the
    handler alone; the main thread waits in short joins, so that Python runs the handler at once."""
    import threading

    from trainop_trainer import preempt

    if threading.current_thread() is not threading.main_thread() or not preempt.driver_handler_installed():
        return trainer.fit()
    outcome: dict[str, Any] = {}

    def fit() -> None:
        try:
            outcome["result"] = trainer.fit()
        except BaseException as exc:  # re-raised on the main thread
            outcome["error"] = exc

    thread = threading.Thread(target=fit, name="trainop-fit", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.5)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("result")


def _policy_supported() -> bool:
    """Whether restarts can be decided inside Ray Train's controller (``restart_policy``)."""
    try:
        from trainop_trainer import restart_policy
    except ImportError as exc:  # a Ray Train without the private modules the policy builds on
        log.warning("in-attempt restarts start a new Ray Train controller: %s", exc)
        return False
    if not restart_policy.supported():
        log.warning("in-attempt restarts start a new Ray Train controller: this Ray Train has no policy hook")
        return False
    return True


def _record_decision(book: FailureBook, decision: dict[str, Any]) -> None:
    """A restart decision (the failure policy's or the driver's) on status.workerFailures and in the log."""
    from trainop_trainer import failures

    failure = failures.Failure.from_dict(decision["failure"])
    why = str(decision["why"])
    book.record(failure, restarted=not why)
    if why:
        log.error("worker group failed (%s): %s; the attempt ends: %s", failure.reason, failure.message, why)
        return
    log.warning(
        "worker group failed (%s): %s; restarting it from the newest checkpoint (restart %d of this attempt; "
        "%s used %d of %d)",
        failure.reason,
        failure.message,
        decision["restarts"],
        failure.reason,
        decision["used"],
        decision["allowed"],
    )


def _heartbeat_store() -> tuple[Any, str | None]:
    """A TCPStore served by this driver for the workers' heartbeats and failure reports (watchdog.py): not
    by a worker, so that a frozen worker freezes nobody else's store. Its address as the workers reach it."""
    import datetime

    import ray
    import torch.distributed as dist

    try:
        store = dist.TCPStore(  # type: ignore[attr-defined]
            "0.0.0.0",
            0,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=30),
        )
    except Exception as exc:
        log.warning("no heartbeat store (%s): each rank's watchdog watches only itself", exc)
        return None, None
    return store, f"{ray.util.get_node_ip_address()}:{store.port}"  # type: ignore[no-untyped-call]


def classify_run_failure(
    store: Any,
    attempt_try: int,
    world_size: int,
    ray_error: str,
    *,
    failed_ranks: Sequence[int] | None = None,
) -> Any:
    """The cause of a failed worker group: the ranks' own reports (the watchdog's Stalled, a user's
    exception, ...), a cause before its consequences (a broken collective on the other ranks); when the only
    reports are broken collectives and a rank said nothing (its process died), Ray's error text about it.
    ``failed_ranks`` (the ranks Ray's error names) tells a dead rank from one still blocked in a collective:
    the failure policy decides while the other ranks may not have noticed yet."""
    from trainop_trainer import failures, watchdog

    reports: list[failures.Failure] = []
    silent: list[int] = []
    for rank in range(world_size):
        key = watchdog.store_key(attempt_try, "failure", rank)
        try:
            if store is not None and store.check([key]):
                reports.append(failures.Failure.from_dict(json.loads(store.get(key))))
                continue
        except Exception as exc:
            log.warning("reading rank %d's failure report failed (%s)", rank, exc)
        silent.append(rank)
    if failed_ranks is not None and set(silent) & set(failed_ranks):
        silent = [rank for rank in silent if rank in failed_ranks]
    causes = [r for r in reports if r.reason != failures.NCCL_ERROR]
    if failed_ranks:
        # Within a class, the dead rank's own word first (a preempted rank's, before the peers that only
        # learned of it): a stable sort keeps rank order otherwise.
        causes.sort(key=lambda report: report.rank not in failed_ranks)
    if causes:
        chosen = failures.choose(causes)
        assert chosen is not None
        return chosen
    from_ray = failures.classify_text(ray_error)
    if silent and (reports or from_ray.reason != failures.NCCL_ERROR):
        dead = silent[0] if len(silent) == 1 else None
        reason = failures.UNKNOWN if from_ray.reason == failures.NCCL_ERROR else from_ray.reason
        who = f"rank {dead}'s worker process" if dead is not None else "a worker process"
        return failures.Failure(reason, f"{who} died: {from_ray.message}", dead)
    return failures.choose(reports) or from_ray


class FailureBook:
    """The driver's ``status.workerFailures``: cumulative counts per class over the job's attempts (read at
    start from the CR, or status.json in local mode), the newest 10 entries first."""

    def __init__(self, config: trainer_config.TrainerConfig, *, status_file: storage.RunDir) -> None:
        from trainop_trainer import status

        self.config = config
        self.status_file = status_file
        current = status.read_status(config, status_file=status_file)
        recorded = trainingjob.WorkerFailures.model_validate(current.get("workerFailures") or {})
        self.counts = dict(recorded.counts)
        self.last = list(recorded.last)
        self.by_reason = {str(k): int(v) for k, v in (current.get("restartsByReason") or {}).items()}

    def used(self, reason: str) -> int:
        """used(X): the operator's new attempts of class X plus the trainer's in-attempt restarts of it."""
        return self.by_reason.get(reason, 0) + self.counts.get(reason, 0)

    def record(self, failure: Any, *, restarted: bool) -> None:
        from trainop_trainer import run_record
        from trainop_trainer.status import StatusReporter

        if restarted:
            self.counts[failure.reason] = self.counts.get(failure.reason, 0) + 1
        entry = trainingjob.WorkerFailure(
            attempt=self.config.attempt,
            reason=failure.reason,
            message=failure.message,
            rank=failure.rank,
            step=failure.step,
            time=run_record.utc_now(),
            restarted=restarted,
        )
        self.last = [entry, *self.last][:10]
        # A reporter per record: its file sink reads status.json now (rank 0 of the group that just failed
        # wrote it since), so the record merges into the newest state.
        reporter = StatusReporter.for_config(self.config, status_file=self.status_file)
        reporter.record(
            "workerFailures", trainingjob.WorkerFailures(counts=dict(self.counts), last=self.last)
        )
        reporter.close()
