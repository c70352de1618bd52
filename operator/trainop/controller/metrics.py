"""The operator's Prometheus metrics, on a dedicated registry (``REGISTRY``), served on their own port.

Names are an interface: dashboards and alerts (monitoring/) are written against them.

Operator series (label ``kind`` is TrainingJob or TuningSweep):

- ``trainop_operator_reconcile_total{kind,result}``       counter, result = success | error
- ``trainop_operator_reconcile_duration_seconds{kind}``   histogram
- ``trainop_operator_jobs{kind,phase}``                   gauge, owners per phase (every phase, 0 included)
- ``trainop_operator_restarts_total{kind}``               counter, attempts started after a failure
- ``trainop_operator_failures_total{kind,reason}``        counter, failed attempts by class (``reason`` is
  a ``FailureReason``: nine values, every one present from the start), counted when recorded on status
- ``trainop_operator_time_to_running_seconds{kind}``      histogram, RayJob created -> Ray job RUNNING

Per-owner series, removed when the owner is deleted:

- ``trainop_job_phase{namespace,name,kind,phase}``        1, one series: the current phase
- ``trainop_job_step``, ``trainop_job_restarts``, ``trainop_job_checkpoint_timestamp_seconds``,
  ``trainop_job_progress_timestamp_seconds``, ``trainop_job_samples_per_second``, ``trainop_job_loss``
  ``{namespace,name}``, and
  ``trainop_job_allreduce_bus_bandwidth_bytes_per_second{namespace,name,profile,backend}``
  (bytes/s, base unit: ``status.network.allReduceBusBandwidthGBPerSecond`` * 1e9; ``profile`` is
  ``status.network.profile``, so an alert can compare against that profile's floor; ``backend`` is
  ``status.network.backend`` when it is ``nccl`` or ``gloo``, otherwise ``unknown`` (three values at most),
  so the floors, which are NCCL's, apply to NCCL jobs only and never to CPU (gloo) jobs; one series per
  job: when the trainer reports another profile or backend the old series is replaced, never left
  behind), and
  ``trainop_job_goodput_ratio{namespace,name}`` (``status.goodput.ratio``): TrainingJobs only
  (they carry no kind label, so a same-named sweep must not write them); a series appears once its
  status field does.

Per-owner series are updated from every watch event of the owner (the trainer's status patches
included): no API call, O(1) per event. Nothing here may touch the API.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Mapping
from typing import Any

import prometheus_client

from trainop.api.operator_status import FailureReason, Phase
from trainop.controller import kinds, observe

REGISTRY = prometheus_client.CollectorRegistry(auto_describe=True)

RECONCILE_TOTAL = prometheus_client.Counter(
    "trainop_operator_reconcile_total", "Reconciles by result.", ["kind", "result"], registry=REGISTRY
)
RECONCILE_DURATION = prometheus_client.Histogram(
    "trainop_operator_reconcile_duration_seconds", "Time one reconcile took.", ["kind"], registry=REGISTRY
)
JOBS = prometheus_client.Gauge(
    "trainop_operator_jobs", "Owners the operator sees, by phase.", ["kind", "phase"], registry=REGISTRY
)
RESTARTS_TOTAL = prometheus_client.Counter(
    "trainop_operator_restarts_total", "Attempts started after a failed attempt.", ["kind"], registry=REGISTRY
)
FAILURES_TOTAL = prometheus_client.Counter(
    "trainop_operator_failures_total",
    "Failed attempts, by failure class (status.failures[].reason).",
    ["kind", "reason"],
    registry=REGISTRY,
)
TIME_TO_RUNNING = prometheus_client.Histogram(
    "trainop_operator_time_to_running_seconds",
    "From the creation of an attempt's RayJob to its Ray job running.",
    ["kind"],
    buckets=(5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200),
    registry=REGISTRY,
)
JOB_PHASE = prometheus_client.Gauge(
    "trainop_job_phase",
    "1 for the owner's current phase.",
    ["namespace", "name", "kind", "phase"],
    registry=REGISTRY,
)
_JOB_LABELS = ["namespace", "name"]
JOB_STEP = prometheus_client.Gauge(
    "trainop_job_step", "Optimizer step (trainer-reported).", _JOB_LABELS, registry=REGISTRY
)
JOB_RESTARTS = prometheus_client.Gauge(
    "trainop_job_restarts", "Restarts of the job.", _JOB_LABELS, registry=REGISTRY
)
JOB_CHECKPOINT_TIME = prometheus_client.Gauge(
    "trainop_job_checkpoint_timestamp_seconds",
    "Unix time of the latest checkpoint.",
    _JOB_LABELS,
    registry=REGISTRY,
)
JOB_PROGRESS_TIME = prometheus_client.Gauge(
    "trainop_job_progress_timestamp_seconds",
    "Unix time of the latest progress report.",
    _JOB_LABELS,
    registry=REGISTRY,
)
JOB_BUS_BANDWIDTH = prometheus_client.Gauge(
    "trainop_job_allreduce_bus_bandwidth_bytes_per_second",
    "All-reduce bus bandwidth the trainer measured at start-up, in bytes per second (nccl-tests' busbw "
    "definition; status.network.allReduceBusBandwidthGBPerSecond * 1e9); profile is the network profile "
    "it ran with (status.network.profile); backend is the torch.distributed backend it measured "
    "(status.network.backend: nccl, gloo, or unknown).",
    [*_JOB_LABELS, "profile", "backend"],
    registry=REGISTRY,
)
JOB_SAMPLES_PER_SECOND = prometheus_client.Gauge(
    "trainop_job_samples_per_second", "Training throughput.", _JOB_LABELS, registry=REGISTRY
)
JOB_LOSS = prometheus_client.Gauge(
    "trainop_job_loss", "Latest training loss.", _JOB_LABELS, registry=REGISTRY
)
JOB_GOODPUT = prometheus_client.Gauge(
    "trainop_job_goodput_ratio",
    "Productive training time over wall time since the job started (status.goodput.ratio).",
    _JOB_LABELS,
    registry=REGISTRY,
)

_TRAINER_GAUGES = (
    JOB_STEP,
    JOB_RESTARTS,
    JOB_CHECKPOINT_TIME,
    JOB_PROGRESS_TIME,
    JOB_SAMPLES_PER_SECOND,
    JOB_LOSS,
    JOB_GOODPUT,
)

OwnerKey = tuple[str, str, str]  # kind, namespace, name

# Values of the bandwidth series' backend label: the trainer's two backends (nccl on GPUs, gloo on CPUs).
# Anything else the status holds (absent, "none", a typo) is exported as BACKEND_UNKNOWN, so the label
# has three values at most whatever is written into status.
BACKENDS = frozenset({"nccl", "gloo"})
BACKEND_UNKNOWN = "unknown"

# Zero-valued series from the start, so rate() and absent() work before the first reconcile.
for _kind in kinds.ALL:
    for _result in ("success", "error"):
        RECONCILE_TOTAL.labels(_kind.kind, _result)
    RESTARTS_TOTAL.labels(_kind.kind)
    for _reason in FailureReason:
        FAILURES_TOTAL.labels(_kind.kind, _reason.value)


class OwnerMetrics:
    """Per-owner series and the per-phase counts, kept consistent under concurrent watch events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phases: dict[OwnerKey, str] = {}
        # The (profile, backend) labels of each job's bandwidth series, to replace or remove it.
        self._bandwidth_labels: dict[tuple[str, str], tuple[str, str]] = {}
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()
        for kind in kinds.ALL:
            for phase in Phase:
                JOBS.labels(kind.kind, phase.value).set(0)

    def observe(self, kind: kinds.Kind, body: Mapping[str, Any]) -> None:
        namespace = str(body["metadata"].get("namespace"))
        name = str(body["metadata"]["name"])
        status: Mapping[str, Any] = body.get("status") or {}
        phase = str(status.get("phase") or Phase.PENDING.value)
        self._set_phase((kind.kind, namespace, name), phase)
        if kind is kinds.TRAINING_JOB:  # sweeps have no trainer series
            self._observe_trainer(namespace, name, status)

    def forget(self, kind: kinds.Kind, namespace: str, name: str) -> None:
        key = (kind.kind, namespace, name)
        with self._lock:
            phase = self._phases.pop(key, None)
            if phase is None:
                return
            self._counts[(kind.kind, phase)] -= 1
            JOBS.labels(kind.kind, phase).set(self._counts[(kind.kind, phase)])
            _remove(JOB_PHASE, namespace, name, kind.kind, phase)
        if kind is kinds.TRAINING_JOB:  # sweeps have no trainer series
            for gauge in _TRAINER_GAUGES:
                _remove(gauge, namespace, name)
            with self._lock:
                labels = self._bandwidth_labels.pop((namespace, name), None)
            if labels is not None:
                _remove(JOB_BUS_BANDWIDTH, namespace, name, *labels)

    def _set_phase(self, key: OwnerKey, phase: str) -> None:
        kind, namespace, name = key
        with self._lock:
            previous = self._phases.get(key)
            if previous == phase:
                return
            if previous is not None:
                self._counts[(kind, previous)] -= 1
                JOBS.labels(kind, previous).set(self._counts[(kind, previous)])
                _remove(JOB_PHASE, namespace, name, kind, previous)
            self._phases[key] = phase
            self._counts[(kind, phase)] += 1
            JOBS.labels(kind, phase).set(self._counts[(kind, phase)])
            JOB_PHASE.labels(namespace, name, kind, phase).set(1)

    def _observe_trainer(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        progress: Mapping[str, Any] = status.get("progress") or {}
        checkpoint: Mapping[str, Any] = status.get("checkpoint") or {}
        goodput: Mapping[str, Any] = status.get("goodput") or {}
        network: Mapping[str, Any] = status.get("network") or {}
        values: list[tuple[prometheus_client.Gauge, float | None]] = [
            (JOB_RESTARTS, _number(status.get("restarts", 0))),
            (JOB_STEP, _number(progress.get("step"))),
            (JOB_LOSS, _number(progress.get("loss"))),
            (JOB_SAMPLES_PER_SECOND, _number(progress.get("samplesPerSecond"))),
            (JOB_PROGRESS_TIME, _timestamp(progress.get("updated"))),
            (JOB_CHECKPOINT_TIME, _timestamp(checkpoint.get("time"))),
            (JOB_GOODPUT, _number(goodput.get("ratio"))),
        ]
        for gauge, value in values:
            if value is not None:
                gauge.labels(namespace, name).set(value)
        gb_per_second = _number(network.get("allReduceBusBandwidthGBPerSecond"))
        if gb_per_second is not None:
            bandwidth = gb_per_second * 1e9  # the status carries GB/s; the metric is in base units
            labels = (str(network.get("profile") or ""), backend_label(network.get("backend")))
            with self._lock:
                previous = self._bandwidth_labels.get((namespace, name))
                if previous is not None and previous != labels:
                    _remove(JOB_BUS_BANDWIDTH, namespace, name, *previous)
                self._bandwidth_labels[(namespace, name)] = labels
                JOB_BUS_BANDWIDTH.labels(namespace, name, *labels).set(bandwidth)


def backend_label(value: object) -> str:
    """The ``backend`` label for ``status.network.backend``: nccl, gloo or unknown."""
    backend = value.strip().lower() if isinstance(value, str) else ""
    return backend if backend in BACKENDS else BACKEND_UNKNOWN


def record_reconcile(kind: kinds.Kind, *, ok: bool, seconds: float) -> None:
    RECONCILE_TOTAL.labels(kind.kind, "success" if ok else "error").inc()
    RECONCILE_DURATION.labels(kind.kind).observe(seconds)


def record_restart(kind: kinds.Kind) -> None:
    RESTARTS_TOTAL.labels(kind.kind).inc()


def record_failure(kind: kinds.Kind, reason: FailureReason) -> None:
    FAILURES_TOTAL.labels(kind.kind, reason.value).inc()


def record_time_to_running(kind: kinds.Kind, seconds: float) -> None:
    TIME_TO_RUNNING.labels(kind.kind).observe(seconds)


def serve(port: int, address: str = "0.0.0.0") -> None:
    """Expose ``REGISTRY`` over HTTP on a background thread (prometheus-client's own server)."""
    # *_created series would double the output, and no dashboard or alert uses them.
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    prometheus_client.start_http_server(port, addr=address, registry=REGISTRY)


def _remove(gauge: prometheus_client.Gauge, *labels: str) -> None:
    with contextlib.suppress(KeyError):
        gauge.remove(*labels)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _timestamp(value: object) -> float | None:
    parsed = observe.parse_time(value)
    return parsed.timestamp() if parsed is not None else None
