"""`kubectl trainop` against the real control plane: the real kubectl binary runs the plugin (and the plugin
runs kubectl), the real operator process acts on what it changes, KubeRay's part is played by its stand-in.

What needs running Ray pods cannot happen here (there is no kubelet): `logs` of a live head and
`checkpoints` read inside a pod are tested against recorded objects in tests/unit/test_plugin.py; here
they are driven to the point where the cluster would have to run a pod, and must say so in one sentence
(and, for `checkpoints`, fall back to what the status knows and clean up the pod it asked for).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import operator_factories as factories
import pytest
from cluster_api import Api, wait_for

from tests.controlplane import cluster

pytestmark = pytest.mark.controlplane

TRAINER_STATUS = {
    "progress": {
        "step": 120,
        "totalSteps": 1000,
        "epoch": 1,
        "loss": 0.5,
        "samplesPerSecond": 812.0,
        "percent": 12.0,
        "etaSeconds": 300.0,
        "updated": "2026-03-01T12:00:00Z",
    },
    "checkpoint": {
        "step": 100,
        "epoch": 1,
        "path": "/checkpoints/mlp/checkpoints/step_100",
        "time": "2026-03-01T11:59:00Z",
        "metrics": {"loss": 0.52},
    },
    "network": {
        "profile": "tcp",
        "backend": "gloo",
        "allReduceBusBandwidthGBPerSecond": 0.44,
        "worldSize": 2,
    },
}


def plugin(
    control_plane: cluster.ControlPlane, *args: str, namespace: str, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """`trainop VERB ...` as kubectl would run it, with the test cluster's kubeconfig."""
    env = {**os.environ, "TRAINOP_KUBECTL": str(control_plane.assets.kubectl)}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "trainop",
            *args,
            "--namespace",
            namespace,
            "--kubeconfig",
            str(control_plane.kubeconfig_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def running_job(
    api: Api, apply: Any, kuberay: Any, namespace: str, control_plane: cluster.ControlPlane
) -> None:
    """A running TrainingJob `mlp` whose trainer has reported progress, a checkpoint and the network."""
    apply(factories.manifest("mlp", namespace))
    wait_for(lambda: api.get(api.ray_jobs(namespace, "mlp-a1")), lambda r: r is not None, what="RayJob")
    kuberay.run(namespace, "mlp-a1")
    wait_for(
        lambda: api.get(api.job(namespace, "mlp")),
        lambda j: (j.get("status") or {}).get("phase") == "Running",
    )
    control_plane.kubectl(
        "patch",
        "trainingjob",
        "mlp",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": TRAINER_STATUS}),
    )


def phase(api: Api, namespace: str) -> str:
    return str(((api.get(api.job(namespace, "mlp")) or {}).get("status") or {}).get("phase"))


def test_kubectl_finds_the_plugin_on_the_path_and_its_help_lists_every_verb(
    control_plane: cluster.ControlPlane, tmp_path: pathlib.Path
) -> None:
    script = tmp_path / "kubectl-trainop"  # what [project.scripts] installs
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom trainop.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    listed = subprocess.run(
        [str(control_plane.assets.kubectl), "plugin", "list"], capture_output=True, text=True, env=env
    )
    assert str(script) in listed.stdout
    shown = subprocess.run(
        [str(control_plane.assets.kubectl), "trainop", "--help"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    assert shown.startswith("usage: kubectl trainop")
    for verb in ("status", "logs", "checkpoints", "suspend", "resume", "restart"):
        assert f"\n    {verb}" in shown, verb


def test_status_shows_phase_progress_checkpoint_and_network_on_one_screen(
    operator: Any, api: Api, apply: Any, kuberay: Any, namespace: str, control_plane: cluster.ControlPlane
) -> None:
    running_job(api, apply, kuberay, namespace, control_plane)
    result = plugin(control_plane, "status", "mlp", namespace=namespace)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith(f"TrainingJob {namespace}/mlp: Running\n")
    assert "Attempt 1 runs in RayJob mlp-a1 with 2 worker pods." in out
    assert "attempt 1, 0 restarts" in out
    assert "step 120/1000 (12.0%), loss 0.5, 812 samples/s" in out
    assert "checkpoint step 100" in out and "/checkpoints/mlp/checkpoints/step_100" in out
    assert "network   tcp (gloo), all-reduce 0.44 GB/s over 2 ranks" in out
    assert len(out.splitlines()) <= 24  # one screen


def test_status_after_a_failure_shows_restarting_and_the_failure(
    operator: Any, api: Api, apply: Any, kuberay: Any, namespace: str, control_plane: cluster.ControlPlane
) -> None:
    apply(
        factories.manifest(
            "mlp", namespace, spec={"failurePolicy": {"backoffSeconds": 60, "maxBackoffSeconds": 60}}
        )
    )
    wait_for(lambda: api.get(api.ray_jobs(namespace, "mlp-a1")), lambda r: r is not None, what="RayJob")
    kuberay.run(namespace, "mlp-a1")
    kuberay.fail(namespace, "mlp-a1", message="NCCL watchdog timeout on rank 3")
    wait_for(lambda: phase(api, namespace), lambda p: p == "Restarting", what="Restarting")
    out = plugin(control_plane, "status", "mlp", namespace=namespace).stdout
    assert f"TrainingJob {namespace}/mlp: Restarting" in out
    assert "next attempt at" in out
    assert "attempt 1 at" in out and "AppFailed: NCCL watchdog timeout on rank 3" in out


def test_status_of_a_name_that_does_not_exist_says_so_in_one_line(
    namespace: str, control_plane: cluster.ControlPlane
) -> None:
    result = plugin(control_plane, "status", "nope", namespace=namespace)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"kubectl trainop status: no TrainingJob or TuningSweep named nope in namespace {namespace}: check "
        "the name, or pass -n NAMESPACE"
    )


def test_suspend_then_resume_goes_through_the_operator_to_a_new_attempt(
    operator: Any, api: Api, apply: Any, kuberay: Any, namespace: str, control_plane: cluster.ControlPlane
) -> None:
    running_job(api, apply, kuberay, namespace, control_plane)
    result = plugin(control_plane, "suspend", "mlp", namespace=namespace)
    assert result.returncode == 0, result.stderr
    assert "suspended: the operator deletes its Ray pods; checkpoints stay" in result.stdout
    wait_for(lambda: phase(api, namespace), lambda p: p == "Suspended", what="Suspended")
    wait_for(lambda: api.get(api.ray_jobs(namespace, "mlp-a1")), lambda r: r is None, what="RayJob a1 gone")
    again = plugin(control_plane, "suspend", "mlp", namespace=namespace)
    assert "is already suspended (phase Suspended)" in again.stdout

    result = plugin(control_plane, "resume", "mlp", namespace=namespace)
    assert result.returncode == 0, result.stderr
    wait_for(lambda: api.get(api.ray_jobs(namespace, "mlp-a2")), lambda r: r is not None, what="RayJob a2")
    body = api.get(api.job(namespace, "mlp"))
    assert body is not None and body["status"]["restarts"] == 0  # a resume is not a restart


def test_restart_suspends_waits_for_the_operator_and_resumes_into_a_new_attempt(
    operator: Any, api: Api, apply: Any, kuberay: Any, namespace: str, control_plane: cluster.ControlPlane
) -> None:
    running_job(api, apply, kuberay, namespace, control_plane)
    result = plugin(control_plane, "restart", "mlp", "--timeout", "60", namespace=namespace)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"suspending TrainingJob {namespace}/mlp (attempt 1)",
        f"resuming TrainingJob {namespace}/mlp: the operator starts a new attempt from the newest checkpoint",
        f"TrainingJob {namespace}/mlp: attempt 2, phase Pending",
    ]
    assert api.get(api.ray_jobs(namespace, "mlp-a2")) is not None
    body = api.get(api.job(namespace, "mlp"))
    assert body is not None and body["spec"]["suspend"] is False


def test_restart_of_a_finished_job_says_how_to_run_it_again(
    operator: Any, api: Api, apply: Any, kuberay: Any, namespace: str, control_plane: cluster.ControlPlane
) -> None:
    apply(factories.manifest("mlp", namespace))
    wait_for(lambda: api.get(api.ray_jobs(namespace, "mlp-a1")), lambda r: r is not None, what="RayJob")
    kuberay.run(namespace, "mlp-a1")
    kuberay.succeed(namespace, "mlp-a1")
    wait_for(lambda: phase(api, namespace), lambda p: p == "Succeeded", what="Succeeded")
    result = plugin(control_plane, "restart", "mlp", namespace=namespace)
    assert result.returncode == 1
    assert "has Succeeded, so there is no attempt to restart" in result.stderr
    assert "delete it and apply its manifest again" in result.stderr


def test_logs_of_a_job_whose_ray_head_does_not_run_say_why_there_is_no_log(
    operator: Any, api: Api, apply: Any, namespace: str, control_plane: cluster.ControlPlane
) -> None:
    apply(factories.manifest("mlp", namespace))
    wait_for(lambda: api.get(api.ray_jobs(namespace, "mlp-a1")), lambda r: r is not None, what="RayJob")
    result = plugin(control_plane, "logs", "mlp", "--rank", "0", namespace=namespace)
    assert result.returncode == 1
    assert "the Ray head of attempt 1 does not exist yet; try again once it runs" in result.stderr


def test_checkpoints_of_a_suspended_job_ask_for_a_claim_pod_then_fall_back_to_the_status_and_clean_up(
    operator: Any, api: Api, apply: Any, kuberay: Any, namespace: str, control_plane: cluster.ControlPlane
) -> None:
    """No kubelet runs the claim pod here: the verb must give up after --timeout, show the newest checkpoint
    the trainer reported, and leave no pod behind. The pod it asked for was admitted by the apiserver."""
    running_job(api, apply, kuberay, namespace, control_plane)
    plugin(control_plane, "suspend", "mlp", namespace=namespace)
    wait_for(lambda: phase(api, namespace), lambda p: p == "Suspended", what="Suspended")
    result = plugin(control_plane, "checkpoints", "mlp", "--timeout", "3", namespace=namespace)
    assert result.returncode == 0, result.stderr
    assert "pod mlp-claim-" in result.stderr and "did not finish within 3 s (phase Pending)" in result.stderr
    assert "the newest checkpoint the trainer reported" in result.stderr
    header, row = result.stdout.splitlines()
    assert header.split() == ["STEP", "EPOCH", "TIME", "SIZE", "LOSS", "DIRECTORY"]
    assert row.split()[:3] == ["100", "1", "2026-03-01T11:59:00Z"] and "step_100" in row
    pods = api.list(api.core(namespace, "pods"), "trainop.dev/claim-of=mlp")
    assert all(p["metadata"].get("deletionTimestamp") for p in pods)  # deleted (or going)
