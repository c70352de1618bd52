"""The trainop Grafana dashboards, written as data: ``python monitoring/grafana/dashboards.py`` writes JSON.

The JSON files next to this script are what Grafana loads (the chart ships copies in ConfigMaps for the
Grafana sidecar); this script exists so that panel ids, grid positions and the datasource wiring are
computed instead of hand-maintained. tests/monitoring checks that the JSON is this script's output, that
every query parses (promtool) and that every metric it names is one the operator or trainer registers.

Conventions every query follows (see docs/monitoring.md, "Scraping"):
- operator per-job series carry the job's ``namespace`` and ``name``; trainer series carry ``namespace``,
  ``job`` (the TrainingJob's name), ``rank`` and, for GPU series, ``gpu``;
- the datasource is the ``datasource`` template variable, so provisioning needs no __inputs rewriting.

Standard library only: run it with any Python 3.11.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24

Panel = dict[str, Any]


def _target(expr: str, legend: str = "", *, instant: bool = False, ref: str = "A") -> dict[str, Any]:
    target: dict[str, Any] = {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref}
    if instant:
        target["instant"] = True
        target["range"] = False
        target["format"] = "table"
    return target


def timeseries(
    title: str,
    targets: list[dict[str, Any]],
    *,
    unit: str = "short",
    width: int = 12,
    height: int = 8,
    description: str = "",
    min_zero: bool = False,
) -> Panel:
    defaults: dict[str, Any] = {
        "unit": unit,
        "custom": {"lineWidth": 1, "fillOpacity": 10, "spanNulls": False},
    }
    if min_zero:
        defaults["min"] = 0
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": _refs(targets),
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "_size": (width, height),
    }


def stat(
    title: str,
    targets: list[dict[str, Any]],
    *,
    unit: str = "short",
    width: int = 6,
    height: int = 4,
    description: str = "",
    thresholds: list[tuple[float | None, str]] | None = None,
    mappings: list[dict[str, Any]] | None = None,
) -> Panel:
    steps = [{"color": color, "value": value} for value, color in (thresholds or [(None, "green")])]
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": _refs(targets),
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "thresholds": {"mode": "absolute", "steps": steps},
                "mappings": mappings or [],
            },
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "none",
            "textMode": "auto",
        },
        "_size": (width, height),
    }


def table(
    title: str,
    targets: list[dict[str, Any]],
    *,
    width: int = 24,
    height: int = 8,
    description: str = "",
    hide: list[str] | None = None,
) -> Panel:
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": _refs(targets),
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {"showHeader": True, "cellHeight": "sm"},
        "transformations": [
            {
                "id": "organize",
                "options": {"excludeByName": {name: True for name in ["Time", "Value", *(hide or [])]}},
            }
        ],
        "_size": (width, height),
    }


def row(title: str) -> Panel:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "_size": (GRID_WIDTH, 1)}


def _refs(targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**target, "refId": chr(ord("A") + i)} for i, target in enumerate(targets)]


def _layout(panels: list[Panel]) -> list[Panel]:
    """Give every panel an id and a gridPos, flowing left to right and wrapping at 24 columns."""
    x = y = row_height = 0
    laid_out = []
    for panel_id, panel in enumerate(panels, start=1):
        width, height = panel.pop("_size")
        if x + width > GRID_WIDTH or panel["type"] == "row":
            x, y, row_height = 0, y + row_height, 0
        laid_out.append({"id": panel_id, "gridPos": {"h": height, "w": width, "x": x, "y": y}, **panel})
        x += width
        row_height = max(row_height, height)
        if panel["type"] == "row":
            x, y, row_height = 0, y + height, 0
    return laid_out


def _query_variable(name: str, label: str, query: str, *, include_all: bool = True) -> dict[str, Any]:
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-variable"},
        "refresh": 2,
        "includeAll": include_all,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "options": [],
    }


DATASOURCE_VARIABLE = {
    "type": "datasource",
    "name": "datasource",
    "label": "Data source",
    "query": "prometheus",
    "current": {},
    "options": [],
    "refresh": 1,
    "regex": "",
}


def dashboard(
    *, uid: str, title: str, description: str, panels: list[Panel], variables: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["trainop"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "browser",
        "annotations": {"list": []},
        "links": [
            {
                "type": "dashboards",
                "tags": ["trainop"],
                "asDropdown": True,
                "title": "trainop",
                "includeVars": True,
                "keepTime": True,
            }
        ],
        "templating": {"list": [DATASOURCE_VARIABLE, *variables]},
        "panels": _layout(panels),
    }


# ------------------------------------------------------------------------------------------ training
JOB = 'namespace=~"$namespace", name=~"$job"'  # operator per-job series
WORKER = 'namespace=~"$namespace", job=~"$job"'  # trainer series

PHASE_COLOURS = {
    "Pending": "blue",
    "Provisioning": "blue",
    "Running": "green",
    "Restarting": "orange",
    "Suspended": "purple",
    "Succeeded": "green",
    "Failed": "red",
}


def training_dashboard() -> dict[str, Any]:
    panels = [
        row("Jobs"),
        *[
            stat(
                f"{phase}",
                [_target(f'sum(trainop_operator_jobs{{kind="TrainingJob", phase="{phase}"}}) or vector(0)')],
                width=3,
                height=3,
                thresholds=[(None, "text"), (1, colour)],
                description=f"TrainingJobs in phase {phase}, cluster-wide, as the operator counts them.",
            )
            for phase, colour in PHASE_COLOURS.items()
        ],
        stat(
            "Operator",
            [_target('max(up{job="trainop-operator"}) or vector(0)')],
            width=3,
            height=3,
            thresholds=[(None, "red"), (1, "green")],
            mappings=[{"type": "value", "options": {"0": {"text": "down"}, "1": {"text": "up"}}}],
            description="Whether Prometheus scrapes the operator (alert: TrainopOperatorDown).",
        ),
        table(
            "Current phase",
            [
                _target(
                    f"max by (namespace, name, kind, phase) (trainop_job_phase{{{JOB}}}) == 1", instant=True
                )
            ],
            height=7,
            description="One row per job: the phase the operator last wrote to status.phase.",
        ),
        row("Progress"),
        timeseries(
            "Step",
            [_target(f"max by (namespace, name) (trainop_job_step{{{JOB}}})", "{{namespace}}/{{name}}")],
            description="status.progress.step, as reported by rank 0.",
        ),
        timeseries(
            "Time since last progress report",
            [
                _target(
                    f"time() - max by (namespace, name) (trainop_job_progress_timestamp_seconds{{{JOB}}})",
                    "{{namespace}}/{{name}}",
                )
            ],
            unit="s",
            min_zero=True,
            description="Over 15 minutes while Running fires TrainopJobStalled.",
        ),
        timeseries(
            "Loss",
            [_target(f"max by (namespace, name) (trainop_job_loss{{{JOB}}})", "{{namespace}}/{{name}}")],
            description="status.progress.loss (rank 0).",
        ),
        timeseries(
            "Loss per rank",
            [_target(f"trainop_trainer_loss{{{WORKER}}}", "{{job}} rank {{rank}}")],
            description="Each worker's local loss; ranks drifting apart point at data sharding.",
        ),
        timeseries(
            "Samples per second",
            [
                _target(
                    f"sum by (namespace, name) (trainop_job_samples_per_second{{{JOB}}})",
                    "{{namespace}}/{{name}}",
                )
            ],
            unit="short",
            min_zero=True,
            description="Whole-job throughput (status.progress).",
        ),
        timeseries(
            "Samples per second per rank",
            [_target(f"trainop_trainer_samples_per_second{{{WORKER}}}", "{{job}} rank {{rank}}")],
            unit="short",
            min_zero=True,
            description="A slow rank holds every other rank back.",
        ),
        timeseries(
            "Step time",
            [
                _target(
                    "histogram_quantile(0.5, sum by (le, namespace, job) "
                    f"(rate(trainop_trainer_step_seconds_bucket{{{WORKER}}}[$__rate_interval])))",
                    "{{job}} p50",
                ),
                _target(
                    "histogram_quantile(0.95, sum by (le, namespace, job) "
                    f"(rate(trainop_trainer_step_seconds_bucket{{{WORKER}}}[$__rate_interval])))",
                    "{{job}} p95",
                ),
            ],
            unit="s",
            min_zero=True,
            width=24,
            description="Wall time per optimizer step across all ranks; a widening p95 means stragglers.",
        ),
        row("Checkpoints"),
        timeseries(
            "Time since last checkpoint",
            [
                _target(
                    f"time() - max by (namespace, name) (trainop_job_checkpoint_timestamp_seconds{{{JOB}}})",
                    "{{namespace}}/{{name}}",
                )
            ],
            unit="s",
            min_zero=True,
            width=8,
            description="Over an hour while Running fires TrainopCheckpointStale.",
        ),
        timeseries(
            "Last checkpoint step",
            [
                _target(
                    f"max by (namespace, job) (trainop_trainer_checkpoint_last_step{{{WORKER}}})",
                    "{{namespace}}/{{job}}",
                )
            ],
            width=8,
            description="The step a restart would resume from.",
        ),
        timeseries(
            "Checkpoint save time",
            [
                _target(
                    "histogram_quantile(0.95, sum by (le, namespace, job) "
                    f"(rate(trainop_trainer_checkpoint_save_seconds_bucket{{{WORKER}}}[$__rate_interval])))",
                    "{{job}} p95",
                ),
                _target(
                    "sum by (namespace, job) "
                    f"(rate(trainop_trainer_checkpoint_save_seconds_sum{{{WORKER}}}[1h]))"
                    " / sum by (namespace, job) "
                    f"(rate(trainop_trainer_checkpoint_save_seconds_count{{{WORKER}}}[1h]))",
                    "{{job}} mean (1h)",
                ),
            ],
            unit="s",
            min_zero=True,
            width=8,
            description="How long ranks block writing a checkpoint.",
        ),
        row("Restarts and network"),
        timeseries(
            "Job restarts (new attempts)",
            [_target(f"max by (namespace, name) (trainop_job_restarts{{{JOB}}})", "{{namespace}}/{{name}}")],
            min_zero=True,
            width=8,
            description="status.restarts: RayJobs recreated by the operator.",
        ),
        timeseries(
            "Worker-group restarts (this attempt)",
            [
                _target(
                    f"max by (namespace, job) (trainop_trainer_worker_restarts{{{WORKER}}})",
                    "{{namespace}}/{{job}}",
                )
            ],
            min_zero=True,
            width=8,
            description="Ray Train restarts of the worker group inside one attempt.",
        ),
        timeseries(
            "All-reduce bus bandwidth",
            [
                _target(
                    "max by (namespace, name, profile, backend) "
                    f"(trainop_job_allreduce_bus_bandwidth_bytes_per_second{{{JOB}}})",
                    "{{namespace}}/{{name}} ({{profile}}, {{backend}})",
                ),
                _target(
                    "min by (namespace, job) "
                    f"(trainop_trainer_allreduce_bus_bandwidth_bytes_per_second{{{WORKER}}})",
                    "{{namespace}}/{{job}} slowest rank",
                ),
                _target(
                    "trainop_profile:allreduce_bus_bandwidth_expected_min_bytes_per_second",
                    "NCCL floor: {{profile}}",
                ),
            ],
            unit="Bps",  # bytes/s, SI prefixes: 3.2e9 shows as 3.2 GB/s
            min_zero=True,
            width=8,
            description="Start-up probe result (nccl-tests busbw; bytes/s, shown as GB/s), by profile and "
            "backend, and each profile's floor (TrainopAllReduceBandwidthLow). The floors are NCCL's: the "
            "alert holds only backend=nccl jobs to them; gloo (CPU) jobs are routinely under them.",
        ),
        row("Evaluation and cost"),
        timeseries(
            "Evaluation",
            [
                _target(
                    f'max by (namespace, job, metric) (trainop_trainer_evaluation{{{WORKER}, rank="0"}})',
                    "{{namespace}}/{{job}} {{metric}}",
                )
            ],
            width=8,
            description="The last evaluation of each job (spec.evaluation): loss, accuracy, top5Accuracy, "
            "perplexity, as on status.evaluation.",
        ),
        timeseries(
            "GPU-hours",
            [
                _target(
                    f"max by (namespace, job) (trainop_trainer_cost_gpu_hours{{{WORKER}}})",
                    "{{namespace}}/{{job}} allocated",
                ),
                _target(
                    f"max by (namespace, job) (trainop_trainer_cost_idle_gpu_hours{{{WORKER}}})",
                    "{{namespace}}/{{job}} idle",
                ),
            ],
            min_zero=True,
            width=8,
            description="GPUs x hours the job's workers existed, every attempt (status.cost.gpuHours), and "
            "the part of it not training: start-up, restarts, stalls (status.cost.idleGpuHours).",
        ),
        timeseries(
            "Estimated cost",
            [
                _target(
                    f"max by (namespace, job, currency) (trainop_trainer_cost_estimated{{{WORKER}}})",
                    "{{namespace}}/{{job}} ({{currency}})",
                )
            ],
            min_zero=True,
            width=8,
            description="GPU-hours x the price per GPU-hour (the chart's cost.pricePerGpuHour or the job's "
            "trainop.dev/price-per-gpu-hour annotation): status.cost.estimatedCost.",
        ),
    ]
    return dashboard(
        uid="trainop-training",
        title="trainop / Training jobs",
        description="Phase, progress, loss, throughput, checkpoints and restarts of trainop TrainingJobs.",
        panels=panels,
        variables=[
            _query_variable("namespace", "Namespace", "label_values(trainop_job_phase, namespace)"),
            _query_variable("job", "Job", 'label_values(trainop_job_phase{namespace=~"$namespace"}, name)'),
        ],
    )


# ----------------------------------------------------------------------------------------------- GPU
def gpu_dashboard() -> dict[str, Any]:
    gpu = 'namespace=~"$namespace", job=~"$job", rank=~"$rank"'
    legend = "{{job}} rank {{rank}} gpu {{gpu}}"
    panels = [
        row("Utilisation"),
        stat(
            "Average utilisation",
            [_target(f"avg(trainop_trainer_gpu_utilization_percent{{{gpu}}})")],
            unit="percent",
            width=6,
            height=6,
            thresholds=[(None, "red"), (30, "orange"), (70, "green")],
            description="Under 30% for 30 minutes fires TrainopGPUUnderutilised.",
        ),
        stat(
            "GPUs reporting",
            [_target(f"count(trainop_trainer_gpu_utilization_percent{{{gpu}}})")],
            width=6,
            height=6,
        ),
        stat(
            "Total power",
            [_target(f"sum(trainop_trainer_gpu_power_watts{{{gpu}}})")],
            unit="watt",
            width=6,
            height=6,
        ),
        stat(
            "Memory in use",
            [_target(f"sum(trainop_trainer_gpu_memory_used_bytes{{{gpu}}})")],
            unit="bytes",
            width=6,
            height=6,
        ),
        timeseries(
            "GPU utilisation",
            [_target(f"trainop_trainer_gpu_utilization_percent{{{gpu}}}", legend)],
            unit="percent",
            min_zero=True,
            width=24,
            description="NVML utilisation: the share of time a kernel was running.",
        ),
        row("Memory, power and temperature"),
        timeseries(
            "GPU memory used",
            [_target(f"trainop_trainer_gpu_memory_used_bytes{{{gpu}}}", legend)],
            unit="bytes",
            min_zero=True,
            width=8,
        ),
        timeseries(
            "GPU power",
            [_target(f"trainop_trainer_gpu_power_watts{{{gpu}}}", legend)],
            unit="watt",
            min_zero=True,
            width=8,
        ),
        timeseries(
            "GPU temperature",
            [_target(f"trainop_trainer_gpu_temperature_celsius{{{gpu}}}", legend)],
            unit="celsius",
            width=8,
        ),
    ]
    return dashboard(
        uid="trainop-gpu",
        title="trainop / GPUs",
        description="Per-GPU utilisation, memory, power and temperature of trainop training workers.",
        panels=panels,
        variables=[
            _query_variable(
                "namespace", "Namespace", "label_values(trainop_trainer_gpu_utilization_percent, namespace)"
            ),
            _query_variable(
                "job",
                "Job",
                'label_values(trainop_trainer_gpu_utilization_percent{namespace=~"$namespace"}, job)',
            ),
            _query_variable(
                "rank",
                "Rank",
                "label_values(trainop_trainer_gpu_utilization_percent"
                '{namespace=~"$namespace", job=~"$job"}, rank)',
            ),
        ],
    )


# ------------------------------------------------------------------------------------------ operator
def operator_dashboard() -> dict[str, Any]:
    kind = 'kind=~"$kind"'
    panels = [
        row("Health"),
        stat(
            "Operator",
            [_target('max(up{job="trainop-operator"}) or vector(0)')],
            width=6,
            thresholds=[(None, "red"), (1, "green")],
            mappings=[{"type": "value", "options": {"0": {"text": "down"}, "1": {"text": "up"}}}],
        ),
        stat(
            "Reconciles per second",
            [_target(f"sum(rate(trainop_operator_reconcile_total{{{kind}}}[5m]))")],
            unit="reqps",
            width=6,
        ),
        stat(
            "Reconcile error ratio",
            [
                _target(
                    f'sum(rate(trainop_operator_reconcile_total{{{kind}, result="error"}}[10m])) '
                    f"/ sum(rate(trainop_operator_reconcile_total{{{kind}}}[10m]))"
                )
            ],
            unit="percentunit",
            width=6,
            thresholds=[(None, "green"), (0.01, "orange"), (0.1, "red")],
            description="Over 10% for 15 minutes fires TrainopReconcileErrors.",
        ),
        stat(
            "Restarts in the last hour",
            [_target(f"sum(increase(trainop_operator_restarts_total{{{kind}}}[1h]))")],
            width=6,
            thresholds=[(None, "green"), (1, "orange"), (5, "red")],
        ),
        row("Reconciles"),
        timeseries(
            "Reconcile rate by result",
            [
                _target(
                    f"sum by (kind, result) (rate(trainop_operator_reconcile_total{{{kind}}}"
                    "[$__rate_interval]))",
                    "{{kind}} {{result}}",
                )
            ],
            unit="reqps",
            min_zero=True,
        ),
        timeseries(
            "Reconcile errors",
            [
                _target(
                    f'sum by (kind) (rate(trainop_operator_reconcile_total{{{kind}, result="error"}}'
                    "[$__rate_interval]))",
                    "{{kind}}",
                )
            ],
            unit="reqps",
            min_zero=True,
        ),
        timeseries(
            "Reconcile latency",
            [
                _target(
                    f"histogram_quantile({q}, sum by (le, kind) "
                    f"(rate(trainop_operator_reconcile_duration_seconds_bucket{{{kind}}}[$__rate_interval])))",
                    f"{{{{kind}}}} p{int(q * 100)}",
                )
                for q in (0.5, 0.95, 0.99)
            ],
            unit="s",
            min_zero=True,
            width=24,
        ),
        row("Jobs"),
        timeseries(
            "Jobs by phase",
            [_target(f"sum by (kind, phase) (trainop_operator_jobs{{{kind}}})", "{{kind}} {{phase}}")],
            min_zero=True,
        ),
        timeseries(
            "Job restarts started",
            [_target(f"sum by (kind) (increase(trainop_operator_restarts_total{{{kind}}}[1h]))", "{{kind}}")],
            min_zero=True,
            description="New attempts per hour, cluster-wide.",
        ),
        timeseries(
            "Time to Running",
            [
                _target(
                    f"histogram_quantile({q}, sum by (le, kind) "
                    f"(rate(trainop_operator_time_to_running_seconds_bucket{{{kind}}}[1h])))",
                    f"{{{{kind}}}} p{int(q * 100)}",
                )
                for q in (0.5, 0.95)
            ],
            unit="s",
            min_zero=True,
            width=24,
            description="From creation to phase Running: scheduling, image pulls and Ray start-up.",
        ),
    ]
    return dashboard(
        uid="trainop-operator",
        title="trainop / Operator",
        description="Reconcile rate, errors and latency of the trainop operator, and the jobs it manages.",
        panels=panels,
        variables=[_query_variable("kind", "Kind", "label_values(trainop_operator_reconcile_total, kind)")],
    )


DASHBOARDS = {
    "trainop-training.json": training_dashboard,
    "trainop-gpu.json": gpu_dashboard,
    "trainop-operator.json": operator_dashboard,
}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str]) -> int:
    out = pathlib.Path(argv[1]) if len(argv) > 1 else HERE
    for file_name, build in DASHBOARDS.items():
        (out / file_name).write_text(render(build))
        print(f"wrote {out / file_name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
