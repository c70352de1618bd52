"""spec.suspend, activeDeadlineSeconds and ttlSecondsAfterFinished against the real apiserver.
KubeRay's part is played by its stand-in (``kuberay_standin``, the tier's only mock): it writes the RayJob
statuses KubeRay would (Running, Succeeded)."""

from __future__ import annotations

import datetime
import time
from typing import Any

import operator_factories as factories
import pytest
from cluster_api import Api, wait_for

from trainop.controller import observe

pytestmark = pytest.mark.controlplane


def status_of(api: Api, namespace: str) -> dict[str, Any]:
    body = api.get(api.job(namespace, "mlp"))
    assert body is not None
    return body.get("status") or {}


# How late a due time (deadline, TTL) may fire: the operator's work-queue timer plus one reconcile, on a
# loaded 2-core machine. Generous on purpose: it bounds a timer that fires much too late or never; the
# lower bounds (never early) are exact.
TIMER_SLACK_S = 20


def wait_phase(api: Api, namespace: str, phase: str, timeout_s: float = 20) -> dict[str, Any]:
    return wait_for(
        lambda: status_of(api, namespace),
        lambda s: s.get("phase") == phase,
        timeout_s=timeout_s,
        what=f"phase {phase}",
    )


def ray_jobs(api: Api, namespace: str) -> list[str]:
    items = api.list(api.ray_jobs(namespace), "trainop.dev/job=mlp")
    return sorted(r["metadata"]["name"] for r in items if not r["metadata"].get("deletionTimestamp"))


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return {c["type"]: c for c in status["conditions"]}[type_]


def test_suspend_stops_the_rayjob_keeps_claim_and_progress_and_resume_starts_a_new_attempt(
    operator: Any, api: Api, apply: Any, kuberay: Any, namespace: str
) -> None:
    apply(factories.manifest("mlp", namespace))
    wait_for(lambda: ray_jobs(api, namespace), lambda names: names == ["mlp-a1"], what="RayJob a1")
    kuberay.run(namespace, "mlp-a1")
    wait_phase(api, namespace, "Running")
    api.patch(api.job(namespace, "mlp") + "/status", {"status": {"progress": {"step": 40}}})  # as the trainer

    apply(factories.manifest("mlp", namespace, spec={"suspend": True}))
    suspended = wait_phase(api, namespace, "Suspended")
    wait_for(lambda: ray_jobs(api, namespace), lambda names: names == [], what="RayJob deleted")
    assert api.get(api.core(namespace, "persistentvolumeclaims", "mlp-ckpt")) is not None
    assert api.get(api.core(namespace, "configmaps", "mlp-trainer")) is not None
    assert suspended["progress"] == {"step": 40}
    assert (suspended["attempt"], suspended["restarts"]) == (1, 0)
    assert condition(suspended, "Suspended")["status"] == "True"

    apply(factories.manifest("mlp", namespace, spec={"suspend": False}))
    wait_for(lambda: ray_jobs(api, namespace), lambda names: names == ["mlp-a2"], what="RayJob a2")
    resumed = wait_phase(api, namespace, "Pending")
    assert (resumed["attempt"], resumed["restarts"]) == (2, 0)  # suspend is not a restart
    kuberay.run(namespace, "mlp-a2")
    kuberay.succeed(namespace, "mlp-a2")
    assert wait_phase(api, namespace, "Succeeded")["restarts"] == 0


def test_resume_waits_for_the_previous_attempts_pods_which_may_still_be_writing_their_checkpoint(
    operator: Any, api: Api, apply: Any, kuberay: Any, namespace: str
) -> None:
    """A Ray worker pod of attempt 1 still Terminating (its preStop hook checkpointing; here held by a
    finalizer, as no kubelet runs) holds attempt 2's RayJob back; once it is gone attempt 2 starts. The pod
    is made by the test: the stand-in KubeRay makes none."""
    apply(factories.manifest("mlp", namespace))
    wait_for(lambda: ray_jobs(api, namespace), lambda names: names == ["mlp-a1"], what="RayJob a1")
    kuberay.run(namespace, "mlp-a1")
    wait_phase(api, namespace, "Running")
    pod = api.create(api.core(namespace, "pods"), factories.held_ray_pod("mlp-a1-workers-worker-x", "mlp", 1))
    pod_path = api.core(namespace, "pods", pod["metadata"]["name"])

    apply(factories.manifest("mlp", namespace, spec={"suspend": True}))
    wait_phase(api, namespace, "Suspended")
    api.delete(pod_path)  # Terminating: the grace period runs, the finalizer holds it
    apply(factories.manifest("mlp", namespace, spec={"suspend": False}))
    waiting = wait_for(
        lambda: status_of(api, namespace),
        lambda s: s.get("attempt") == 2 and condition(s, "Running")["reason"] == "WaitingForPreviousAttempt",
        what="attempt 2 waiting for attempt 1's pod",
    )
    assert "mlp-a1-workers-worker-x" in condition(waiting, "Running")["message"]
    time.sleep(2)  # a watch event's worth: the RayJob would have been created by now
    assert ray_jobs(api, namespace) == []

    # The pod goes: its kubelet would confirm it stopped (a deletion with no grace left); here the test.
    api.patch(pod_path, {"metadata": {"finalizers": None}})
    api.request("DELETE", pod_path, {"gracePeriodSeconds": 0})
    wait_for(lambda: ray_jobs(api, namespace), lambda names: names == ["mlp-a2"], what="RayJob a2")


