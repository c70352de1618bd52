"""Rank 0's status records on a real kube-apiserver: merge patches of status.progress/checkpoint/network.

The trainer authenticates as the job's service account with a Role that allows nothing but patching this
one TrainingJob's status (what the operator grants), through TRAINOP_KUBE_HOST / TRAINOP_KUBE_TOKEN_FILE /
TRAINOP_KUBE_CA_FILE. Needs the control-plane tier (tests/controlplane).
"""

from __future__ import annotations

import logging
import pathlib
import time
from typing import Any

import kubernetes
import pytest

from trainop.api import trainer_config
from trainop_trainer import checkpoint_store, run_record, status

GROUP, VERSION, PLURAL = "trainop.dev", "v1alpha1", "trainingjobs"


def _job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {"workload": {"model": "mlp"}, "hyperparameters": {"maxSteps": 100}},
    }


def _trainer_credentials(
    control_plane: Any, namespace: str, job: str, tmp_path: pathlib.Path, verbs: tuple[str, ...] = ("patch",)
) -> dict[str, str]:
    rbac = kubernetes.client.RbacAuthorizationV1Api(control_plane.api_client())
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "trainer"},
            "rules": [
                {
                    "apiGroups": [GROUP],
                    "resources": ["trainingjobs/status"],
                    "resourceNames": [job],
                    "verbs": list(verbs),
                }
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "trainer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "trainer"},
            "subjects": [{"kind": "ServiceAccount", "name": "trainer", "namespace": namespace}],
        },
    )
    token_file = tmp_path / "token"
    token_file.write_text(control_plane.service_account_token(namespace, "trainer"))
    return {
        "TRAINOP_KUBE_HOST": control_plane.server_url,
        "TRAINOP_KUBE_TOKEN_FILE": str(token_file),
        "TRAINOP_KUBE_CA_FILE": str(control_plane.pki.ca_cert_path),
    }


def _status(control_plane: Any, namespace: str, name: str) -> dict[str, Any]:
    api = kubernetes.client.CustomObjectsApi(control_plane.api_client())
    obj: dict[str, Any] = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    result: dict[str, Any] = obj.get("status", {})
    return result


def _wait_for(predicate: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


@pytest.mark.controlplane
def test_rank0_patches_progress_checkpoint_and_network_and_leaves_operator_fields_alone(
    control_plane: Any, namespace: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = kubernetes.client.CustomObjectsApi(control_plane.api_client())
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _job("bert"))
    api.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        "bert",
        {"status": {"phase": "Running", "attempt": 2}},
        _content_type="application/merge-patch+json",
    )
    for key, value in _trainer_credentials(control_plane, namespace, "bert", tmp_path).items():
        monkeypatch.setenv(key, value)
    saved = checkpoint_store.Checkpoint(
        path=tmp_path / "ckpt" / "step_40",
        manifest=checkpoint_store.Manifest(
            step=40, epoch=1, time=run_record.utc_now(), world_size=2, metrics={"loss": 0.25}
        ),
    )
    reporter = status.StatusReporter(
        [status.KubernetesSink(trainer_config.StatusTarget(namespace=namespace, name="bert"))]
    )

    reporter.network(
        profile="tcp", backend="gloo", bus_bandwidth_gb_per_second=1.23456, probe_bytes=1 << 20, world_size=2
    )
    reporter.checkpoint(saved)
    reporter.progress(
        step=50,
        total_steps=100,
        epoch=1,
        loss=0.2,
        samples_per_second=512.0,
        eta_seconds=30.0,
        worker_restarts=1,
    )
    reporter.close(timeout_s=30)

    got = _status(control_plane, namespace, "bert")
    assert (got["phase"], got["attempt"]) == ("Running", 2)  # operator-owned, untouched
    progress = got["progress"]
    assert {
        k: progress[k] for k in ("step", "totalSteps", "epoch", "loss", "samplesPerSecond", "percent")
    } == {
        "step": 50,
        "totalSteps": 100,
        "epoch": 1,
        "loss": 0.2,
        "samplesPerSecond": 512.0,
        "percent": 50.0,
    }
    assert (progress["etaSeconds"], progress["workerRestarts"]) == (30.0, 1) and progress["updated"].endswith(
        "Z"
    )
    assert got["checkpoint"] == {
        "step": 40,
        "epoch": 1,
        "path": str(saved.path),
        "time": saved.manifest.time,
        "metrics": {"loss": 0.25},
    }
    network = got["network"]
    assert (network["profile"], network["backend"], network["worldSize"], network["probeBytes"]) == (
        "tcp",
        "gloo",
        2,
        1 << 20,
    )
    assert network["allReduceBusBandwidthGBPerSecond"] == pytest.approx(1.235)  # GB/s, rounded, not scaled


