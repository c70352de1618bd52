"""The operator process's own endpoints: kopf's liveness probe and the Prometheus metrics, with per-job
series that appear with a job and disappear when it is deleted. KubeRay's part is played by its stand-in
(``kuberay_standin``, the tier's only mock): it writes the RayJob statuses KubeRay would (Running, Failed)."""

from __future__ import annotations

from typing import Any

import operator_factories as factories
import pytest
from cluster_api import Api, wait_for
from operator_process import OperatorProcess
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.controlplane

# Sample names as scraped (counters end in _total, histograms have _count/_sum/_bucket).
OPERATOR_SAMPLES = {
    "trainop_operator_reconcile_total",
    "trainop_operator_reconcile_duration_seconds_count",
    "trainop_operator_jobs",
    "trainop_operator_restarts_total",
    "trainop_operator_time_to_running_seconds_count",
}


def samples(operator: OperatorProcess) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(operator.metrics()):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def labelled(metric: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return metric, frozenset(labels.items())


def test_the_liveness_endpoint_answers_while_the_operator_runs(operator: OperatorProcess) -> None:
    status, body = operator.get("/healthz", operator.liveness_port)
    assert status == 200 and "reconcile-workers" in body


def test_metrics_are_served_and_job_series_follow_the_jobs_life(
    operator: OperatorProcess, api: Api, apply: Any, kuberay: Any, namespace: str
) -> None:
    apply(factories.manifest("mlp", namespace))
    wait_for(lambda: api.get(api.ray_jobs(namespace, "mlp-a1")), lambda r: r is not None, what="RayJob")
    kuberay.run(namespace, "mlp-a1")
    api.patch(api.job(namespace, "mlp") + "/status", {"status": {"progress": {"step": 77, "loss": 1.5}}})

    running = labelled(
        "trainop_job_phase", namespace=namespace, name="mlp", kind="TrainingJob", phase="Running"
    )
    step = labelled("trainop_job_step", namespace=namespace, name="mlp")
    timed = labelled("trainop_operator_time_to_running_seconds_count", kind="TrainingJob")
    seen = wait_for(
        lambda: samples(operator),
        lambda s: s.get(running) == 1 and s.get(step) == 77 and timed in s,
        what="job series",
    )
    assert seen[labelled("trainop_job_loss", namespace=namespace, name="mlp")] == 1.5
    assert {name for name, _ in seen} >= OPERATOR_SAMPLES
    assert seen[labelled("trainop_operator_reconcile_total", kind="TrainingJob", result="success")] >= 1

    kuberay.fail(namespace, "mlp-a1")
    wait_for(
        lambda: samples(operator),
        lambda s: s.get(labelled("trainop_job_restarts", namespace=namespace, name="mlp")) == 1,
        what="restart counted",
    )

    api.delete(api.job(namespace, "mlp"))
    gone = wait_for(
        lambda: samples(operator),
        lambda s: (
            not any(
                k[0].startswith("trainop_job_")
                and ("name", "mlp") in k[1]
                and ("namespace", namespace) in k[1]
                for k in s
            )
        ),
        what="job series removed",
    )
    assert gone[labelled("trainop_operator_restarts_total", kind="TrainingJob")] >= 1


def test_a_namespaced_operator_ignores_other_namespaces(
    dedicated_operator: OperatorProcess, api: Api, apply: Any, namespace: str, control_plane: Any
) -> None:
    other = control_plane.create_namespace(prefix="trainop-other-")
    try:
        dedicated_operator.start(namespaces=[namespace])
        apply(factories.manifest("mine", namespace))
        apply(factories.manifest("theirs", other))
        wait_for(lambda: api.get(api.ray_jobs(namespace, "mine-a1")), lambda r: r is not None, what="mine")
        theirs = api.get(api.job(other, "theirs"))
        assert theirs is not None and "status" not in theirs
        assert api.list(api.ray_jobs(other)) == []
    finally:
        dedicated_operator.stop()
        control_plane.delete_namespace(other)
