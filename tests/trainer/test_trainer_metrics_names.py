"""The metric names on the trainer's registry are exactly the ones the dashboards use."""

from __future__ import annotations

from trainop_trainer import metrics

EXPECTED = {
    "trainop_trainer_step": ("gauge", ("job", "rank")),
    "trainop_trainer_step_seconds": ("histogram", ("job", "rank")),
    "trainop_trainer_samples_per_second": ("gauge", ("job", "rank")),
    "trainop_trainer_loss": ("gauge", ("job", "rank")),
    "trainop_trainer_checkpoint_save_seconds": ("histogram", ("job", "rank")),
    "trainop_trainer_checkpoint_last_step": ("gauge", ("job", "rank")),
    "trainop_trainer_allreduce_bus_bandwidth_bytes_per_second": ("gauge", ("job", "rank")),
    "trainop_trainer_worker_restarts": ("gauge", ("job", "rank")),
    "trainop_trainer_gpu_utilization_percent": ("gauge", ("job", "rank", "gpu")),
    "trainop_trainer_gpu_memory_used_bytes": ("gauge", ("job", "rank", "gpu")),
    "trainop_trainer_gpu_power_watts": ("gauge", ("job", "rank", "gpu")),
    "trainop_trainer_gpu_temperature_celsius": ("gauge", ("job", "rank", "gpu")),
    "trainop_trainer_evaluation": ("gauge", ("job", "rank", "metric")),
    "trainop_trainer_best_checkpoint_step": ("gauge", ("job", "rank")),
    "trainop_trainer_cost_gpu_hours": ("gauge", ("job", "rank")),
    "trainop_trainer_cost_idle_gpu_hours": ("gauge", ("job", "rank")),
    "trainop_trainer_cost_estimated": ("gauge", ("job", "rank", "currency")),
}


def test_registry_holds_exactly_the_dashboard_metric_names_types_and_labels() -> None:
    collectors = {c._name: c for c in metrics.REGISTRY._collector_to_names}  # type: ignore[attr-defined]
    found = {name: (c._type, tuple(c._labelnames)) for name, c in collectors.items()}
    assert found == EXPECTED
    assert set(metrics.METRIC_NAMES) == set(EXPECTED)
