"""One worker's runtime: the components a training loop uses, wired up in one place.

``Runtime.start`` builds, in this order: the network environment (NCCL profile), the control channel, the
metrics endpoint, PID registration and the SIGTERM handler, the run record (worker-group restarts), rank
0's status reporter, the checkpoints, the step schedule, the progress reports, the failure injector, and
runs the all-reduce probe. A training loop — the built-in ``Trainer`` or a user's function through
``user.Context`` — then talks to the components directly:

- ``schedule`` (``step_schedule.StepSchedule``): ``poll(step)`` once per step -> the ``Decision`` every
  rank takes at that step (report, checkpoint, stop, preempt);
- ``reports`` (``reporting.ProgressReports``): the shared report window and its publication;
- ``checkpoints``: restore the newest valid checkpoint, save one (collective);
- ``injector`` (``failure_injection.FailureInjector``): the kill-one-worker-once knob;
- ``record`` (``run_record.RunRecord``): events and the outcome on the volume.

It must not know about models, optimizers or data loaders: those belong to ``trainer.py`` and the user's
function, which register what a checkpoint holds.
"""

from __future__ import annotations

import logging
import os
import pathlib
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from trainop.api import trainer_config
from trainop_trainer import checkpoint, distributed, metrics, preempt, reporting, run_record, step_schedule
from trainop_trainer import config as config_module
from trainop_trainer.failure_injection import FailureInjector
from trainop_trainer.status import StatusReporter

log = logging.getLogger(__name__)

RNG_FILE = "rng.pt"


class WorkerPreempted(RuntimeError):
    """Raised on ranks that did not get the SIGTERM, so Ray Train restarts the group from the checkpoint."""


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
        report_fn: reporting.ReportFn | None,
    ) -> None:
        self.config = config
        self.spec = config.spec
        self.ctx = ctx
        self.launch = launch
        self.paths = config_module.paths_for(config)
        self._report_fn = report_fn
        self.metrics = metrics.WorkerMetrics(job=config.job_name, rank=ctx.rank)
        self.record = run_record.RunRecord(
            paths=self.paths, launch_id=launch.launch_id, is_rank0=ctx.is_rank0
        )
        self.status: StatusReporter | None = None
        self.writer: checkpoint.CheckpointWriter | None = None
        self.worker_restarts = 0
        self.network_profile = self.spec.network.profile.value
        self.metrics_port: int | None = None
        self.last_step: int | None = None  # the newest checkpoint saved or resumed from
        self._pid_file: pathlib.Path | None = None

    @classmethod
    def start(
        cls,
        *,
        config: trainer_config.TrainerConfig,
        ctx: distributed.WorkerContext,
        launch: config_module.LaunchSettings,
        report_fn: reporting.ReportFn | None,
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
            self.status = StatusReporter.for_config(self.config, status_file=self.paths.status_file)
            self.writer = checkpoint.CheckpointWriter(
                self.paths.checkpoints, keep_last=spec.checkpoint.keep_last, on_saved=self._on_saved
            )
        restarts = self.record.started(attempt=self.config.attempt, world_size=ctx.world_size)
        self.worker_restarts = int(self.control.broadcast_object(restarts))
        self.metrics.worker_restarts.set(self.worker_restarts)
        if self.worker_restarts:
            log.warning("worker group restart %d of this attempt", self.worker_restarts)
        self.schedule = step_schedule.StepSchedule(
            spec=spec,
            control=self.control,
            is_rank0=ctx.is_rank0,
            stop_file=self.paths.stop_file,
            ray_report_interval_s=None
            if self._report_fn is None
            else step_schedule.ray_report_interval(spec),
        )
        self.reports = reporting.ProgressReports(
            ctx=ctx,
            control=self.control,
            worker_metrics=self.metrics,
            status=self.status,
            report_fn=self._report_fn,
            worker_restarts=self.worker_restarts,
            last_checkpoint_step=lambda: self.last_step,
        )
        self.injector = FailureInjector(
            at_step=self.launch.inject_failure_at_step,
            ctx=ctx,
            control=self.control,
            marker=self.paths.injected_failure_marker,
            checkpoints=self,
        )
        self._probe()

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
        if self.status is not None:
            self.status.network(
                profile=self.network_profile,
                backend=self.ctx.backend,
                bus_bandwidth_gb_per_second=bus,
                probe_bytes=probe_bytes,
                world_size=self.ctx.world_size,
            )

    # ------------------------------------------------------------------------------------- checkpoints
    def restore(self) -> checkpoint.SavedCheckpoint | None:
        """The newest valid checkpoint (rank 0 verifies checksums and picks; every rank gets the same)."""
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
        self.last_step = saved.step
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
            self.record.resumed(step=saved.step, path=str(path))
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
        self.last_step = step
        if wait:
            self.control.barrier()

    def wait(self) -> object:
        """Block until the checkpoint in flight is on disk (rank 0; others have nothing in flight)."""
        return self.writer.wait() if self.writer is not None else None

    def _on_saved(self, saved: checkpoint.SavedCheckpoint, seconds: float) -> None:
        self.metrics.checkpoint_save_seconds.observe(seconds)
        self.metrics.checkpoint_last_step.set(saved.step)
        if self.status is not None:
            self.status.checkpoint(saved)

    # --------------------------------------------------------------------------------------- shutdown
    def close(self) -> None:
        self.control.drain()
        try:
            if self.writer is not None:
                self.writer.close()
        finally:
            if self.status is not None:
                self.status.close()
            self.metrics.close()
            if self._pid_file is not None:
                preempt.unregister_pid(self._pid_file)
