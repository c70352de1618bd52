"""Profiling on demand on a real kube-apiserver: annotate a running CPU job, get loadable traces (and the
running job's cost record).

The trainer runs as two real ranks (torchrun, gloo) and authenticates as the job's service account with
the Role the operator's own builder makes (``children.desired_rbac``): get and patch of this job's status,
create of Events. A user's ``kubectl annotate trainingjob prof trainop.dev/profile=5`` is a merge patch of
the annotations here; the test then reads ``status.profile``, loads every rank's Chrome trace with
``json`` and checks the profiler recorded training steps and gloo collectives, and finds the Event; a
``trainop.dev/communication-report`` annotation gives ``status.communication`` and its JSON file.
Needs the control-plane tier (tests/controlplane).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import time
from collections.abc import Callable
from typing import Any

import kubernetes
import pytest
import trainer_support

from trainop.api import trainer_config
from trainop.controller import children, kinds

pytestmark = pytest.mark.controlplane

GROUP, VERSION, PLURAL = "trainop.dev", "v1alpha1", "trainingjobs"


def _wait_for(what: str, predicate: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s:.0f}s")


def _apply_trainer_rbac(control_plane: Any, namespace: str, body: dict[str, Any]) -> None:
    job = kinds.parse(body)
    for manifest in children.desired_rbac(job):
        del manifest["metadata"]["ownerReferences"]
        path = {
            "ServiceAccount": f"/api/v1/namespaces/{namespace}/serviceaccounts",
            "Role": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
            "RoleBinding": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        }[manifest["kind"]]
        code, reply = control_plane.request("POST", path, body=json.dumps(manifest).encode())
        assert code == 201, reply


def test_a_profile_annotation_on_a_running_job_yields_a_loadable_trace_per_rank_a_status_and_an_event(
    control_plane: Any, namespace: str, tmp_path: pathlib.Path
) -> None:
    api = kubernetes.client.CustomObjectsApi(control_plane.api_client())
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": "prof", "namespace": namespace},
        "spec": {"workload": {"model": "mlp"}, "hyperparameters": {"maxSteps": 100000}},
    }
    created = api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    body["metadata"]["uid"] = created["metadata"]["uid"]
    _apply_trainer_rbac(control_plane, namespace, body)
    token = tmp_path / "token"
    token.write_text(control_plane.service_account_token(namespace, "prof-trainer", create=False))

    config = trainer_support.mlp_config(
        tmp_path, "prof", max_steps=100000, interval_steps=None, interval_minutes=60, every_steps=200
    )
    config = config.model_copy(
        update={
            "status_target": trainer_config.StatusTarget(namespace=namespace, name="prof"),
            "pricing": trainer_config.Pricing(price_per_gpu_hour=2.0, currency="EUR"),
        }
    )
    path = trainer_support.write_config(config, tmp_path / "trainer.json")
    log = (tmp_path / "trainer.log").open("w")
    trainer = subprocess.Popen(
        trainer_support.torchrun_command(path),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=trainer_support.subprocess_env(
            OMP_NUM_THREADS="1",
            TRAINOP_KUBE_HOST=control_plane.server_url,
            TRAINOP_KUBE_TOKEN_FILE=str(token),
            TRAINOP_KUBE_CA_FILE=str(control_plane.pki.ca_cert_path),
        ),
    )

    def status() -> dict[str, Any]:
        obj = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "prof")
        result: dict[str, Any] = obj.get("status") or {}
        return result

    def annotate(value: str) -> None:
        patch = {"metadata": {"annotations": {"trainop.dev/profile": value}}}
        api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "prof", patch)

    try:
        _wait_for("training running", lambda: (status().get("progress") or {}).get("step", 0) > 0, 240)
        annotate("5")
        profile = _wait_for(
            "status.profile Completed",
            lambda: (p := status().get("profile")) and p["state"] in ("Completed", "Failed") and p,
            180,
        )
        assert (profile["state"], profile["request"], profile["steps"]) == ("Completed", "5", 5), profile

        # The cost record of the running job: a CPU job allocates no GPU, so no GPU-hours and no cost.
        cost = status()["cost"]
        assert cost["allocatedSeconds"] >= cost["trainingSeconds"] > 0, cost
        assert (cost["gpus"], cost["gpuHours"], cost["estimatedCost"]) == (0, 0.0, 0.0), cost
        assert (cost["pricePerGpuHour"], cost["currency"]) == (2.0, "EUR")

        # A one-off communication report: every op at every size, bus bandwidth measured.
        patch = {"metadata": {"annotations": {"trainop.dev/communication-report": "first"}}}
        api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "prof", patch)
        report = _wait_for("status.communication", lambda: status().get("communication"), 120)
        assert (report["request"], report["backend"], report["worldSize"]) == ("first", "gloo", 2)
        measured = {(r["op"], r["bytes"]) for r in report["results"]}
        assert measured == {
            (op, size)
            for op in ("all_reduce", "all_gather", "broadcast")
            for size in (64 << 10, 1 << 20, 8 << 20)
        }
        assert all(r["busBandwidthGBPerSecond"] > 0 and r["seconds"] > 0 for r in report["results"])
        assert json.loads(pathlib.Path(report["path"]).read_text())["results"] == report["results"]

        # A bad profile value fails in one sentence.
        annotate("many")
        failed = _wait_for(
            "status.profile Failed",
            lambda: (p := status().get("profile")) and p["state"] == "Failed" and p,
            60,
        )
        assert failed["request"] == "many"
        assert "trainop.dev/profile='many' must be a number of steps from 1 to 100" in failed["message"]
    finally:
        trainer.terminate()
        trainer.wait(timeout=120)
        log.close()

    traces = pathlib.Path(profile["path"])
    for rank in (0, 1):
        trace = json.loads((traces / f"rank{rank}.trace.json").read_text())
        names = {event.get("name", "") for event in trace["traceEvents"]}
        steps = {name for name in names if name.startswith("ProfilerStep#")}
        assert len(steps) >= 4, sorted(steps)  # the window's training steps, each marked
        assert any("gloo" in name or "all_reduce" in name for name in names), "no collective in the trace"
        assert any(name.startswith("aten::") for name in names)  # the operators of the forward/backward

    events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=prof").items
    reasons = {(e.reason, e.type) for e in events}
    assert {
        ("Profiled", "Normal"),
        ("ProfileFailed", "Warning"),
        ("CommunicationReport", "Normal"),
    } <= reasons
    profiled = next(e for e in events if e.reason == "Profiled")
    assert profiled.involved_object.uid == body["metadata"]["uid"]
    assert str(traces) in profiled.message
