"""One worker's runtime: the components a training loop uses, wired up in one place.

``Runtime.start`` builds, in this order: the data directory (``data_source``: spec.data, copied from its
bucket when that is the source; a relative dataset path resolved into it), the network environment (NCCL
profile), the control channel, the
metrics endpoint, PID registration and the SIGTERM handler, rank 0's status reporter, the checkpointer
(with this rank's RNG state registered), the run record (worker-group restarts), the step schedule, the
progress reports, the failure injector, and runs the all-reduce probe. A training loop — the built-in
``Trainer`` or a user's function through ``user.Context`` — then talks to the components directly:

- ``schedule`` (``step_schedule.StepSchedule``): ``poll(step)`` once per step -> the ``Decision`` every
  rank takes at that step (report, checkpoint, stop, preempt);
- ``reports`` (``reporting.ProgressReports``): the shared report window and its publication;
- ``checkpointer`` (``checkpointer.Checkpointer``): the loop registers its parts, then ``load`` / ``save``;
- ``injector`` (``failure_injection.FailureInjector``): the kill-one-worker-once knob;
- ``record`` (``run_record.RunRecord``): events and the outcome beside the checkpoints.

It must not know about models, optimizers or data loaders: those belong to ``trainer.py`` and the user's
function, which register what a checkpoint holds.
"""

from __future__ import annotations

import logging
import pathlib
import random

import numpy as np
import torch

from trainop.api import trainer_config
from trainop_trainer import config as config_module
from trainop_trainer import (
    data_source,
    distributed,
    metrics,
    preempt,
    reporting,
    run_record,
    stateful,
    step_schedule,
)
from trainop_trainer.checkpoint_store import Checkpoint
from trainop_trainer.checkpointer import Checkpointer
from trainop_trainer.failure_injection import FailureInjector
from trainop_trainer.status import StatusReporter

log = logging.getLogger(__name__)


class WorkerPreempted(RuntimeError):
    """Raised on ranks that did not get the SIGTERM, so Ray Train restarts the group from the checkpoint."""


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
        self.worker_restarts = 0
        self.network_profile = self.spec.network.profile.value
        self.metrics_port: int | None = None
        self.data_dir: pathlib.Path | None = None
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
        self.data_dir = data_source.prepare(self.spec)
        self.spec = data_source.with_data_dir(self.spec, self.data_dir)
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
        self.checkpointer = Checkpointer(
            root=self.paths.checkpoints,
            ctx=ctx,
            keep_last=spec.checkpoint.keep_last,
            record=self.record,
            on_committed=self._on_committed,
        )
        self.checkpointer.register(stateful.RNG, stateful.RNGState(ctx.device))
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
            last_checkpoint_step=lambda: self.checkpointer.last_step,
        )
        self.injector = FailureInjector(
            at_step=self.launch.inject_failure_at_step,
            ctx=ctx,
            control=self.control,
            marker=self.paths.injected_failure_marker,
            checkpoints=self.checkpointer,
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

    def _on_committed(self, saved: Checkpoint, seconds: float) -> None:
        self.metrics.checkpoint_save_seconds.observe(seconds)
        self.metrics.checkpoint_last_step.set(saved.step)
        if self.status is not None:
            self.status.checkpoint(saved)

    # --------------------------------------------------------------------------------------- shutdown
    def close(self) -> None:
        self.control.drain()
        self.schedule.close()
        try:
            self.checkpointer.close()
        finally:
            if self.status is not None:
                self.status.close()
            self.metrics.close()
            if self._pid_file is not None:
                preempt.unregister_pid(self._pid_file)
