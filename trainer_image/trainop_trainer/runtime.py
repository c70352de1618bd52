"""One worker's services, shared by the built-in Trainer and user entrypoints.

``Runtime.start`` wires up, in this order: the network environment (NCCL profile), the control channel,
the metrics endpoint, PID registration and the SIGTERM handler, the worker-restart count, rank 0's status
reporter and checkpoint writer, and the all-reduce probe. It then offers what a training loop calls:

- ``poll(step)``: once per optimizer step; the agreed decisions (stop, preempt, time-based checkpoint and
  report) come back one step later for every rank at once (see ``distributed.ControlChannel``).
- ``restore()`` / ``save(...)``: checkpoint lookup (rank 0 verifies, everyone loads) and a save that
  snapshots on the training thread and writes on rank 0's background thread.
- ``report(...)``: progress to metrics, status, and ``ray.train.report`` (a barrier: called only at
  report time, on every rank).
- ``maybe_inject_failure(...)``: the test/demo knob that kills one worker once, after a checkpoint.

It must not know about models or data loaders: those belong to ``trainer.py`` and the user's function.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
import pathlib
import random
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from trainop.api import trainer_config
from trainop_trainer import checkpoint, distributed, metrics, preempt
from trainop_trainer import config as config_module
from trainop_trainer.status import StatusReporter

log = logging.getLogger(__name__)

ReportFn = Callable[[dict[str, Any]], None]
RNG_FILE = "rng.pt"
# ray.train.report is a barrier and, in Ray 2.60, blocks while the controller (polling every 2 s) has not
# consumed the previous report: so status and metrics follow spec.reporting, Ray reports at most this often.
RAY_REPORT_MIN_INTERVAL_ENV = "TRAINOP_RAY_REPORT_MIN_INTERVAL_S"
DEFAULT_RAY_REPORT_MIN_INTERVAL_S = 10.0


class Outcome(enum.StrEnum):
    COMPLETED = "completed"  # reached the last step
    STOPPED = "stopped"  # a stop request (the driver got SIGTERM): checkpointed, returning normally
    PREEMPTED = "preempted"  # some worker got SIGTERM: checkpointed; that worker exits 0


class WorkerPreempted(RuntimeError):
    """Raised on ranks that did not get the SIGTERM, so Ray Train restarts the group from the checkpoint."""


@dataclasses.dataclass(frozen=True)
class Decision:
    stop: bool
    preempt: bool
    checkpoint: bool
    report: bool
    ray_report: bool = False


def rng_state(device: torch.device) -> dict[str, Any]:
    np_state: tuple[Any, ...] = tuple(np.random.get_state(legacy=True))
    py_state = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "numpy": {
            "keys": torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "python": {"version": py_state[0], "state": list(py_state[1]), "gauss_next": py_state[2]},
    }


def set_rng_state(state: Mapping[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)
    n = state["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))


def configure_logging(*, rank: int | None) -> None:
    """INFO logs of this package to stderr, prefixed with the rank (idempotent)."""
    logger = logging.getLogger("trainop_trainer")
    if any(getattr(h, "_trainop", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler()
    where = "driver" if rank is None else f"rank{rank}"
    handler.setFormatter(logging.Formatter(f"%(asctime)s {where} %(name)s %(levelname)s: %(message)s"))
    handler._trainop = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % (1 << 32))
    random.seed(seed)


class Runtime:
    def __init__(
        self,
        *,
        config: trainer_config.TrainerConfig,
        ctx: distributed.WorkerContext,
        launch: config_module.LaunchSettings,
        report_fn: ReportFn | None,
    ) -> None:
        self.config = config
        self.spec = config.spec
        self.ctx = ctx
        self.launch = launch
        self.paths = config_module.paths_for(config)
        self._report_fn = report_fn
        self.metrics = metrics.WorkerMetrics(job=config.job_name, rank=ctx.rank)
        self.control: distributed.ControlChannel | None = None
        self.reporter: StatusReporter | None = None
        self.writer: checkpoint.CheckpointWriter | None = None
        self.worker_restarts = 0
        self.network_profile = self.spec.network.profile.value
        self.metrics_port: int | None = None
        self.last_checkpoint_step: int | None = None
        self._pid_file: pathlib.Path | None = None
        self._ray_report_interval = max(
            self.spec.reporting.every_seconds,
            float(os.environ.get(RAY_REPORT_MIN_INTERVAL_ENV, DEFAULT_RAY_REPORT_MIN_INTERVAL_S)),
        )
        self._last_stop_file_check = 0.0
        self._stop_file_seen = False
        self._injection_settled = False
        self.reset_clocks()

    def reset_clocks(self) -> None:
        """Start the report and checkpoint clocks now (call when the loop starts, after restoring)."""
        now = time.monotonic()
        self._last_report_time = now
        self._last_ray_report_time = now
        self._last_checkpoint_time = now

    # ----------------------------------------------------------------------------------------- start-up
    @classmethod
    def start(
        cls,
        *,
        config: trainer_config.TrainerConfig,
        ctx: distributed.WorkerContext,
        launch: config_module.LaunchSettings,
        report_fn: ReportFn | None,
    ) -> Runtime:
        runtime = cls(config=config, ctx=ctx, launch=launch, report_fn=report_fn)
        runtime._start()
        return runtime

    def _start(self) -> None:
        ctx, spec = self.ctx, self.spec
        plan = distributed.apply_network(spec.network, multi_node=ctx.multi_node)
        self.network_profile = plan.resolved
        self.control = distributed.ControlChannel(ctx)
        self.metrics_port = metrics.serve(spec.reporting.metrics_port + ctx.local_rank)
        if ctx.device.type == "cuda":
            self.metrics.start_gpu_sampler(cuda_index=ctx.device.index or 0)
        self._pid_file = preempt.register_pid(run_name=self.config.run_name, rank=ctx.rank)
        preempt.install()
        seed_everything(spec.hyperparameters.seed + ctx.rank)
        if ctx.is_rank0:
            self.paths.run_dir.mkdir(parents=True, exist_ok=True)
            self.worker_restarts = self._count_start()
            self.reporter = StatusReporter.for_config(self.config, status_file=self.paths.status_file)
            self.writer = checkpoint.CheckpointWriter(
                self.paths.checkpoints, keep_last=spec.checkpoint.keep_last, on_saved=self._on_saved
            )
        self.worker_restarts = int(self.control.broadcast_object(self.worker_restarts))
        self.metrics.worker_restarts.set(self.worker_restarts)
        if self.worker_restarts:
            log.warning("worker group restart %d of this attempt", self.worker_restarts)
        self._probe()

    def _event(self, event: str, **fields: Any) -> None:
        path = self.paths.events_file
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"event": event, "launch": self.launch.launch_id, "time": checkpoint.utc_now(), **fields}
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def _count_start(self) -> int:
        self._event("start", attempt=self.config.attempt, worldSize=self.ctx.world_size)
        starts = 0
        for line in self.paths.events_file.read_text().splitlines():
            record = json.loads(line)
            if record.get("event") == "start" and record.get("launch") == self.launch.launch_id:
                starts += 1
        return starts - 1

    def _probe(self) -> None:
        network = self.spec.network
        bus: float | None = None
        probe_bytes: int | None = None
        if network.probe:
            result = distributed.probe_allreduce(self.ctx, megabytes=network.probe_megabytes)
            bus, probe_bytes = result.bus_bandwidth_gb_per_second, result.probe_bytes
            if bus is not None:
                self.metrics.allreduce_bus_bandwidth.set(bus * 1e9)  # the metric is in bytes/s
                if self.ctx.is_rank0:
                    log.info(
                        "all-reduce probe: %.3f GB/s bus bandwidth (%d MiB, %d workers, %.1f ms per op)",
                        bus,
                        result.probe_bytes >> 20,
                        result.world_size,
                        result.seconds_per_op * 1e3,
                    )
        if self.reporter is not None:
            self.reporter.network(
                profile=self.network_profile,
                backend=self.ctx.backend,
                bus_bandwidth_gb_per_second=bus,
                probe_bytes=probe_bytes,
                world_size=self.ctx.world_size,
            )

    # --------------------------------------------------------------------------------------- decisions
    def poll(self, step: int) -> Decision:
        """Call once per optimizer step on every rank; returns what every rank does at this step."""
        assert self.control is not None
        stop_file = False
        due_checkpoint = due_report = due_ray_report = False
        if self.ctx.is_rank0:
            now = time.monotonic()
            if now - self._last_stop_file_check >= 1.0:
                self._last_stop_file_check = now
                self._stop_file_seen = self.paths.stop_file.exists()
            stop_file = self._stop_file_seen
            minutes = self.spec.checkpoint.interval_minutes
            if minutes is not None and now - self._last_checkpoint_time >= minutes * 60:
                due_checkpoint = True
                self._last_checkpoint_time = now  # reset when asking: the answer arrives next step
            if now - self._last_report_time >= self.spec.reporting.every_seconds:
                due_report = True
                self._last_report_time = now
            if self._report_fn is not None and now - self._last_ray_report_time >= self._ray_report_interval:
                due_ray_report = True
                self._last_ray_report_time = now
        agreed = self.control.exchange(
            stop=stop_file,
            preempt=preempt.requested(),
            checkpoint=due_checkpoint,
            report=due_report,
            ray_report=due_ray_report,
        )
        interval = self.spec.checkpoint.interval_steps
        by_steps = interval is not None and step % interval == 0
        report_by_steps = step % self.spec.reporting.every_steps == 0
        stopping = agreed.stop or agreed.preempt
        return Decision(
            stop=stopping,
            preempt=agreed.preempt,
            checkpoint=agreed.checkpoint or by_steps or stopping,
            report=agreed.report or agreed.ray_report or report_by_steps or stopping,
            ray_report=agreed.ray_report or stopping,
        )

    # ------------------------------------------------------------------------------------- checkpoints
    def restore(self) -> checkpoint.SavedCheckpoint | None:
        """The newest valid checkpoint (rank 0 verifies checksums and picks; every rank gets the same)."""
        assert self.control is not None
        chosen: str | None = None
        if self.ctx.is_rank0:
            saved = checkpoint.find_latest_valid(self.paths.checkpoints)
            chosen = str(saved.path) if saved else None
        chosen = self.control.broadcast_object(chosen)
        if chosen is None:
            log.info("no checkpoint under %s: starting from step 0", self.paths.checkpoints)
            return None
        path = self.paths.checkpoints / os.path.basename(chosen)
        manifest = checkpoint.Manifest.from_json((path / checkpoint.MANIFEST).read_text())
        saved = checkpoint.SavedCheckpoint(path=path, manifest=manifest)
        self.last_checkpoint_step = saved.step
        if saved.has(RNG_FILE):
            states = saved.load(RNG_FILE)
            if self.ctx.rank < len(states):
                set_rng_state(states[self.ctx.rank], self.ctx.device)
            else:
                log.warning(
                    "checkpoint has RNG states of %d ranks; rank %d is reseeded", len(states), self.ctx.rank
                )
        if self.ctx.is_rank0:
            log.info("resuming from %s (step %d, epoch %d)", path, saved.step, saved.manifest.epoch)
            self._event("resume", step=saved.step, path=str(path))
            self.metrics.checkpoint_last_step.set(saved.step)
        return saved

    def save(
        self,
        *,
        step: int,
        epoch: int,
        payload_fn: Callable[[], dict[str, Any]],
        progress: Mapping[str, int],
        metrics_values: Mapping[str, float],
        wait: bool,
    ) -> None:
        """Collective: every rank calls it at the same step. ``payload_fn`` runs on rank 0 only and must
        return CPU snapshots (``checkpoint.to_cpu``); the write itself happens in the background unless
        ``wait``."""
        assert self.control is not None
        started = time.perf_counter()
        rng = self.control.gather_to_rank0(rng_state(self.ctx.device))
        if self.ctx.is_rank0:
            assert self.writer is not None and rng is not None
            payload = payload_fn()
            payload[RNG_FILE] = rng
            self.writer.submit(
                step=step,
                epoch=epoch,
                world_size=self.ctx.world_size,
                payload=payload,
                progress=progress,
                metrics=metrics_values,
                started=started,
            )
            log.info("checkpoint step %d: %.3fs on the training thread", step, time.perf_counter() - started)
            if wait:
                self.writer.wait()
        self._last_checkpoint_time = time.monotonic()
        self.last_checkpoint_step = step
        if wait:
            self.control.barrier()

    def _on_saved(self, saved: checkpoint.SavedCheckpoint, seconds: float) -> None:
        self.metrics.checkpoint_save_seconds.observe(seconds)
        self.metrics.checkpoint_last_step.set(saved.step)
        if self.reporter is not None:
            self.reporter.checkpoint(saved)

    # ---------------------------------------------------------------------------------------- reports
    def report(
        self,
        *,
        step: int,
        total_steps: int | None,
        epoch: int,
        local_loss: float | None,
        samples_per_second: float | None,
        eta_seconds: float | None,
        to_ray: bool,
        extra: Mapping[str, float] | None = None,
    ) -> float | None:
        """Collective (every rank, same step). Returns the loss averaged over ranks. ``to_ray`` also calls
        ``ray.train.report`` (every rank must pass the same value)."""
        assert self.control is not None
        loss = None if local_loss is None else self.control.all_reduce_mean(local_loss)
        self.metrics.step.set(step)
        if loss is not None:
            self.metrics.loss.set(loss)
        if self.ctx.is_rank0:
            log.info(
                "step %d/%s epoch %d loss %s %s samples/s",
                step,
                total_steps if total_steps is not None else "?",
                epoch,
                "-" if loss is None else f"{loss:.4f}",
                "-" if samples_per_second is None else f"{samples_per_second:.1f}",
            )
        if samples_per_second is not None:
            self.metrics.samples_per_second.set(samples_per_second)
        if self.reporter is not None:
            self.reporter.progress(
                step=step,
                total_steps=total_steps,
                epoch=epoch,
                loss=None if loss is None else round(loss, 6),
                samples_per_second=None if samples_per_second is None else round(samples_per_second, 2),
                eta_seconds=None if eta_seconds is None else round(eta_seconds, 1),
                worker_restarts=self.worker_restarts,
            )
        self._last_report_time = time.monotonic()
        if self._report_fn is not None and to_ray:
            values: dict[str, Any] = {"step": step, "epoch": epoch}
            if loss is not None:
                values["loss"] = loss
            if samples_per_second is not None:
                values["samples_per_second"] = samples_per_second
            if self.last_checkpoint_step is not None:
                values["checkpoint_step"] = self.last_checkpoint_step
            values.update(extra or {})
            self._report_fn(values)
        return loss

    # -------------------------------------------------------------------------------- failure injection
    def maybe_inject_failure(self, *, step: int, checkpointed_now: bool) -> None:
        """Kill one worker (``os._exit(1)``) once per run: at the configured step if a checkpoint is already
        on disk, else right after the next checkpoint. Every rank evaluates the same steps (the configured
        one, then checkpoint steps), so they agree without extra messages; a marker file on the volume makes
        it happen once, also across the restart that follows."""
        at = self.launch.inject_failure_at_step
        if at is None or self._injection_settled or step < at or (step > at and not checkpointed_now):
            return
        assert self.control is not None
        marker = self.paths.injected_failure_marker
        verdict = "wait"  # no checkpoint yet: look again at the next checkpoint
        newest: int | None = None
        if self.ctx.is_rank0:
            if self.writer is not None:
                self.writer.wait()  # the checkpoint we resume from must be on disk before anyone dies
            newest = self.last_checkpoint_step
            if marker.exists():
                verdict = "done"
            elif newest is not None:
                verdict = "kill"
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text(f"killed rank {self.ctx.world_size - 1} at step {step}\n")
        verdict, newest = self.control.broadcast_object((verdict, newest))
        if verdict == "done":
            self._injection_settled = True
        if verdict != "kill":
            return
        self._injection_settled = True
        victim = self.ctx.world_size - 1
        if self.ctx.rank == victim:
            message = (
                f"trainop: injected failure: rank {victim} exits at step {step} (newest checkpoint: step "
                f"{newest}); Ray Train restarts the worker group, which resumes from that checkpoint"
            )
            log.warning(message)
            sys.stderr.flush()
            os._exit(1)

    # --------------------------------------------------------------------------------------- shutdown
    def write_outcome(self, outcome: Outcome, step: int) -> None:
        if not self.ctx.is_rank0:
            return
        path = self.paths.run_dir / "trainop" / "outcome.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"launch": self.launch.launch_id, "outcome": outcome.value, "step": step}))

    def close(self) -> None:
        if self.control is not None:
            self.control.drain()
        try:
            if self.writer is not None:
                self.writer.close()
        finally:
            if self.reporter is not None:
                self.reporter.close()
            self.metrics.close()
            if self._pid_file is not None:
                preempt.unregister_pid(self._pid_file)
