"""One worker's runtime: the components a training loop uses, wired up in one place.

``Runtime.start`` builds, in this order: the data directory (``data_source``: spec.data, copied from its
bucket when that is the source; a relative dataset path resolved into it), the network environment (NCCL
profile), the control channel, the metrics endpoint, PID registration and the SIGTERM handler, rank 0's
status reporter, tracking (MLflow, TensorBoard), cost ledger and request watcher, the checkpointer (with
this rank's RNG state registered and ``keepBest``), the run record (worker-group restarts), the step
schedule, the progress reports, the failure injector, the profiler, and runs the all-reduce probe. A
training loop — the built-in ``Trainer`` or a user's function through ``user.Context`` — then talks to
the components directly:

- ``schedule`` (``step_schedule.StepSchedule``): ``poll(step)`` once per step -> the ``Decision`` every
  rank takes at that step (report, checkpoint, stop, preempt);
- ``reports`` (``reporting.ProgressReports``): the shared report window and its publication;
- ``checkpointer`` (``checkpointer.Checkpointer``): the loop registers its parts, then ``load`` / ``save``;
- ``injector`` (``failure_injection.FailureInjector``): the kill-one-worker-once knob;
- ``record`` (``run_record.RunRecord``): events and the outcome beside the checkpoints;
- ``profiler`` (``profiling.Profiler``): ``after_step(step, decision)`` once per step, for profile windows
  and communication reports users ask for;
- ``publish_evaluation(step, epoch, metrics)``: an evaluation's numbers to status, metrics and tracking;
- ``finish(outcome, step)``: the outcome beside the checkpoints, the final checkpoint's reference, the last
  cost.

Rank 0 also publishes ``status.cost`` (``cost.CostLedger``) and sends every report to the tracking
backends (``tracking.Tracking``).

It must not know about models, optimizers or data loaders: those belong to ``trainer.py`` and the user's
function, which register what a checkpoint holds.
"""

from __future__ import annotations

