"""The trainer's view of its input: ``TrainerConfig`` (from the API package) plus what derives from it.

The operator (or local mode) writes a ``trainop.api.trainer_config.TrainerConfig`` as JSON; this module
reads it and derives, as pure functions with no torch or ray import:

- ``scaling_for(spec)``: the Ray Train worker layout. One Ray Train worker (one DDP rank) per GPU, so
  ``num_workers = replicas * gpusPerWorker`` on GPUs and ``replicas`` on CPU; each worker asks for one GPU
  and its share of the pod's CPUs.
- ``paths_for(config)``: where a run keeps its files, on the checkpoint volume or in an S3 bucket
  (``storagePath`` ``s3://bucket/prefix``, reached as ``spec.checkpoint.storage.s3`` says). Everything lives
  under ``<storagePath>/<runName>/``, the directory Ray Train itself uses for the run, so a new attempt with
  the same run name and storage path finds the previous attempts' checkpoints.
- ``LaunchSettings``: what the driver hands every worker (the config, the launch id, test knobs).

It must not import torch or ray: the driver validates and plans before anything heavy loads.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable
from typing import Any, TypeVar

from trainop.api import resources, trainer_config, trainingjob
from trainop_trainer import storage

# Kill one worker (os._exit) once: at this step if a checkpoint exists by then, else right after the first
# checkpoint after it (``runtime.Runtime.maybe_inject_failure``, every workload alike): the demo and the
# resume tests use it to exercise Ray Train's worker-group restart. Read by the driver, passed to workers.
INJECT_FAILURE_ENV = "TRAINOP_INJECT_FAILURE_AT_STEP"
# A driver's wait for its workers' checkpoint after SIGTERM/SIGINT, in seconds (preempt.py).
STOP_GRACE_ENV = "TRAINOP_STOP_GRACE_S"
# ray.train.report is a barrier and, in Ray 2.60, blocks while the controller (polling every 2 s) has not
# consumed the previous report: so status and metrics follow spec.reporting, Ray reports at most this often
# (``step_schedule.ray_report_interval``). Read by every worker; a driver checks it and forwards it.
RAY_REPORT_MIN_INTERVAL_ENV = "TRAINOP_RAY_REPORT_MIN_INTERVAL_S"
DEFAULT_RAY_REPORT_MIN_INTERVAL_S = 10.0
# Where worker processes register their PIDs so that a pod's preStop hook can signal them.
PID_DIR_ENV = "TRAINOP_PID_DIR"
DEFAULT_PID_DIR = "/tmp/trainop/pids"
# Benchmark knobs (``switches``, ``bench_hooks``): a driver hands them to its Ray workers as they are.
SWITCHES_ENV = "TRAINOP_SWITCHES"
TRACE_STEPS_ENV = "TRAINOP_TRACE_STEPS"
TRACE_DIR_ENV = "TRAINOP_TRACE_DIR"
AB_BLOCKS_ENV = "TRAINOP_AB_BLOCKS"
SYNC_DEBUG_STEPS_ENV = "TRAINOP_SYNC_DEBUG_STEPS"
TIMELINE_STEPS_ENV = "TRAINOP_TIMELINE_STEPS"
TIMELINE_DIR_ENV = "TRAINOP_TIMELINE_DIR"
BENCH_ENV = (
    SWITCHES_ENV,
    TRACE_STEPS_ENV,
    TRACE_DIR_ENV,
    AB_BLOCKS_ENV,
    SYNC_DEBUG_STEPS_ENV,
    TIMELINE_STEPS_ENV,
    TIMELINE_DIR_ENV,
)

N = TypeVar("N", int, float)

load = trainer_config.load


@dataclasses.dataclass(frozen=True)
class Scaling:
    """Arguments of ``ray.train.ScalingConfig``."""

    num_workers: int
    use_gpu: bool
    resources_per_worker: dict[str, float]

    @property
    def backend(self) -> str:
        return "nccl" if self.use_gpu else "gloo"


def scaling_for(spec: trainingjob.TrainingJobSpec) -> Scaling:
    workers = spec.workers
    # The pod's CPUs, as the operator sized it (the spec's, or the job-sized default).
    cpus = resources.worker_cpus(spec)
    if workers.gpus_per_worker > 0:
        return Scaling(
            num_workers=workers.replicas * workers.gpus_per_worker,
            use_gpu=True,
            resources_per_worker={"CPU": cpus / workers.gpus_per_worker, "GPU": 1.0},
        )
    return Scaling(num_workers=workers.replicas, use_gpu=False, resources_per_worker={"CPU": cpus})


@dataclasses.dataclass(frozen=True)
class RunPaths:
    """Files of one run (shared by every attempt of the job): a ``pathlib.Path`` on the checkpoint volume,
    or a ``storage.StoragePath`` in a bucket, which offers the same small part of pathlib's interface."""

    run_dir: storage.RunDir

    @property
    def checkpoints(self) -> storage.RunDir:
        return self.run_dir / "checkpoints"

    @property
    def status_file(self) -> storage.RunDir:
        """The status records as the CR would carry them (local mode and runs without a status target)."""
        return self.run_dir / "status.json"

    @property
    def stop_file(self) -> storage.RunDir:
        """Created by a driver that received SIGTERM: workers checkpoint and return at the next step."""
        return self.run_dir / "trainop" / "stop-requested"

    @property
    def events_file(self) -> storage.RunDir:
        """JSON lines written by rank 0: ``start`` per worker-group start (restarts = starts of a launch - 1)
        and ``resume`` with the checkpoint step it resumed from."""
        return self.run_dir / "trainop" / "events.jsonl"

    @property
    def batch_size_file(self) -> storage.RunDir:
        """The batch size the finder chose for this run (``batchSizePerWorker: auto``), reused on resume."""
        return self.run_dir / "trainop" / "batch-size.json"

    @property
    def injected_failure_marker(self) -> storage.RunDir:
        return self.run_dir / "trainop" / "injected-failure"

    @property
    def outcome_file(self) -> storage.RunDir:
        """How the launch ended (completed / stopped / preempted), written by rank 0, read by the driver."""
        return self.run_dir / "trainop" / "outcome.json"

    @property
    def on_object_storage(self) -> bool:
        return isinstance(self.run_dir, storage.StoragePath)