def test_a_job_created_suspended_creates_its_claim_and_rbac_but_no_rayjob(
    operator: Any, api: Api, apply: Any, namespace: str
) -> None:
    apply(factories.manifest("mlp", namespace, spec={"suspend": True}))
    status = wait_phase(api, namespace, "Suspended")
    assert status["attempt"] == 0
    wait_for(
        lambda: api.get(api.rbac(namespace, "rolebindings", "mlp-trainer")),
        lambda rb: rb is not None,
        what="RoleBinding",
    )
    assert ray_jobs(api, namespace) == []


def test_the_active_deadline_fails_a_running_job_with_deadline_exceeded_and_stops_its_rayjob(
    operator: Any, api: Api, apply: Any, kuberay: Any, namespace: str
) -> None:
    apply(factories.manifest("mlp", namespace, spec={"activeDeadlineSeconds": 3}))
    wait_for(lambda: ray_jobs(api, namespace), lambda names: names == ["mlp-a1"], what="RayJob a1")
    kuberay.run(namespace, "mlp-a1")
    running = wait_phase(api, namespace, "Running")

    failed = wait_phase(api, namespace, "Failed", timeout_s=3 + TIMER_SLACK_S)
    assert condition(failed, "Failed")["reason"] == "DeadlineExceeded"
    started, ended = observe.parse_time(running["startTime"]), observe.parse_time(failed["completionTime"])
    assert started is not None and ended is not None
    # Both times are whole seconds (truncated): the true span is within 1 s of theirs.
    assert 3 - 1 <= (ended - started).total_seconds() <= 3 + 1 + TIMER_SLACK_S
    wait_for(lambda: ray_jobs(api, namespace), lambda names: names == [], what="running RayJob deleted")
    events = api.list(f"/api/v1/namespaces/{namespace}/events")
    assert [e["type"] for e in events if e["reason"] == "Failed"] == ["Warning"]


def test_a_finished_job_is_deleted_ttl_seconds_after_it_finished(
    operator: Any, api: Api, apply: Any, kuberay: Any, namespace: str
) -> None:
    ttl = 3
    apply(factories.manifest("mlp", namespace, spec={"ttlSecondsAfterFinished": ttl}))
    wait_for(lambda: ray_jobs(api, namespace), lambda names: names == ["mlp-a1"], what="RayJob a1")
    kuberay.run(namespace, "mlp-a1")
    kuberay.succeed(namespace, "mlp-a1")
    finished = wait_phase(api, namespace, "Succeeded")
    completed = observe.parse_time(finished["completionTime"])
    assert completed is not None  # whole seconds, truncated: the true completion is in [completed, +1 s)

    # Watch for the deletion, noting when the job was last seen and first seen gone (wall clock, as
    # completionTime). A late observation only loosens the lower bound, never breaks a correct operator.
    last_seen = gone = datetime.datetime.now(datetime.UTC)
    deadline = time.monotonic() + ttl + TIMER_SLACK_S + 5
    while api.get(api.job(namespace, "mlp")) is not None:
        last_seen = datetime.datetime.now(datetime.UTC)
        assert time.monotonic() < deadline, "the job was not deleted after its TTL"
        time.sleep(0.05)
    gone = datetime.datetime.now(datetime.UTC)
    assert (gone - completed).total_seconds() >= ttl, "deleted before ttlSecondsAfterFinished had passed"
    assert (last_seen - completed).total_seconds() <= ttl + 1 + TIMER_SLACK_S, "deleted long after its TTL"
    # The claim outlives the job (checkpoints are kept); owned children are garbage-collected.
    assert api.get(api.core(namespace, "persistentvolumeclaims", "mlp-ckpt")) is not None
    wait_for(
        lambda: api.get(api.core(namespace, "configmaps", "mlp-trainer")),
        lambda c: c is None,
        what="ConfigMap collected",
    )