@pytest.mark.controlplane
def test_a_failing_patch_never_raises_and_is_retried_until_the_object_accepts_it(
    control_plane: Any,
    namespace: str,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for key, value in _trainer_credentials(control_plane, namespace, "late", tmp_path).items():
        monkeypatch.setenv(key, value)
    sink = status.KubernetesSink(trainer_config.StatusTarget(namespace=namespace, name="late"))
    reporter = status.StatusReporter([sink])

    with caplog.at_level(logging.WARNING, logger="trainop_trainer.status"):
        reporter.progress(  # the TrainingJob does not exist yet: the apiserver answers 404
            step=5,
            total_steps=10,
            epoch=0,
            loss=1.0,
            samples_per_second=None,
            eta_seconds=None,
            worker_restarts=0,
        )
        _wait_for(lambda: any("status patch" in r.getMessage() for r in caplog.records), timeout_s=30)
        reporter.progress(  # newer records keep merging while the patch is failing
            step=7,
            total_steps=10,
            epoch=0,
            loss=0.9,
            samples_per_second=None,
            eta_seconds=None,
            worker_restarts=0,
        )
    kubernetes.client.CustomObjectsApi(control_plane.api_client()).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, _job("late")
    )

    _wait_for(
        lambda: _status(control_plane, namespace, "late").get("progress", {}).get("step") == 7, timeout_s=30
    )
    reporter.close(timeout_s=10)
    assert sink.patches_sent >= 1


@pytest.mark.controlplane
def test_the_driver_reads_the_cumulative_worker_failures_and_adds_its_own(
    control_plane: Any, namespace: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempt 3's driver, with the Role the operator grants (get and patch on this job's status), reads
    status.workerFailures of the earlier attempts; its record adds to the counts and keeps the older entries
    after the new one. (The operator's restartsByReason is not in this branch's CRD yet, so the apiserver
    would prune it: test_trainer_failures covers used(X) = restartsByReason + counts on status.json.)"""
    from trainop_trainer import failures, ray_train

    api = kubernetes.client.CustomObjectsApi(control_plane.api_client())
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _job("gpt"))
    earlier = {
        "attempt": 1,
        "reason": "Stalled",
        "message": "rank 1 made no progress",
        "rank": 1,
        "step": 40,
        "time": "2026-11-26T18:00:00Z",
        "restarted": True,
    }
    api.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        "gpt",
        {"status": {"workerFailures": {"counts": {"Stalled": 1}, "last": [earlier]}}},
        _content_type="application/merge-patch+json",
    )
    credentials = _trainer_credentials(control_plane, namespace, "gpt", tmp_path, verbs=("get", "patch"))
    for key, value in credentials.items():
        monkeypatch.setenv(key, value)
    config = trainer_config.TrainerConfig.model_validate(
        {
            "jobName": "gpt",
            "runName": "gpt",
            "storagePath": str(tmp_path),
            "attempt": 3,
            "statusTarget": {"namespace": namespace, "name": "gpt"},
            "spec": _job("gpt")["spec"],
        },
        by_alias=True,
    )

    book = ray_train.FailureBook(config, status_file=tmp_path / "gpt" / "status.json")
    assert book.used(failures.STALLED) == 1 and book.used(failures.USER_CODE_ERROR) == 0
    book.record(
        failures.Failure(failures.STALLED, "rank 0 made no progress", rank=0, step=90), restarted=True
    )

    got = _status(control_plane, namespace, "gpt")["workerFailures"]
    assert got["counts"] == {"Stalled": 2}
    assert [(e["attempt"], e["rank"], e["restarted"]) for e in got["last"]] == [(3, 0, True), (1, 1, True)]
    assert got["last"][1] == earlier
