"""The all-reduce bandwidth series carries ``backend`` (nccl | gloo | unknown) from status.network.backend.

TrainopAllReduceBandwidthLow holds only ``backend="nccl"`` series to the per-profile floors (they are
NCCL's); without the label every multi-worker CPU (gloo) job, e.g. examples/cpu-mlp.yaml at 0.51 GB/s on
the tcp profile, fired it. The promtool side is in monitoring/prometheus/tests/jobs.test.yaml.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import prometheus_client
import pytest

from trainop.controller import kinds, metrics

METRIC = "trainop_job_allreduce_bus_bandwidth_bytes_per_second"
NAMESPACE = "backend-label"
NAMES = ("cpu-mlp", "gpu", "odd")


def job(name: str, **network: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": NAMESPACE, "name": name},
        "status": {"phase": "Running", "network": network},
    }


def series(name: str) -> list[dict[str, str]]:
    return [
        dict(sample.labels)
        for family in metrics.REGISTRY.collect()
        for sample in family.samples
        if sample.name == METRIC
        and sample.labels.get("namespace") == NAMESPACE
        and sample.labels.get("name") == name
    ]


@pytest.fixture
def owners() -> Iterator[metrics.OwnerMetrics]:
    tracker = metrics.OwnerMetrics()
    yield tracker
    for name in NAMES:  # the registry is process-wide: leave nothing behind
        tracker.forget(kinds.TRAINING_JOB, NAMESPACE, name)


def test_the_bandwidth_gauge_declares_the_backend_label() -> None:
    assert metrics.JOB_BUS_BANDWIDTH._labelnames == ("namespace", "name", "profile", "backend")


def test_a_gloo_job_is_exported_with_backend_gloo(owners: metrics.OwnerMetrics) -> None:
    # examples/cpu-mlp.yaml: profile tcp, 2 CPU workers, gloo at 0.51 GB/s (docs/experiment.md).
    owners.observe(
        kinds.TRAINING_JOB,
        job("cpu-mlp", profile="tcp", backend="gloo", allReduceBusBandwidthGBPerSecond=0.51),
    )
    assert series("cpu-mlp") == [
        {"namespace": NAMESPACE, "name": "cpu-mlp", "profile": "tcp", "backend": "gloo"}
    ]
    labels = {"namespace": NAMESPACE, "name": "cpu-mlp", "profile": "tcp", "backend": "gloo"}
    assert metrics.REGISTRY.get_sample_value(METRIC, labels) == pytest.approx(0.51e9)


def test_the_scraped_text_carries_the_backend_label(owners: metrics.OwnerMetrics) -> None:
    owners.observe(
        kinds.TRAINING_JOB,
        job("gpu", profile="infiniband", backend="nccl", allReduceBusBandwidthGBPerSecond=3.2),
    )
    text = prometheus_client.generate_latest(metrics.REGISTRY).decode()
    lines = [line for line in text.splitlines() if line.startswith(METRIC + "{") and 'name="gpu"' in line]
    assert len(lines) == 1, lines
    assert 'backend="nccl"' in lines[0] and 'profile="infiniband"' in lines[0]
    assert float(lines[0].rsplit(" ", 1)[1]) == pytest.approx(3.2e9)


@pytest.mark.parametrize(
    ("reported", "exported"),
    [
        ("nccl", "nccl"),
        ("gloo", "gloo"),
        ("NCCL", "nccl"),
        (" gloo ", "gloo"),
        ("none", "unknown"),  # the trainer's WorkerContext when no process group exists
        ("mpi", "unknown"),
        ("", "unknown"),
        (None, "unknown"),
        (7, "unknown"),
    ],
)
def test_backend_label_has_three_values_at_most(reported: object, exported: str) -> None:
    assert metrics.backend_label(reported) == exported


def test_a_missing_backend_is_exported_as_unknown(owners: metrics.OwnerMetrics) -> None:
    owners.observe(kinds.TRAINING_JOB, job("odd", profile="tcp", allReduceBusBandwidthGBPerSecond=0.4))
    assert [s["backend"] for s in series("odd")] == ["unknown"]


def test_arbitrary_backends_never_grow_the_series(owners: metrics.OwnerMetrics) -> None:
    """Whatever status.network.backend holds, a job keeps one series, its backend from a fixed set."""
    seen = set()
    for i in range(50):
        owners.observe(
            kinds.TRAINING_JOB,
            job("odd", profile="tcp", backend=f"made-up-{i}", allReduceBusBandwidthGBPerSecond=0.4),
        )
        found = series("odd")
        assert len(found) == 1
        seen.add(found[0]["backend"])
    assert seen == {"unknown"}


def test_a_change_of_backend_replaces_the_series_and_forget_removes_it(owners: metrics.OwnerMetrics) -> None:
    owners.observe(
        kinds.TRAINING_JOB, job("gpu", profile="tcp", backend="gloo", allReduceBusBandwidthGBPerSecond=0.5)
    )
    owners.observe(
        kinds.TRAINING_JOB, job("gpu", profile="tcp", backend="nccl", allReduceBusBandwidthGBPerSecond=2.5)
    )
    assert series("gpu") == [{"namespace": NAMESPACE, "name": "gpu", "profile": "tcp", "backend": "nccl"}]
    owners.forget(kinds.TRAINING_JOB, NAMESPACE, "gpu")
    assert series("gpu") == []