import logging
import pathlib
import random
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from trainop.api import experiment, trainer_config
from trainop_trainer import config as config_module
from trainop_trainer import (
    cost,
    data_source,
    distributed,
    metrics,
    preempt,
    profiling,
    reporting,
    requests,
    run_record,
    stateful,
    step_schedule,
    tracking,
    watchdog,
)
from trainop_trainer.checkpoint_store import Checkpoint
from trainop_trainer.checkpointer import Checkpointer
from trainop_trainer.failure_injection import FailureInjector
from trainop_trainer.status import KubernetesEvents, StatusReporter
from trainop_trainer.step_schedule import Outcome

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
        store: Any = None,
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
        self.tracking: tracking.Tracking | None = None  # rank 0
        self.cost: cost.CostLedger | None = None  # rank 0
        self.requests: requests.RequestWatcher | None = None  # rank 0
        self.events: KubernetesEvents | None = None  # rank 0, in a cluster
        self._best_step: int | None = None
        self._attempt_tracked = False
        self._completed = False  # the loop completed (tracking marks the run finished)
        self.heartbeat = watchdog.Heartbeat()  # the training thread's progress (watchdog.py)
        self.watchdog: watchdog.Watchdog | None = None
        self._store = store

    @classmethod
    def start(
        cls,
        *,
        config: trainer_config.TrainerConfig,
        ctx: distributed.WorkerContext,
        launch: config_module.LaunchSettings,
        report_fn: reporting.ReportFn | None,
        store: Any = None,
    ) -> Runtime:
        runtime = cls(config=config, ctx=ctx, launch=launch, report_fn=report_fn, store=store)
        try:
            runtime._start()
        except BaseException:
            if runtime.watchdog is not None:
                runtime.watchdog.close()
            raise
        return runtime

    def _start_watchdog(self) -> None:
        """Right after spec.data is in place (a start-up that hangs is a stall too), unless
        spec.failurePolicy.trainerWatchdog is false."""
        timeout = self.spec.failure_policy.stall_timeout_seconds
        if not timeout or not self.spec.failure_policy.trainer_watchdog:
            return
        self.watchdog = watchdog.Watchdog(
            heartbeat=self.heartbeat,
            rank=self.ctx.rank,
            world_size=self.ctx.world_size,
            timeout_s=float(timeout),
            attempt=self.config.attempt,
            attempt_try=self.launch.attempt_try,
            stalls_dir=self.paths.run_dir / "stalls",
            store=self._store,
        ).start()

    def _start(self) -> None:
        self.data_dir = data_source.prepare(self.spec)  # a bucket's data may take long to copy: not a stall
        self.spec = data_source.with_data_dir(self.spec, self.data_dir)
        self._start_watchdog()
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
            self._start_rank0_services()
        self.checkpointer = Checkpointer(
            root=self.paths.checkpoints,
            ctx=ctx,
            keep_last=spec.checkpoint.keep_last,
            record=self.record,
            on_committed=self._on_committed,
            keep_best=spec.checkpoint.keep_best,
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
            requests=self.requests,
        )
        self.reports = reporting.ProgressReports(
            ctx=ctx,
            control=self.control,
            worker_metrics=self.metrics,
            status=self.status,
            report_fn=self._report_fn,
            worker_restarts=self.worker_restarts,
            last_checkpoint_step=lambda: self.checkpointer.last_step,
            on_report=self._on_report if ctx.is_rank0 else None,
        )
        self.injector = FailureInjector(
            at_step=self.launch.inject_failure_at_step,
            ctx=ctx,
            control=self.control,
            marker=self.paths.injected_failure_marker,
            checkpoints=self.checkpointer,
        )
        self.profiler = profiling.Profiler(
            ctx=ctx,
            control=self.control,
            profiles_dir=self.paths.run_dir / "profiles",
            watcher=self.requests,
            status=self.status,
            emit_event=self.events.emit if self.events is not None else None,
        )
        self._probe()

    def _start_rank0_services(self) -> None:
        """Tracking, the cost ledger and the request watcher: rank 0's, none of them may stop training."""
        config = self.config
        self.tracking = tracking.Tracking.start(config, run_dir=self.paths.run_dir)
        if self.tracking.active and self.status is not None:
            self.status.record("tracking", self.tracking.status())
        self.cost = cost.CostLedger(
            path=self.paths.run_dir / "trainop" / cost.LEDGER,
            launch_id=self.launch.launch_id,
            started_at=self.launch.started_at or time.time(),
        )
        if config.status_target is not None:
            self.events = KubernetesEvents(config.status_target)
        self.requests = requests.RequestWatcher(
            run_dir=self.paths.run_dir,
            target=config.status_target,
            api=None,
        ).start()
        if self.events is not None:
            self.events.watcher = self.requests

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
        best = self.checkpointer.best_status() if self.ctx.is_rank0 else None
        if self.status is not None:
            self.status.checkpoint(saved, best=best)
        if best is not None and best.step != self._best_step:
            self._best_step = best.step
            self.metrics.best_checkpoint_step.set(best.step)
            if self.tracking is not None:
                self.tracking.checkpoint(
                    "best", path=best.path, step=best.step, metrics={best.metric: best.value}
                )

    # ------------------------------------------------------------------------- reports and evaluations
    def _on_report(self, step: int, values: Mapping[str, float]) -> None:
        """Rank 0, after every progress report: tracking and the cost record."""
        if self.tracking is not None:
            if not self._attempt_tracked:  # the attempt's first report: where its curve starts
                self.tracking.attempt(step, self.config.attempt)
                self._attempt_tracked = True
            self.tracking.report(step, values)
        self._publish_cost()

    def _publish_cost(self) -> None:
        if self.cost is None:
            return
        self.cost.training_seconds = self.reports.training_seconds
        self.cost.save()
        allocated, training = self.cost.totals()
        spec = self.spec
        record = cost.cost_status(
            gpus=spec.workers.replicas * spec.workers.gpus_per_worker,
            allocated_seconds=allocated,
            training_seconds=training,
            pricing=self.config.pricing,
            updated=run_record.utc_now(),
        )
        self.metrics.cost_gpu_hours.set(record.gpu_hours)
        self.metrics.cost_idle_gpu_hours.set(record.idle_gpu_hours)
        if record.estimated_cost is not None and record.currency is not None:
            self.metrics.estimated_cost(record.estimated_cost, record.currency)
        if self.status is not None:
            self.status.record("cost", record)

    def publish_evaluation(self, *, step: int, epoch: int, metrics: Mapping[str, float]) -> None:
        """Every rank, after an evaluation (the numbers are already the same on every rank)."""
        values = {k: float(v) for k, v in metrics.items() if k != "samples"}
        self.metrics.evaluation(values)
        if not self.ctx.is_rank0:
            return
        samples = metrics.get("samples")
        if self.status is not None:
            self.status.record(
                "evaluation",
                experiment.EvaluationStatus(
                    step=step,
                    epoch=epoch,
                    metrics={k: round(v, 6) for k, v in values.items()},
                    samples=None if samples is None else int(samples),
                    time=run_record.utc_now(),
                ),
            )
        if self.tracking is not None:
            self.tracking.evaluation(step, values)

    def finish(self, outcome: Outcome, step: int) -> None:
        """The loop ended (every rank): the outcome on the volume; rank 0 references the final
        checkpoint, publishes the last cost and closes tracking."""
        self.record.outcome(outcome.value, step)
        if not self.ctx.is_rank0:
            return
        self._publish_cost()
        if self.tracking is not None and outcome == Outcome.COMPLETED:
            final = self.checkpointer.wait() if self.checkpointer.last_step == step else None
            if final is not None:
                self.tracking.checkpoint(
                    "final",
                    path=str(final.path),
                    step=final.step,
                    metrics={**final.manifest.metrics, **final.manifest.evaluation},
                )
        self._completed = outcome == Outcome.COMPLETED

    # --------------------------------------------------------------------------------------- shutdown
    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.close()
        self.control.drain()
        self.schedule.close()
        try:
            self.profiler.close(self.reports.last_step)
            self.checkpointer.close()
        finally:
            if self.requests is not None:
                self.requests.close()
            if self.tracking is not None:
                self.tracking.close(completed=self._completed)
            if self.status is not None:
                self.status.close()
            self.metrics.close()
            if self._pid_file is not None:
                preempt.unregister_pid(self._pid_file)
