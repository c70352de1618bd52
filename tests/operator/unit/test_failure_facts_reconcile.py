"""The reconciler keeps what the Ray pods of the running attempt showed, so a failure is classified from
them even when the pods are gone by the time the RayJob reports FAILED; and the goodput it writes.

Runs ``reconcile.Reconciler`` unchanged against ``fake_apiserver.FakeKube`` -- a MOCK of the apiserver
(in-memory store behind the client's one HTTP method; see its docstring) -- and ``fake_apiserver.Watches``,
which plays kopf's watches into the real ``cache`` indexes: pods here are what KubeRay would create and
the kubelet / eviction API would mark.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from fake_apiserver import FakeKube
from test_reconcile_requests import Operator, kuberay, new_job

from trainop.controller import kinds


@pytest.fixture
def fake() -> FakeKube:
    return FakeKube()


@pytest.fixture
def operator(fake: FakeKube) -> Operator:
    return Operator(fake)


def worker_pod(**metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "mlp-a1-raycluster-worker-0",
            "namespace": "team-a",
            "labels": {
                kinds.LABEL_MANAGED_BY: "trainop",
                "trainop.dev/job": "mlp",
                kinds.LABEL_ATTEMPT: "1",
            },
            **metadata,
        },
        "spec": {"nodeName": "node-1", "containers": [{"name": "ray-worker"}]},
        "status": {"phase": "Running"},
    }


def status(fake: FakeKube) -> dict[str, Any]:
    owner = fake.get_object("TrainingJob", "mlp")
    assert owner is not None
    return dict(owner.get("status") or {})


def remove(fake: FakeKube, kind: str, name: str) -> None:
    fake.objects = {
        path: obj
        for path, obj in fake.objects.items()
        if not (obj["kind"] == kind and obj["metadata"]["name"] == name)
    }


async def evicted_pod_then_failure(fake: FakeKube, operator: Operator, *, restart_between: bool) -> None:
    new_job(fake)
    await operator.reconcile()
    kuberay(fake, "mlp-a1", "RUNNING", "Running")
    await operator.reconcile()
    assert status(fake)["phase"] == "Running"
    fake.put(worker_pod(deletionTimestamp="2026-03-01T12:00:30Z", deletionGracePeriodSeconds=30))
    await operator.reconcile()  # the pod's watch event: its fact is kept
    remove(fake, "Pod", "mlp-a1-raycluster-worker-0")  # gone before KubeRay reports the failure
    if restart_between:
        operator.restart()
    kuberay(fake, "mlp-a1", "FAILED", "Failed")
    await operator.reconcile()


async def test_a_pod_deleted_with_a_grace_period_and_gone_before_the_failure_still_makes_it_preempted(
    fake: FakeKube, operator: Operator
) -> None:
    await evicted_pod_then_failure(fake, operator, restart_between=False)
    failure = status(fake)["failures"][-1]
    assert failure["reason"] == "Preempted"
    assert "was deleted with a grace period of 30 s" in failure["message"]
    assert status(fake)["nextRestartTime"] == "2026-03-01T12:00:00Z"  # no backoff for a preemption


async def test_an_operator_restart_loses_the_facts_of_pods_already_gone_and_says_unknown(
    fake: FakeKube, operator: Operator
) -> None:
    # The documented limit (docs/operator.md, "Failures"): facts live in the reconciler's memory.
    await evicted_pod_then_failure(fake, operator, restart_between=True)
    assert status(fake)["failures"][-1]["reason"] == "Unknown"


async def test_goodput_is_written_from_the_trainers_progress(fake: FakeKube, operator: Operator) -> None:
    new_job(fake)
    await operator.reconcile()
    kuberay(fake, "mlp-a1", "RUNNING", "Running")
    await operator.reconcile()
    owner = fake.get_object("TrainingJob", "mlp")
    assert owner is not None
    # 40 steps of 2 workers x 8 samples at 16 samples/s: 1 s a step, 40 s of training in 100 s.
    started = datetime.datetime.fromisoformat(owner["status"]["startTime"].replace("Z", "+00:00"))
    owner["status"]["progress"] = {
        "step": 40,
        "samplesPerSecond": 16.0,
        "batchSizePerWorker": 8,
        "updated": "2026-03-01T12:01:39Z",
    }
    fake.put(owner)
    operator.now = started + datetime.timedelta(seconds=100)
    await operator.reconcile()
    assert status(fake)["goodput"] == {"ratio": 0.4, "productiveSeconds": 40.0, "wallSeconds": 100.0}
