"""Prometheus metrics of every worker, on a dedicated registry (``REGISTRY``) served over HTTP.

Names are fixed (dashboards and alerts in monitoring/ match them); every series carries ``job`` (the
TrainingJob name) and ``rank``; GPU series also carry ``gpu``::

    trainop_trainer_step                          gauge      optimizer steps done
    trainop_trainer_step_seconds                  histogram  wall time per optimizer step (host clock)
    trainop_trainer_samples_per_second            gauge      global throughput over the last report window
    trainop_trainer_loss                          gauge      mean loss over ranks, last report window
    trainop_trainer_checkpoint_save_seconds       histogram  snapshot + background write of a checkpoint
    trainop_trainer_checkpoint_last_step          gauge      step of the newest checkpoint on disk
    trainop_trainer_allreduce_bus_bandwidth_bytes_per_second  gauge  start-up probe, bytes/s
    trainop_trainer_worker_restarts               gauge      worker-group restarts in this attempt
    trainop_trainer_gpu_utilization_percent       gauge      NVML, sampled every few seconds
    trainop_trainer_gpu_memory_used_bytes         gauge
    trainop_trainer_gpu_power_watts               gauge
    trainop_trainer_gpu_temperature_celsius       gauge
    trainop_trainer_evaluation                    gauge      last evaluation, one series per ``metric``
    trainop_trainer_best_checkpoint_step          gauge      step of the checkpoint kept by keepBest
    trainop_trainer_cost_gpu_hours                gauge      GPUs x allocated hours, every attempt (rank 0)
    trainop_trainer_cost_idle_gpu_hours           gauge      GPUs x hours allocated but not training
    trainop_trainer_cost_estimated                gauge      GPU-hours x price, label ``currency``

Port: ``spec.reporting.metricsPort + local_rank`` (one worker per GPU shares a pod, so each needs its own
port; local mode on one machine uses the same rule). A port already taken falls back to an ephemeral
one, with a warning naming it. Step time is measured on the host between optimizer steps, with no device
synchronisation: in steady state the host runs at the device's pace, and syncing would slow training.
A Prometheus server scraping these should keep our ``job`` label (``honor_labels: true``) or it becomes
``exported_job``.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Gauge, Histogram

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)
_LABELS = ("job", "rank")
_GPU_LABELS = ("job", "rank", "gpu")

STEP = Gauge("trainop_trainer_step", "Optimizer steps done.", _LABELS, registry=REGISTRY)
STEP_SECONDS = Histogram(
    "trainop_trainer_step_seconds",
    "Wall time of one optimizer step, measured on the host.",
    _LABELS,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=REGISTRY,
)
SAMPLES_PER_SECOND = Gauge(
    "trainop_trainer_samples_per_second", "Samples per second over all workers.", _LABELS, registry=REGISTRY
)
LOSS = Gauge("trainop_trainer_loss", "Training loss (mean over workers).", _LABELS, registry=REGISTRY)
CHECKPOINT_SAVE_SECONDS = Histogram(
    "trainop_trainer_checkpoint_save_seconds",
    "Time to snapshot and write one checkpoint.",
    _LABELS,
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
    registry=REGISTRY,
)
CHECKPOINT_LAST_STEP = Gauge(
    "trainop_trainer_checkpoint_last_step",
    "Step of the newest complete checkpoint.",
    _LABELS,
    registry=REGISTRY,
)
ALLREDUCE_BUS_BANDWIDTH = Gauge(
    "trainop_trainer_allreduce_bus_bandwidth_bytes_per_second",
    "All-reduce bus bandwidth measured at start-up, in bytes per second (nccl-tests' busbw).",
    _LABELS,
    registry=REGISTRY,
)
WORKER_RESTARTS = Gauge(
    "trainop_trainer_worker_restarts", "Worker-group restarts in this attempt.", _LABELS, registry=REGISTRY
)
GPU_UTILIZATION = Gauge(
    "trainop_trainer_gpu_utilization_percent", "GPU utilisation (NVML).", _GPU_LABELS, registry=REGISTRY
)
GPU_MEMORY_USED = Gauge(
    "trainop_trainer_gpu_memory_used_bytes", "GPU memory in use (NVML).", _GPU_LABELS, registry=REGISTRY
)
GPU_POWER = Gauge("trainop_trainer_gpu_power_watts", "GPU power draw (NVML).", _GPU_LABELS, registry=REGISTRY)
GPU_TEMPERATURE = Gauge(
    "trainop_trainer_gpu_temperature_celsius", "GPU temperature (NVML).", _GPU_LABELS, registry=REGISTRY
)

EVALUATION = Gauge(
    "trainop_trainer_evaluation",
    "The last evaluation's metrics (loss, accuracy, top5Accuracy, perplexity, ...), mean over workers.",
    ("job", "rank", "metric"),
    registry=REGISTRY,
)
BEST_CHECKPOINT_STEP = Gauge(
    "trainop_trainer_best_checkpoint_step",
    "Step of the best checkpoint (checkpoint.keepBest).",
    _LABELS,
    registry=REGISTRY,
)
COST_GPU_HOURS = Gauge(
    "trainop_trainer_cost_gpu_hours",
    "GPU-hours the job has used, every attempt: GPUs x hours its workers existed.",
    _LABELS,
    registry=REGISTRY,
)
COST_IDLE_GPU_HOURS = Gauge(
    "trainop_trainer_cost_idle_gpu_hours",
    "GPU-hours allocated but not training: start-up, worker restarts, stalls.",
    _LABELS,
    registry=REGISTRY,
)
COST_ESTIMATED = Gauge(
    "trainop_trainer_cost_estimated",
    "Estimated cost of the job so far: GPU-hours x the price per GPU-hour.",
    ("job", "rank", "currency"),
    registry=REGISTRY,
)

METRIC_NAMES = (
    "trainop_trainer_step",
    "trainop_trainer_step_seconds",
    "trainop_trainer_samples_per_second",
    "trainop_trainer_loss",
    "trainop_trainer_checkpoint_save_seconds",
    "trainop_trainer_checkpoint_last_step",
    "trainop_trainer_allreduce_bus_bandwidth_bytes_per_second",
    "trainop_trainer_worker_restarts",
    "trainop_trainer_gpu_utilization_percent",
    "trainop_trainer_gpu_memory_used_bytes",
    "trainop_trainer_gpu_power_watts",
    "trainop_trainer_gpu_temperature_celsius",
    "trainop_trainer_evaluation",
    "trainop_trainer_best_checkpoint_step",
    "trainop_trainer_cost_gpu_hours",
    "trainop_trainer_cost_idle_gpu_hours",
    "trainop_trainer_cost_estimated",
)

_server_lock = threading.Lock()
_server_port: int | None = None


def serve(port: int) -> int:
    """Start the HTTP endpoint once per process; returns the port actually bound."""
    global _server_port
    with _server_lock:
        if _server_port is not None:
            return _server_port
        try:
            server, _ = prometheus_client.start_http_server(port, registry=REGISTRY)
        except OSError as exc:
            log.warning(
                "metrics port %d is unavailable (%s); serving on an ephemeral port instead", port, exc
            )
            server, _ = prometheus_client.start_http_server(0, registry=REGISTRY)
        _server_port = int(server.server_address[1])
        log.info("metrics on http://0.0.0.0:%d/metrics", _server_port)
        return _server_port


class WorkerMetrics:
    """The series of one worker, with its labels bound."""

    def __init__(self, *, job: str, rank: int) -> None:
        self.job = job
        self.rank = str(rank)
        labels = {"job": job, "rank": self.rank}
        self.step = STEP.labels(**labels)
        self.step_seconds = STEP_SECONDS.labels(**labels)
        self.samples_per_second = SAMPLES_PER_SECOND.labels(**labels)
        self.loss = LOSS.labels(**labels)
        self.checkpoint_save_seconds = CHECKPOINT_SAVE_SECONDS.labels(**labels)
        self.checkpoint_last_step = CHECKPOINT_LAST_STEP.labels(**labels)
        self.allreduce_bus_bandwidth = ALLREDUCE_BUS_BANDWIDTH.labels(**labels)
        self.worker_restarts = WORKER_RESTARTS.labels(**labels)
        self.best_checkpoint_step = BEST_CHECKPOINT_STEP.labels(**labels)
        self.cost_gpu_hours = COST_GPU_HOURS.labels(**labels)
        self.cost_idle_gpu_hours = COST_IDLE_GPU_HOURS.labels(**labels)
        self._gpu_sampler: GpuSampler | None = None

    def evaluation(self, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            EVALUATION.labels(job=self.job, rank=self.rank, metric=name).set(value)

    def estimated_cost(self, value: float, currency: str) -> None:
        COST_ESTIMATED.labels(job=self.job, rank=self.rank, currency=currency).set(value)

    def start_gpu_sampler(self, *, cuda_index: int, interval_s: float = 5.0) -> None:
        self._gpu_sampler = GpuSampler(
            job=self.job, rank=self.rank, cuda_index=cuda_index, interval_s=interval_s
        )
        self._gpu_sampler.start()

    def close(self) -> None:
        if self._gpu_sampler is not None:
            self._gpu_sampler.stop()


def _nvml_index(cuda_index: int) -> str:
    """The NVML identity (index or UUID) of CUDA device ``cuda_index`` under CUDA_VISIBLE_DEVICES."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if cuda_index < len(visible):
        return visible[cuda_index]
    return str(cuda_index)


