"""Every metric the rules and dashboards query is one the code registers, with the labels they use.

Sources of truth, in order: the code's registries (``trainop.controller.metrics.REGISTRY`` and
``trainop_trainer.metrics.REGISTRY``, prometheus_client CollectorRegistry objects), then the contract in
CONTRACT below (the names agreed for issue #11), which both registries must also satisfy. A metric a
dashboard shows but nothing exports is an empty panel forever; a label an alert groups by that the metric
lacks is an alert that can never fire.
"""

from __future__ import annotations

import importlib
import json
from types import ModuleType
from typing import Any

import pytest
import yaml

from . import promql
from .conftest import DASHBOARDS, RULES_FILE

# name -> (type, labels the code must put on the series). Trainer series also get `namespace`, `pod`
# and `node` from the scrape (PodMonitor / scrape config), which is why those are not listed here.
JOB = ("namespace", "name")
WORKER = ("job", "rank")
GPU = ("job", "rank", "gpu")
CONTRACT: dict[str, tuple[str, tuple[str, ...]]] = {
    "trainop_operator_reconcile_total": ("counter", ("kind", "result")),
    "trainop_operator_reconcile_duration_seconds": ("histogram", ("kind",)),
    "trainop_operator_jobs": ("gauge", ("kind", "phase")),
    "trainop_operator_restarts_total": ("counter", ("kind",)),
    "trainop_operator_failures_total": ("counter", ("kind", "reason")),
    "trainop_operator_time_to_running_seconds": ("histogram", ("kind",)),
    "trainop_job_phase": ("gauge", ("namespace", "name", "kind", "phase")),
    "trainop_job_step": ("gauge", JOB),
    "trainop_job_restarts": ("gauge", JOB),
    "trainop_job_checkpoint_timestamp_seconds": ("gauge", JOB),
    "trainop_job_progress_timestamp_seconds": ("gauge", JOB),
    # `profile` (status.network.profile): TrainopAllReduceBandwidthLow compares against that profile's floor;
    # `backend` (status.network.backend: nccl, gloo or unknown): it does so for backend="nccl" only.
    "trainop_job_allreduce_bus_bandwidth_bytes_per_second": ("gauge", (*JOB, "profile", "backend")),
    "trainop_job_samples_per_second": ("gauge", JOB),
    "trainop_job_loss": ("gauge", JOB),
    "trainop_job_goodput_ratio": ("gauge", JOB),
    "trainop_trainer_step": ("gauge", WORKER),
    "trainop_trainer_step_seconds": ("histogram", WORKER),
    "trainop_trainer_samples_per_second": ("gauge", WORKER),
    "trainop_trainer_loss": ("gauge", WORKER),
    "trainop_trainer_checkpoint_save_seconds": ("histogram", WORKER),
    "trainop_trainer_checkpoint_last_step": ("gauge", WORKER),
    "trainop_trainer_allreduce_bus_bandwidth_bytes_per_second": ("gauge", WORKER),
    "trainop_trainer_worker_restarts": ("gauge", WORKER),
    "trainop_trainer_gpu_utilization_percent": ("gauge", GPU),
    "trainop_trainer_gpu_memory_used_bytes": ("gauge", GPU),
    "trainop_trainer_gpu_power_watts": ("gauge", GPU),
    "trainop_trainer_gpu_temperature_celsius": ("gauge", GPU),
    "trainop_trainer_evaluation": ("gauge", (*WORKER, "metric")),
    "trainop_trainer_best_checkpoint_step": ("gauge", WORKER),
    "trainop_trainer_cost_gpu_hours": ("gauge", WORKER),
    "trainop_trainer_cost_idle_gpu_hours": ("gauge", WORKER),
    "trainop_trainer_cost_estimated": ("gauge", (*WORKER, "currency")),
}
# Labels a selector may match on without the code exporting them: added by the scrape.
SCRAPE_LABELS = {"namespace", "pod", "node", "instance", "job"}
REGISTRY_MODULES = ("trainop.controller.metrics", "trainop_trainer.metrics")


def _series_names(name: str, metric_type: str) -> set[str]:
    """The sample names Prometheus stores for a metric of ``metric_type``."""
    if metric_type == "histogram":
        base = name
        return {f"{base}_bucket", f"{base}_sum", f"{base}_count"}
    if metric_type == "summary":
        return {name, f"{name}_sum", f"{name}_count"}
    return {name}


def _recorded_names() -> set[str]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}


def _rule_exprs() -> list[str]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def _dashboard_exprs() -> list[str]:
    exprs = []
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            exprs += [target["expr"] for target in panel.get("targets", [])]
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                # label_values(<selector>, label): the selector is PromQL.
                inner = variable["query"]["query"].removeprefix("label_values(").rsplit(",", 1)[0]
                exprs.append(inner)
    return exprs


def _used() -> dict[str, list[dict[str, str]]]:
    """Metric name -> label matchers of every selector of it in the rules and dashboards."""
    used: dict[str, list[dict[str, str]]] = {}
    for expr in [*_rule_exprs(), *_dashboard_exprs()]:
        for name, matchers in promql.selectors(promql.substitute_grafana_variables(expr)):
            used.setdefault(name, []).append(matchers)
    return used


