"""Graceful preemption in the generated Ray pods: the worker containers' preStop hook (the trainer's
``python -m trainop_trainer.preempt``), its timeout, the worker pods' grace period, and why the head has
neither."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

import operator_factories as factories
import pytest

from trainop.api import manifest, trainingjob
from trainop.controller import children, kinds, rayjob


def ray_pods(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (ray_job,) = [m for m in children.desired_children(kinds.parse(body), 1) if m["kind"] == "RayJob"]
    cluster = ray_job["spec"]["rayClusterSpec"]
    (workers,) = cluster["workerGroupSpecs"]
    return {"head": cluster["headGroupSpec"], "worker": workers}


def prestop_command(group: dict[str, Any]) -> list[str]:
    container = group["template"]["spec"]["containers"][0]  # the Ray container
    command: list[str] = container["lifecycle"]["preStop"]["exec"]["command"]
    return command


@pytest.mark.parametrize(
    "body", [factories.job(), factories.sweep()], ids=["trainingjob", "tuningsweep-trial-workers"]
)
def test_worker_containers_run_the_trainers_preempt_helper_within_an_explicit_grace_period(
    body: dict[str, Any],
) -> None:
    worker = ray_pods(body)["worker"]
    assert worker["template"]["spec"]["terminationGracePeriodSeconds"] == 120
    assert prestop_command(worker) == ["python", "-m", "trainop_trainer.preempt", "--timeout", "115"]


@pytest.mark.parametrize(("grace", "timeout"), [(10, "5"), (30, "25"), (600, "595"), (3600, "3595")])
def test_the_helper_waits_for_the_grace_period_less_five_seconds(grace: int, timeout: str) -> None:
    worker = ray_pods(factories.job(spec={"workers": {"terminationGracePeriodSeconds": grace}}))["worker"]
    assert worker["template"]["spec"]["terminationGracePeriodSeconds"] == grace
    assert prestop_command(worker)[-2:] == ["--timeout", timeout]


def test_the_api_floor_leaves_the_helper_time_and_the_kubelet_its_margin() -> None:
    floor = trainingjob.MIN_TERMINATION_GRACE_PERIOD_SECONDS
    assert rayjob.prestop_timeout_seconds(floor) >= 5
    assert floor - rayjob.prestop_timeout_seconds(floor) == rayjob.PRESTOP_MARGIN_SECONDS
    # The field's documentation (docs/api.md, kubectl explain) states the same margin.
    description = trainingjob.Workers.model_fields["termination_grace_period_seconds"].description
    assert f"less {rayjob.PRESTOP_MARGIN_SECONDS}" in (description or "")


@pytest.mark.parametrize("grace", [0, 9, 3601])
def test_a_grace_period_outside_the_bounds_is_refused_naming_the_field(grace: int) -> None:
    body = factories.job(spec={"workers": {"terminationGracePeriodSeconds": grace}})
    with pytest.raises(manifest.ManifestError, match=r"spec\.workers\.terminationGracePeriodSeconds"):
        kinds.parse(body)


@pytest.mark.parametrize(
    "workers",
    [
        {"gpusPerWorker": 0, "cpusPerWorker": 0.5},
        {"gpusPerWorker": 8, "cpusPerWorker": 32},
        {"gpusPerWorker": 8, "cpusPerWorker": 1},
    ],
    ids=["cpu", "gpu", "gpu-fraction-of-a-cpu-per-rank"],
)
@pytest.mark.parametrize("body", [factories.job, factories.sweep], ids=["trainingjob", "tuningsweep"])
def test_the_head_has_no_prestop_hook_because_no_training_rank_can_run_there(
    workers: dict[str, Any], body: Any
) -> None:
    from trainop_trainer import config as trainer_scaling

    built = body(spec={"workers": workers} if body is factories.job else {"template": {"workers": workers}})
    head = ray_pods(built)["head"]
    container = head["template"]["spec"]["containers"][0]  # the Ray container
    assert "lifecycle" not in container
    assert "terminationGracePeriodSeconds" not in head["template"]["spec"]  # Kubernetes' default applies
    # Why: the head offers Ray no CPU, and every Train worker (one rank) asks for some.
    assert head["rayStartParams"]["num-cpus"] == "0"
    asked = trainer_scaling.scaling_for(kinds.training_spec(kinds.parse(built))).resources_per_worker
    assert asked["CPU"] > 0


# The trainer's side of the hook, as a rank runs it: register the PID, route SIGTERM to requested(), and
# at the next "step" write a checkpoint and exit 0.
RANK = """
import pathlib, sys, time
from trainop_trainer import preempt
preempt.install()
preempt.register_pid(run_name="mlp", rank=0)
while not preempt.requested():
    time.sleep(0.05)
pathlib.Path(sys.argv[1]).write_text("checkpointed")
"""


def test_the_generated_hook_stops_a_registered_training_process_after_its_checkpoint(
    tmp_path: pathlib.Path,
) -> None:
    command = prestop_command(ray_pods(factories.job())["worker"])
    assert command[0] == "python"
    pid_dir = tmp_path / "pids"
    checkpoint = tmp_path / "checkpoint"
    env = {**os.environ, "TRAINOP_PID_DIR": str(pid_dir), "PYTHONUNBUFFERED": "1"}
    rank = subprocess.Popen([sys.executable, "-c", RANK, str(checkpoint)], env=env)
    try:
        pid_file = pid_dir / "mlp-rank0.pid"
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid_file.read_text() == str(rank.pid), "the rank registered its PID"
        hook = subprocess.run(
            [sys.executable, *command[1:]], capture_output=True, text=True, timeout=60, env=env
        )
        assert hook.returncode == 0, hook.stderr
        assert "still running" not in hook.stderr  # it saw the rank exit, not its timeout
        assert rank.wait(timeout=5) == 0
        assert checkpoint.read_text() == "checkpointed"
    finally:
        if rank.poll() is None:
            rank.send_signal(signal.SIGKILL)
