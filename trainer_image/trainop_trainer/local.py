"""Local mode: run a TrainingJob manifest on this machine with a local Ray runtime (``trainop run FILE``).

``run_manifest`` validates the manifest with the API's own loader, fits the job to the machine (workers
capped to local GPUs, or to local CPU cores with gloo when there are no GPUs; each capped change printed as
a note), starts Ray with a deliberately sized number of logical CPUs (one per worker plus headroom for Ray
Train's controller: on a 2-core machine Ray Train deadlocks when logical CPUs equal cores), writes the
TrainerConfig to ``<state_dir>/<name>/trainer.json`` and trains with the same code as on a cluster.
Checkpoints go to ``<state_dir>/<name>/checkpoints/``, so running the same manifest again resumes
(``fresh=True`` starts over).

While it runs, a progress line is drawn from the status records rank 0 writes to
``<state_dir>/<name>/status.json``; a worker-group restart is announced. At the end the status is printed
as the CR would carry it (YAML). SIGTERM or Ctrl-C asks the workers to checkpoint and stop; the process
then ends 128 + the signal's number (130 for Ctrl+C), also when the workers have not stopped within
``$TRAINOP_STOP_GRACE_S`` (default 60) and it stops without them: a stopped run is not a completed one.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO, TypeVar

import yaml

from trainop.api import manifest, trainer_config, trainingjob
from trainop_trainer import config as config_module
from trainop_trainer import storage

R = TypeVar("R", bound=manifest.Resource)

DEFAULT_STATE_DIR = ".trainop"
DEFAULT_STOP_GRACE_S = 60.0  # $TRAINOP_STOP_GRACE_S: a checkpoint on a laptop may take longer than in a pod


@dataclasses.dataclass(frozen=True)
class LocalPlan:
    spec: trainingjob.TrainingJobSpec
    num_workers: int
    num_gpus: int
    logical_cpus: int
    notes: list[str]


def _local_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def plan_local(
    spec: trainingjob.TrainingJobSpec, *, workers: int | None, cpu_count: int, gpu_count: int
) -> LocalPlan:
    """Fit ``spec`` to this machine (pure: the machine's facts are arguments)."""
    notes: list[str] = []
    asked = config_module.scaling_for(spec)
    wanted = workers if workers is not None else asked.num_workers
    precision = spec.precision
    if asked.use_gpu and gpu_count > 0:
        n = min(wanted, gpu_count)
        if n < wanted:
            notes.append(
                f"the job asks for {wanted} GPU workers; this machine has {gpu_count} GPU(s): using {n}"
            )
        new_workers = spec.workers.model_copy(
            update={"replicas": n, "gpus_per_worker": 1, "cpus_per_worker": 1.0}
        )
        gpus = n
    else:
        n = max(1, min(wanted, cpu_count))
        if asked.use_gpu:
            notes.append("the job asks for GPUs; this machine has none: training on CPU with gloo")
        if n < wanted:
            notes.append(
                f"the job asks for {wanted} workers; this machine has {cpu_count} CPU core(s): using {n}"
            )
        if precision == trainingjob.Precision.FP16:
            precision = trainingjob.Precision.BF16
            notes.append("precision fp16 needs a GPU: using bf16 on CPU")
        new_workers = spec.workers.model_copy(
            update={"replicas": n, "gpus_per_worker": 0, "cpus_per_worker": 1.0}
        )
        gpus = 0
    if spec.checkpoint.storage.s3 is not None:
        bucket = trainer_config.s3_uri(spec.checkpoint.storage.s3)
        notes.append(f"checkpoints stay in the local state directory; {bucket} is used in a cluster")
    local_spec = spec.model_copy(update={"workers": new_workers, "precision": precision})
    # One logical CPU per worker plus headroom: Ray Train's controller and helpers must never wait for a CPU.
    logical = max(n + 4, cpu_count)
    notes.append(f"Ray starts with {logical} logical CPUs for {n} worker(s) on {cpu_count} core(s)")
    return LocalPlan(spec=local_spec, num_workers=n, num_gpus=gpus, logical_cpus=logical, notes=notes)


class ProgressLine:
    """Draws rank 0's status.json as one live line; announces worker-group restarts. Progress updated
    before ``since`` (this run's start, in status time format) is an earlier run's and is not shown."""

    def __init__(
        self, status_file: storage.RunDir, events_file: storage.RunDir, out: TextIO, *, since: str = ""
    ) -> None:
        self.since = since
        self.status_file = status_file
        self.events_file = events_file
        self.out = out
        self.tty = out.isatty()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
        self._restarts = 0
        self._last_line = ""
        self._last_print = 0.0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._render(final=True)

    def _read(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.status_file.read_text())
            return data
        except (OSError, ValueError):
            return {}

    def _last_resume_step(self) -> int | None:
        try:
            lines = self.events_file.read_text().splitlines()
        except OSError:
            return None
        resumes = [json.loads(line) for line in lines if '"resume"' in line]
        return int(resumes[-1]["step"]) if resumes else None

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self._render(final=False)

    def _render(self, *, final: bool) -> None:
        status = self._read()
        progress = status.get("progress") or {}
        if not progress or str(progress.get("updated", "")) < self.since:
            return
        restarts = int(progress.get("workerRestarts", 0))
        if restarts > self._restarts:
            self._restarts = restarts
            ckpt = self._last_resume_step()
            self._write_line(
                f"worker group restarted (restart {restarts} of this run): resumed from checkpoint "
                f"step {ckpt}",
                newline=True,
            )
        step, total = progress.get("step", 0), progress.get("totalSteps")
        percent = progress.get("percent") or 0.0
        bar = "#" * int(percent // 5) + "-" * (20 - int(percent // 5))
        parts = [f"step {step}/{total or '?'} [{bar}] {percent:5.1f}%"]
        if progress.get("loss") is not None:
            parts.append(f"loss {progress['loss']:.4f}")
        if progress.get("samplesPerSecond") is not None:
            parts.append(f"{progress['samplesPerSecond']:.0f} samples/s")
        if progress.get("etaSeconds") is not None and not final:
            parts.append(f"eta {progress['etaSeconds']:.0f}s")
        ckpt_step = (status.get("checkpoint") or {}).get("step")
        if ckpt_step is not None:
            parts.append(f"checkpoint {ckpt_step}")
        line = "  ".join(parts)
        now = time.monotonic()
        if line != self._last_line and (self.tty or final or now - self._last_print >= 5.0):
            self._write_line(line, newline=not self.tty or final)
            self._last_line, self._last_print = line, now

    def _write_line(self, line: str, *, newline: bool) -> None:
        if self.tty:
            self.out.write("\r\x1b[2K" + line + ("\n" if newline else ""))
        else:
            self.out.write(line + "\n")
        self.out.flush()


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _checkpoint_step(status_file: storage.RunDir) -> int | None:
    """The checkpoint step an earlier run recorded in this state directory's status.json, if any."""
    try:
        step = (json.loads(status_file.read_text()).get("checkpoint") or {}).get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def stopped_message(signum: int | None, step: int | None) -> str:
    """What a run stopped by a signal (after its workers' checkpoint) says, and how to resume it."""
    names: dict[int, str] = {signal.SIGINT: "Ctrl+C (SIGINT)", signal.SIGTERM: "SIGTERM"}
    by = names.get(signum or 0, "a signal")
    at = f" at step {step}" if step is not None else ""
    return (
        f"stopped by {by} after a checkpoint{at}; run `trainop run` on the same manifest again (without "
        "--fresh) to resume from it"
    )


def final_status(
    *,
    result_outcome: str,
    error: str | None,
    status_file: storage.RunDir,
    plan: LocalPlan,
    start_time: str,
    stopped_by: int | None = None,
    stopped_at: int | None = None,
) -> trainingjob.TrainingJobStatus:
    """The status the operator would show for this run (operator fields filled in as it would)."""
    try:
        records = json.loads(status_file.read_text())
    except (OSError, ValueError):
        records = {}
    progress = records.get("progress")
    if result_outcome == "completed":
        phase, condition = (
            trainingjob.Phase.SUCCEEDED,
            ("Succeeded", "True", "Completed", "training completed"),
        )
    elif result_outcome in ("stopped", "preempted"):
        phase = trainingjob.Phase.SUSPENDED
        condition = (
            "Suspended",
            "True",
            "Interrupted",
            stopped_message(stopped_by, stopped_at),
        )
    else:
        phase, condition = (
            trainingjob.Phase.FAILED,
            ("Failed", "True", "TrainingFailed", (error or "")[:2000]),
        )
    kind, value, reason, message = condition
    return trainingjob.TrainingJobStatus.model_validate(
        {
            "phase": phase,
            "conditions": [
                {
                    "type": kind,
                    "status": value,
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": _now(),
                }
            ],
            "attempt": 1,
            "restarts": 0,
            "workers": plan.num_workers,
            "gpus": plan.num_gpus,
            "startTime": start_time,
            "completionTime": _now() if phase.finished else None,
            "progress": progress,
            "checkpoint": records.get("checkpoint"),
            "network": records.get("network"),
        },
        by_alias=True,
    )


def run_manifest(
    path: str | os.PathLike[str],
    *,
    workers: int | None = None,
    inject_failure_at_step: int | None = None,
    state_dir: str | os.PathLike[str] = DEFAULT_STATE_DIR,
    fresh: bool = False,
    verbose: bool = False,
    out: TextIO | None = None,
) -> int:
    """Run every TrainingJob in the manifest file locally; returns the process exit code (0 ok, 1 training
    failed, 2 invalid manifest or environment value, 128 + the signal's number when Ctrl+C or SIGTERM
    stopped it, after a checkpoint or after $TRAINOP_STOP_GRACE_S without one: 130 for Ctrl+C).
    ``inject_failure_at_step`` (or $TRAINOP_INJECT_FAILURE_AT_STEP) kills one worker once
    (``config.injected_failure_note`` says when)."""
    out = out or sys.stdout
    return run_each(
        path,
        trainingjob.TrainingJob,
        "local mode",
        inject_failure_at_step,
        lambda job, inject: _run_job(
            job, workers=workers, inject=inject, state_dir=state_dir, fresh=fresh, verbose=verbose, out=out
        ),
    )


def run_each(
    path: str | os.PathLike[str],
    kind: type[R],
    mode: str,
    inject_failure_at_step: int | None,
    run_one: Callable[[R, int | None], int],
) -> int:
    """Load the manifest file and run each of its resources of ``kind`` with ``run_one(resource, inject)``
    (the others are skipped, with a note); the worst exit code, 2 for an invalid file or a bad
    ``inject_failure_at_step`` or environment value (one line, before Ray starts). Shared by the TrainingJob
    and the TuningSweep local modes."""
    try:
        resources = manifest.load_file(pathlib.Path(path))
    except manifest.ManifestError as exc:
        for error in exc.errors:
            print(f"trainop: {exc.source}: {error}", file=sys.stderr)
        return 2
    chosen = [r for r in resources if isinstance(r, kind)]
    if len(chosen) != len(resources):
        print(f"trainop: {mode} runs {kind.__name__}s; skipping the other kinds in the file", file=sys.stderr)
    try:
        if inject_failure_at_step is None:
            inject_failure_at_step = config_module.inject_failure_from_env()
        elif inject_failure_at_step < 1:
            raise ValueError(
                f"--inject-failure-at-step must be a step number >= 1, got {inject_failure_at_step}"
            )
        config_module.ray_report_min_interval_from_env()  # every worker reads it: a bad value stops here
    except ValueError as exc:
        print(f"trainop: error: {exc}", file=sys.stderr)
        return 2
    return max((run_one(resource, inject_failure_at_step) for resource in chosen), default=0)


def _run_job(
    job: trainingjob.TrainingJob,
    *,
    workers: int | None,
    inject: int | None,
    state_dir: str | os.PathLike[str],
    fresh: bool,
    verbose: bool,
    out: TextIO,
) -> int:
    from trainop_trainer import data_source, preempt, ray_train, user
    from trainop_trainer.logs import configure_logging

    try:
        grace_s = config_module.stop_grace_from_env(DEFAULT_STOP_GRACE_S)
    except ValueError as exc:
        print(f"trainop: error: {exc}", file=sys.stderr)
        return 2
    name = job.metadata.name
    plan = plan_local(job.spec, workers=workers, cpu_count=os.cpu_count() or 1, gpu_count=_local_gpus())
    state = pathlib.Path(state_dir).resolve()
    run_dir = state / name
    if fresh and run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config = trainer_config.TrainerConfig(
        job_name=name,
        run_name=name,
        storage_path=str(state),
        attempt=1,
        spec=plan.spec,
        status_target=None,
        pricing=trainer_config.pricing_for(job),
    )
    (run_dir / "trainer.json").write_text(trainer_config.dumps(config))
    workload = job.spec.workload
    try:
        if workload.entrypoint is not None:
            user.resolve(workload.entrypoint)
        if workload.ray_train is not None:
            user.resolve(workload.ray_train, field_name="spec.workload.rayTrain")
    except user.EntrypointError as exc:
        print(f"trainop: error: {exc}", file=sys.stderr)
        return 2
    data = job.spec.data
    if data is not None and data.s3 is not None and not os.environ.get(trainer_config.DATA_DIR_ENV):
        # Ray's local workers get it (ray_train forwards it); the bucket is copied there once.
        os.environ[trainer_config.DATA_DIR_ENV] = str(run_dir / "data")
    try:
        data_source.data_dir(job.spec)
    except data_source.DataSourceError as exc:
        print(f"trainop: error: {exc}", file=sys.stderr)
        return 2
    paths = config_module.paths_for(config)
    print(f"trainop: running TrainingJob {name} locally; state in {run_dir}", file=out)
    earlier = _checkpoint_step(paths.status_file)
    if earlier is not None:
        print(
            f"trainop: note: an earlier run left a checkpoint at step {earlier} here; training resumes "
            "from it (--fresh starts over)",
            file=out,
        )
    for note in plan.notes:
        print(f"trainop: note: {note}", file=out)
    if inject is not None:
        print(f"trainop: note: {config_module.injected_failure_note(inject)}", file=out)
    out.flush()
    if verbose:
        configure_logging(rank=None)
    ray_train.ensure_ray(
        num_cpus=plan.logical_cpus, num_gpus=plan.num_gpus or None, log_to_driver=verbose, quiet=not verbose
    )
    preempt.reset()
    preempt.install_driver_handler(paths.stop_file, grace_s=grace_s, sigterm_is_clean=False)
    start_time = _now()
    progress = ProgressLine(paths.status_file, paths.events_file, out, since=start_time)
    progress.start()
    result: ray_train.RunResult | None = None
    try:
        result = ray_train.run(config, inject_failure_at_step=inject)
        preempt.run_ended()  # a Ctrl+C from here on does not cut the status short
    except KeyboardInterrupt:  # Ctrl+C twice (preempt.install_driver_handler): no waiting for a checkpoint
        pass
    finally:
        progress.stop()
    if result is None:
        import ray

        ray.shutdown()  # this process's local Ray: its raylet, agents and workers
        newest = _checkpoint_step(paths.status_file)
        kept = (
            f"its newest checkpoint, step {newest}, is kept" if newest is not None else "it has no checkpoint"
        )
        print(f"trainop: TrainingJob {name} stopped without a final checkpoint; {kept}", file=out)
        return 128 + signal.SIGINT
    if result.error:
        print(f"trainop: training failed: {result.error}", file=sys.stderr)
    signum = preempt.signalled_with()
    status = final_status(
        result_outcome=result.outcome,
        error=result.error,
        status_file=paths.status_file,
        plan=plan,
        start_time=start_time,
        stopped_by=signum,
        stopped_at=result.step,
    )
    print(f"trainop: TrainingJob {name} {result.outcome}; status:", file=out)
    print(yaml.safe_dump({"status": status.to_wire()}, sort_keys=False).rstrip(), file=out)
    if result.outcome in ("stopped", "preempted") and signum is not None:
        return 128 + signum  # a shell's code for a run ended by that signal: `&&` does not go on
    return result.exit_code