def _contract_series() -> dict[str, str]:
    """Stored series name -> the contract metric it belongs to."""
    return {series: name for name, (kind, _) in CONTRACT.items() for series in _series_names(name, kind)}


def test_rules_and_dashboards_query_only_contract_metrics() -> None:
    known = set(_contract_series()) | _recorded_names() | {"up"}
    unknown = {name: matchers for name, matchers in _used().items() if name not in known}
    assert not unknown, f"metrics not in the contract: {sorted(unknown)}"


def test_selectors_match_only_labels_the_metric_carries() -> None:
    series = _contract_series()
    for name, selector_matchers in _used().items():
        if name not in series:
            continue
        labels = (
            set(CONTRACT[series[name]][1]) | SCRAPE_LABELS | ({"le"} if name.endswith("_bucket") else set())
        )
        for matchers in selector_matchers:
            assert set(matchers) <= labels, f"{name}{matchers} matches labels it does not carry"


def test_dashboards_cover_training_gpu_and_operator_views() -> None:
    used = set(_used())
    wanted = {
        # training overview: phase, progress, loss, samples/s, checkpoints, restarts
        "trainop_job_phase",
        "trainop_job_step",
        "trainop_job_loss",
        "trainop_job_samples_per_second",
        "trainop_job_checkpoint_timestamp_seconds",
        "trainop_job_restarts",
        "trainop_trainer_worker_restarts",
        # GPU: utilisation, memory, power
        "trainop_trainer_gpu_utilization_percent",
        "trainop_trainer_gpu_memory_used_bytes",
        "trainop_trainer_gpu_power_watts",
        # operator: reconcile rate, errors, latency
        "trainop_operator_reconcile_total",
        "trainop_operator_reconcile_duration_seconds_bucket",
    }
    dashboard_only = {name for expr in _dashboard_exprs() for name in promql.metric_names(expr)}
    assert wanted <= dashboard_only, f"no panel shows: {sorted(wanted - dashboard_only)}"
    assert used


# -------------------------------------------------------------------------------- the code's registries
def _import(module_name: str) -> ModuleType:
    """The registry module; a renamed or removed one fails the test (it must follow REGISTRY_MODULES)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise AssertionError(
            f"{module_name} cannot be imported ({error}): if the metrics moved, update REGISTRY_MODULES"
        ) from error


def _registered(module: ModuleType) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Metric name (as exposed, counters with _total) -> (type, label names), from the registry."""
    registry = module.REGISTRY
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    # prometheus_client keeps label names on the collector only (collect() shows them per child, and a
    # labelled metric without children has none); _collector_to_names is its registry's own index.
    collectors: dict[Any, list[str]] = registry._collector_to_names
    for collector in collectors:
        for family in collector.describe() or collector.collect():
            name = f"{family.name}_total" if family.type == "counter" else family.name
            found[name] = (family.type, tuple(getattr(collector, "_labelnames", ())))
    return found


@pytest.mark.parametrize("module_name", REGISTRY_MODULES)
def test_registry_registers_every_contract_metric_of_its_side(module_name: str) -> None:
    registered = _registered(_import(module_name))
    prefixes = (
        ("trainop_trainer_",)
        if module_name.startswith("trainop_trainer")
        else ("trainop_operator_", "trainop_job_")
    )
    expected = {name for name in CONTRACT if name.startswith(prefixes)}
    missing = sorted(expected - set(registered))
    assert not missing, f"{module_name}.REGISTRY does not register {missing}"
    for name in sorted(expected):
        kind, labels = CONTRACT[name]
        got_kind, got_labels = registered[name]
        assert got_kind == kind, f"{name} is a {got_kind}, the rules and dashboards expect a {kind}"
        lacking = sorted(set(labels) - set(got_labels))
        assert not lacking, (
            f"{name} lacks label(s) {lacking} that the rules/dashboards use (it has {list(got_labels)}); "
            f"add them in {module_name}"
        )


def test_every_metric_queried_is_registered_by_the_code() -> None:
    registered: dict[str, tuple[str, tuple[str, ...]]] = {}
    for module_name in REGISTRY_MODULES:
        registered.update(_registered(_import(module_name)))
    stored = {series for name, (kind, _) in registered.items() for series in _series_names(name, kind)}
    known = stored | _recorded_names() | {"up"}
    unknown = sorted(set(_used()) - known)
    assert not unknown, f"queried but registered by neither the operator nor the trainer: {unknown}"


def test_monitoring_doc_lists_every_metric_and_alert() -> None:
    doc = (RULES_FILE.parents[2] / "docs" / "monitoring.md").read_text()
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    alerts = {rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule}
    missing = sorted(
        name for name in [*CONTRACT, *alerts] if f"`{name}`" not in doc and f"[{name}]" not in doc
    )
    assert not missing, f"docs/monitoring.md does not mention {missing}"