class GpuSampler(threading.Thread):
    """Reads NVML for this worker's GPU every ``interval_s`` seconds (only started when a GPU exists)."""

    def __init__(self, *, job: str, rank: str, cuda_index: int, interval_s: float) -> None:
        super().__init__(name="gpu-metrics", daemon=True)
        self.identity = _nvml_index(cuda_index)
        self.interval_s = interval_s
        self._stop_event = threading.Event()
        labels = {"job": job, "rank": rank, "gpu": self.identity}
        self._gauges = (
            GPU_UTILIZATION.labels(**labels),
            GPU_MEMORY_USED.labels(**labels),
            GPU_POWER.labels(**labels),
            GPU_TEMPERATURE.labels(**labels),
        )

    def _handle(self, pynvml: Any) -> Any:
        if self.identity.isdigit():
            return pynvml.nvmlDeviceGetHandleByIndex(int(self.identity))
        return pynvml.nvmlDeviceGetHandleByUUID(self.identity)

    def run(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = self._handle(pynvml)
        except Exception as exc:
            log.warning("GPU metrics disabled: NVML unavailable (%s)", exc)
            return
        utilization, memory, power, temperature = self._gauges
        try:
            while not self._stop_event.is_set():
                try:
                    utilization.set(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                    memory.set(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
                    power.set(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
                    temperature.set(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
                except pynvml.NVMLError as exc:
                    log.debug("NVML read failed: %s", exc)
                self._stop_event.wait(self.interval_s)
        finally:
            pynvml.nvmlShutdown()

    def stop(self) -> None:
        self._stop_event.set()