def paths_for(config: trainer_config.TrainerConfig) -> RunPaths:
    """The run's directory: ``<storagePath>/<runName>`` on the volume, or in the bucket of
    ``spec.checkpoint.storage.s3`` when ``storagePath`` is ``s3://...`` (connected with the credentials of
    this container's environment)."""
    root = storage.for_uri(
        config.storage_path, bucket=config.spec.checkpoint.storage.s3, use=trainer_config.S3_CHECKPOINT
    )
    return RunPaths(run_dir=root / config.run_name)


@dataclasses.dataclass(frozen=True)
class LaunchSettings:
    """What the driver hands every worker through ``train_loop_config`` (JSON-safe)."""

    config_json: str
    launch_id: str
    inject_failure_at_step: int | None = None
    # When the driver started (Unix time): the start of this launch's allocated time (cost.py).
    started_at: float | None = None
    # The driver's heartbeat store (``host:port``, watchdog.py) and which run of the worker group inside the
    # attempt this is (0, then 1 after the first in-attempt restart, ...).
    heartbeat_store: str | None = None
    attempt_try: int = 0

    @property
    def config(self) -> trainer_config.TrainerConfig:
        return trainer_config.TrainerConfig.model_validate_json(
            self.config_json, by_alias=True, by_name=False
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchSettings:
        return cls(**data)


def dumps(config: trainer_config.TrainerConfig) -> str:
    return trainer_config.dumps(config)


def injected_failure_note(step: int) -> str:
    """What ``inject_failure_at_step=step`` does, in one sentence true for built-in models and user
    entrypoints alike (both run ``Runtime.maybe_inject_failure``)."""
    return (
        f"a worker will be killed once: at step {step} if a checkpoint exists by then, else right after the "
        f"first checkpoint after step {step}; the trainer restarts the worker group, which resumes from the "
        "newest checkpoint"
    )


def number_from_env(name: str, parse: Callable[[str], N], *, minimum: N, what: str, unset: str) -> N | None:
    """The number in ``$name`` (None when unset or empty), at least ``minimum``; anything else raises a
    ValueError naming the variable, what it must be, the value and the fix (``unset``: what unsetting does),
    which a driver prints as one line before it starts (exit code 2)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = parse(raw)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < minimum:
        raise ValueError(f"{name} must be {what}, got {raw!r}; fix it, or unset it {unset}")
    return value


def inject_failure_from_env() -> int | None:
    return number_from_env(
        INJECT_FAILURE_ENV, int, minimum=1, what="a step number >= 1", unset="to inject no failure"
    )


def seconds_from_env(name: str, default: float) -> float:
    """``$name`` as seconds >= 0, ``default`` when unset (``number_from_env`` refuses anything else)."""
    value = number_from_env(
        name, float, minimum=0.0, what="a number of seconds >= 0", unset=f"for the default, {default:g}"
    )
    return default if value is None else value


def stop_grace_from_env(default: float) -> float:
    """``$TRAINOP_STOP_GRACE_S``: how long a driver waits for its workers' checkpoint after SIGTERM/SIGINT."""
    return seconds_from_env(STOP_GRACE_ENV, default)


def ray_report_min_interval_from_env() -> float:
    """``$TRAINOP_RAY_REPORT_MIN_INTERVAL_S``: the floor on the time between two ``ray.train.report`` calls
    (``step_schedule.ray_report_interval``); a driver checks it, and hands it to its workers."""
    return seconds_from_env(RAY_REPORT_MIN_INTERVAL_ENV, DEFAULT_RAY_REPORT_MIN_INTERVAL_S)


def describe(config: trainer_config.TrainerConfig) -> str:
    """One line for logs: what is trained, where, on how many workers."""
    spec = config.spec
    what = spec.workload.model.value if spec.workload.model else spec.workload.entrypoint
    scaling = scaling_for(spec)
    return json.dumps(
        {
            "job": config.job_name,
            "run": config.run_name,
            "attempt": config.attempt,
            "workload": what,
            "dataset": spec.workload.dataset.kind.value,
            "workers": scaling.num_workers,
            "backend": scaling.backend,
            "precision": spec.precision.value,
        }
    )
