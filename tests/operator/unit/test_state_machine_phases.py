"""The state machine (``state_machine.next_status``): first sight, KubeRay status to phase, success, and
what a status write may contain."""

from __future__ import annotations

from typing import Any

import operator_factories as factories
import pytest
from state_machine_cases import NOW, RFC, accepted, after, condition, decide, ray_job, seconds, with_status

from trainop.api import operator_status
from trainop.api.trainingjob import Phase, TrainingJobOperatorStatus
from trainop.controller import conditions


# ------------------------------------------------------------------------------------------- first sight
def test_a_new_job_starts_attempt_one_in_pending_and_asks_for_its_rayjob() -> None:
    transition = decide(factories.job())

    assert transition.status.phase == Phase.PENDING
    assert transition.status.attempt == 1
    assert transition.status.restarts == 0
    assert transition.status.start_time == RFC(NOW)
    assert transition.ray_job == "mlp-a1"
    assert transition.create_ray_job is True
    assert transition.apply_children is True
    assert transition.status.children is not None
    assert transition.status.children.model_dump() == {
        "ray_job": "mlp-a1",
        "config_map": "mlp-trainer",
        "persistent_volume_claim": "mlp-ckpt",
        "service_account": "mlp-trainer",
    }
    assert (transition.status.workers, transition.status.gpus) == (2, 0)
    assert transition.events == ()  # Pending is progress, shown by the status: no Event for it


def test_gpus_in_status_is_replicas_times_gpus_per_worker_for_the_printer_column() -> None:
    body = factories.job(spec={"workers": {"replicas": 4, "gpusPerWorker": 8}, "precision": "bf16"})
    assert (decide(body).status.workers, decide(body).status.gpus) == (4, 32)


def test_observed_generation_is_the_generation_just_reconciled() -> None:
    body = with_status(phase=Phase.RUNNING, attempt=1, observed_generation=3)
    body["metadata"]["generation"] = 4
    assert decide(body, ray_job("mlp-a1", "RUNNING", "Running")).status.observed_generation == 4


# ----------------------------------------------------------------------------------- RayJob -> phase
@pytest.mark.parametrize(
    ("job_status", "deployment", "phase"),
    [
        ("", "", Phase.PENDING),  # created, KubeRay has not seen it
        ("", "Initializing", Phase.PROVISIONING),
        ("", "Waiting", Phase.PROVISIONING),
        ("PENDING", "Running", Phase.PROVISIONING),
        ("PENDING", "Initializing", Phase.PROVISIONING),
        ("RUNNING", "Running", Phase.RUNNING),
        ("SUCCEEDED", "Complete", Phase.SUCCEEDED),
        ("SUCCEEDED", "Running", Phase.SUCCEEDED),  # K8sJobMode: submitter not finished yet
        ("FAILED", "Failed", Phase.RESTARTING),
        ("FAILED", "Running", Phase.RESTARTING),
        ("", "Failed", Phase.RESTARTING),  # submission failed, Ray job never started
        ("STOPPED", "Complete", Phase.FAILED),
        ("", "ValidationFailed", Phase.FAILED),
    ],
)
def test_kuberay_job_and_deployment_status_map_to_one_phase(
    job_status: str, deployment: str, phase: Phase
) -> None:
    body = with_status(phase=Phase.PENDING, attempt=1, start_time=RFC(NOW))
    assert decide(body, ray_job("mlp-a1", job_status, deployment)).status.phase == phase


def test_a_rayjob_of_another_attempt_is_not_taken_for_the_current_one() -> None:
    body = with_status(phase=Phase.PENDING, attempt=2, restarts=1, start_time=RFC(NOW))
    transition = decide(body, ray_job("mlp-a1", "RUNNING", "Running"))
    assert transition.status.phase == Phase.PENDING
    assert transition.ray_job == "mlp-a2"


def test_a_vanished_rayjob_of_a_running_attempt_is_recreated_under_the_same_name() -> None:
    transition = decide(with_status(phase=Phase.RUNNING, attempt=1, start_time=RFC(NOW)))
    assert (transition.status.phase, transition.ray_job, transition.create_ray_job) == (
        Phase.PENDING,
        "mlp-a1",
        True,
    )
    assert transition.status.restarts == 0


def test_time_to_running_is_measured_from_the_rayjob_creation_once() -> None:
    body = with_status(phase=Phase.PROVISIONING, attempt=1, start_time=RFC(NOW))
    first = decide(body, ray_job("mlp-a1", "RUNNING", "Running", created=NOW - seconds(42)))
    again = decide(after(body, first), ray_job("mlp-a1", "RUNNING", "Running", created=NOW - seconds(42)))
    assert first.time_to_running == 42.0
    assert again.time_to_running is None


def test_success_finishes_the_job_and_keeps_the_finished_rayjob_as_the_record() -> None:
    body = with_status(phase=Phase.RUNNING, attempt=1, start_time=RFC(NOW - seconds(600)))
    transition = decide(body, ray_job("mlp-a1", "SUCCEEDED", "Complete"))
    assert transition.status.phase == Phase.SUCCEEDED
    assert transition.status.completion_time == RFC(NOW)
    assert (transition.ray_job, transition.create_ray_job, transition.apply_children) == (
        "mlp-a1",
        False,
        False,
    )
    assert condition(transition, conditions.COMPLETE)[:2] == ("True", "Succeeded")
    assert condition(transition, conditions.FAILED)[0] == "False"


# ------------------------------------------------------------------------------------ status writes
def test_only_operator_owned_fields_are_read_and_written() -> None:
    raw = {
        "phase": "Running",
        "attempt": 1,
        "progress": {"step": 10},
        "checkpoint": {"step": 10, "path": "/c", "time": RFC(NOW)},
        "network": {"profile": "tcp"},
    }
    owned = TrainingJobOperatorStatus.from_stored(raw)
    body = {**accepted(factories.job()), "status": raw}
    transition = decide(body, ray_job("mlp-a1", "RUNNING", "Running"))
    patch = transition.status.merge_patch_from(raw)
    assert not {"progress", "checkpoint", "network"} & set(owned.to_wire())
    assert not {"progress", "checkpoint", "network"} & set(patch)


def test_a_sweep_status_carries_no_workers_or_gpus() -> None:
    body = factories.sweep()
    transition = decide(body)
    wire = transition.status.to_wire()
    assert "workers" not in wire and "gpus" not in wire
    assert transition.ray_job == "lr-s1"


@pytest.mark.parametrize(
    ("old", "new", "patch"),
    [
        ({"a": 1}, {"a": 1}, {}),
        ({"a": 1}, {"a": 2}, {"a": 2}),
        ({"a": 1, "b": 2}, {"a": 1}, {"b": None}),
        ({"c": {"x": 1, "y": 2}}, {"c": {"x": 1}}, {"c": {"y": None}}),
        ({"c": {"x": 1}}, {"c": {"x": 3, "z": 4}}, {"c": {"x": 3, "z": 4}}),
        ({"l": [1, 2]}, {"l": [1]}, {"l": [1]}),
        ({}, {"n": {"k": "v"}}, {"n": {"k": "v"}}),
    ],
)
def test_merge_patch_turns_the_old_status_into_the_new_one(
    old: dict[str, Any], new: dict[str, Any], patch: dict[str, Any]
) -> None:
    assert operator_status.merge_patch(old, new) == patch
