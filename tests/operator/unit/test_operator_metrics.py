"""The operator's Prometheus series (``metrics``): exact names, per-owner series and their removal."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import operator_factories as factories
import pytest

from trainop.controller import kinds, metrics

EXPECTED_NAMES = {
    "trainop_operator_reconcile_total": "counter",
    "trainop_operator_reconcile_duration_seconds": "histogram",
    "trainop_operator_jobs": "gauge",
    "trainop_operator_restarts_total": "counter",
    "trainop_operator_failures_total": "counter",
    "trainop_operator_time_to_running_seconds": "histogram",
    "trainop_job_phase": "gauge",
    "trainop_job_step": "gauge",
    "trainop_job_restarts": "gauge",
    "trainop_job_checkpoint_timestamp_seconds": "gauge",
    "trainop_job_progress_timestamp_seconds": "gauge",
    "trainop_job_allreduce_bus_bandwidth_bytes_per_second": "gauge",
    "trainop_job_samples_per_second": "gauge",
    "trainop_job_loss": "gauge",
    "trainop_job_goodput_ratio": "gauge",
}


def families() -> dict[str, str]:
    out = {}
    for family in metrics.REGISTRY.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        out[name] = family.type
    return out


def value(metric: str, **labels: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(metric, labels)


def series(metric: str, **labels: str) -> list[dict[str, str]]:
    found = []
    for family in metrics.REGISTRY.collect():
        for sample in family.samples:
            if sample.name == metric and all(sample.labels.get(k) == v for k, v in labels.items()):
                found.append(sample.labels)
    return found


@pytest.fixture
def owners() -> Iterator[metrics.OwnerMetrics]:
    tracker = metrics.OwnerMetrics()
    yield tracker
    for kind in kinds.ALL:  # leave the process-wide registry clean for the next test
        for namespace, name in [("team-a", "mlp"), ("team-a", "lr"), ("team-b", "mlp")]:
            tracker.forget(kind, namespace, name)


def running_job(**status: Any) -> dict[str, Any]:
    return factories.job(status={"phase": "Running", "restarts": 1, **status})


def test_the_registry_has_exactly_the_agreed_metric_names_and_types() -> None:
    assert families() == EXPECTED_NAMES


def reconcile_samples() -> dict[tuple[str, str], float]:
    """Every reconcile counter and duration sample by (sample, kind[/result]); a missing one reads 0."""
    out = {}
    for kind in kinds.ALL:
        for result in ("success", "error"):
            out[("total", f"{kind.kind}/{result}")] = (
                value("trainop_operator_reconcile_total", kind=kind.kind, result=result) or 0.0
            )
        for sample in ("count", "sum"):
            out[(sample, kind.kind)] = (
                value(f"trainop_operator_reconcile_duration_seconds_{sample}", kind=kind.kind) or 0.0
            )
    return out


def changes(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]) -> dict[Any, float]:
    return {key: after[key] - before[key] for key in after if after[key] != before[key]}


def test_a_reconcile_counts_once_under_its_kind_and_result_and_observes_its_duration() -> None:
    before = reconcile_samples()
    metrics.record_reconcile(kinds.TRAINING_JOB, ok=False, seconds=0.25)
    after_error = reconcile_samples()
    assert changes(before, after_error) == {  # nothing else moved: success, the other kind
        ("total", "TrainingJob/error"): 1,
        ("count", "TrainingJob"): 1,
        ("sum", "TrainingJob"): pytest.approx(0.25),
    }

    metrics.record_reconcile(kinds.TUNING_SWEEP, ok=True, seconds=0.5)
    assert changes(after_error, reconcile_samples()) == {
        ("total", "TuningSweep/success"): 1,
        ("count", "TuningSweep"): 1,
        ("sum", "TuningSweep"): pytest.approx(0.5),
    }


def test_a_job_gets_one_phase_series_and_is_counted_in_its_phase(owners: metrics.OwnerMetrics) -> None:
    before = value("trainop_operator_jobs", kind="TrainingJob", phase="Running") or 0
    owners.observe(kinds.TRAINING_JOB, running_job())
    assert series("trainop_job_phase", namespace="team-a", name="mlp") == [
        {"namespace": "team-a", "name": "mlp", "kind": "TrainingJob", "phase": "Running"}
    ]
    assert (
        value("trainop_job_phase", namespace="team-a", name="mlp", kind="TrainingJob", phase="Running") == 1
    )
    assert value("trainop_operator_jobs", kind="TrainingJob", phase="Running") == before + 1


def test_a_phase_change_moves_the_count_and_replaces_the_phase_series(owners: metrics.OwnerMetrics) -> None:
    owners.observe(kinds.TRAINING_JOB, running_job())
    running = value("trainop_operator_jobs", kind="TrainingJob", phase="Running") or 0
    restarting = value("trainop_operator_jobs", kind="TrainingJob", phase="Restarting") or 0
    owners.observe(kinds.TRAINING_JOB, running_job(phase="Restarting"))
    assert [s["phase"] for s in series("trainop_job_phase", namespace="team-a", name="mlp")] == ["Restarting"]
    assert value("trainop_operator_jobs", kind="TrainingJob", phase="Running") == running - 1
    assert value("trainop_operator_jobs", kind="TrainingJob", phase="Restarting") == restarting + 1


def test_repeated_events_of_an_unchanged_phase_are_not_counted_twice(owners: metrics.OwnerMetrics) -> None:
    owners.observe(kinds.TRAINING_JOB, running_job())
    count = value("trainop_operator_jobs", kind="TrainingJob", phase="Running")
    owners.observe(kinds.TRAINING_JOB, running_job(progress={"step": 9}))
    assert value("trainop_operator_jobs", kind="TrainingJob", phase="Running") == count


def test_trainer_reported_fields_become_job_series(owners: metrics.OwnerMetrics) -> None:
    owners.observe(
        kinds.TRAINING_JOB,
        running_job(
            progress={
                "step": 120,
                "loss": 0.25,
                "samplesPerSecond": 512.5,
                "updated": "2026-03-01T12:00:00Z",
            },
            checkpoint={"step": 100, "path": "/checkpoints/x", "time": "2026-03-01T11:59:00Z"},
            network={"profile": "nvlink", "backend": "nccl", "allReduceBusBandwidthGBPerSecond": 180.5},
        ),
    )
    labels = {"namespace": "team-a", "name": "mlp"}
    assert value("trainop_job_step", **labels) == 120
    assert value("trainop_job_loss", **labels) == 0.25
    assert value("trainop_job_samples_per_second", **labels) == 512.5
    assert value("trainop_job_restarts", **labels) == 1
    assert value("trainop_job_progress_timestamp_seconds", **labels) == 1772366400.0
    assert value("trainop_job_checkpoint_timestamp_seconds", **labels) == 1772366340.0
    assert (
        value(
            "trainop_job_allreduce_bus_bandwidth_bytes_per_second", **labels, profile="nvlink", backend="nccl"
        )
        == 180.5e9
    )


def test_deleting_a_job_removes_all_its_series_and_uncounts_it(owners: metrics.OwnerMetrics) -> None:
    owners.observe(kinds.TRAINING_JOB, running_job(progress={"step": 1, "loss": 2.0}))
    count = value("trainop_operator_jobs", kind="TrainingJob", phase="Running") or 0
    owners.forget(kinds.TRAINING_JOB, "team-a", "mlp")
    for metric in EXPECTED_NAMES:
        if metric.startswith("trainop_job_"):
            assert series(metric, namespace="team-a", name="mlp") == [], metric
    assert value("trainop_operator_jobs", kind="TrainingJob", phase="Running") == count - 1


def test_a_sweep_has_a_phase_series_but_no_trainer_series(owners: metrics.OwnerMetrics) -> None:
    owners.observe(kinds.TUNING_SWEEP, factories.sweep(status={"phase": "Running", "restarts": 2}))
    assert [s["kind"] for s in series("trainop_job_phase", namespace="team-a", name="lr")] == ["TuningSweep"]
    assert series("trainop_job_restarts", namespace="team-a", name="lr") == []


def test_every_phase_of_every_kind_has_a_count_even_when_zero() -> None:
    for kind in ("TrainingJob", "TuningSweep"):
        for phase in ("Pending", "Provisioning", "Running", "Restarting", "Suspended", "Succeeded", "Failed"):
            assert value("trainop_operator_jobs", kind=kind, phase=phase) is not None


def test_bandwidth_series_carries_the_reported_profile_and_follows_a_change_of_it(
    owners: metrics.OwnerMetrics,
) -> None:
    owners.observe(
        kinds.TRAINING_JOB,
        running_job(network={"profile": "tcp", "backend": "nccl", "allReduceBusBandwidthGBPerSecond": 1.5}),
    )
    owners.observe(
        kinds.TRAINING_JOB,
        running_job(
            network={"profile": "infiniband", "backend": "nccl", "allReduceBusBandwidthGBPerSecond": 22.0}
        ),
    )
    assert series("trainop_job_allreduce_bus_bandwidth_bytes_per_second", namespace="team-a", name="mlp") == [
        {"namespace": "team-a", "name": "mlp", "profile": "infiniband", "backend": "nccl"}
    ]
    assert (
        value(
            "trainop_job_allreduce_bus_bandwidth_bytes_per_second",
            namespace="team-a",
            name="mlp",
            profile="infiniband",
            backend="nccl",
        )
        == 22.0e9
    )


def test_deleting_a_job_removes_its_bandwidth_series_whatever_its_profile(
    owners: metrics.OwnerMetrics,
) -> None:
    owners.observe(
        kinds.TRAINING_JOB, running_job(network={"profile": "roce", "allReduceBusBandwidthGBPerSecond": 12.0})
    )
    assert series("trainop_job_allreduce_bus_bandwidth_bytes_per_second", namespace="team-a", name="mlp")
    owners.forget(kinds.TRAINING_JOB, "team-a", "mlp")
    assert (
        series("trainop_job_allreduce_bus_bandwidth_bytes_per_second", namespace="team-a", name="mlp") == []
    )
