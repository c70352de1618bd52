"""A TrainingJob end to end: apply, watch the columns move, Succeeded; and the two failure layers.

Each scenario applies e2e/manifests/mlp-tiny.yaml (the CPU MLP, 2 gloo workers) into its own namespace and
watches it with kubectl until it is done; the ``act_*`` functions are what the user does (they run
concurrently, see e2e/scenario.py), the tests assert on what the user saw. docs/e2e.md has each one's
timeline.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import scenario as scenario_module
from e2e.scenario import Scenario, ScriptRun, acts, phase
from tests import kuberay_lifecycle

pytestmark = pytest.mark.e2e

MANIFEST = Path(__file__).parent / "manifests" / "mlp-tiny.yaml"
SPEC = yaml.safe_load(MANIFEST.read_text())["spec"]
MAX_STEPS: int = SPEC["hyperparameters"]["maxSteps"]
CHECKPOINT_EVERY: int = SPEC["checkpoint"]["intervalSteps"]
START_TIMEOUT_S = 300  # RayJob created -> first checkpoint: Ray and torch start-up on 2 busy cores
RUN_TIMEOUT_S = 420

Obj = dict[str, Any]


def status(obj: Obj) -> Obj:
    return obj.get("status") or {}


def checkpoint_step(obj: Obj) -> int:
    return int((status(obj).get("checkpoint") or {}).get("step") or 0)


def assert_final_checkpoint_on_claim(run: Scenario, final: Obj, max_steps: int = MAX_STEPS) -> None:
    """The last checkpoint (step maxSteps) is on the job's claim, committed (torch.distributed.checkpoint's
    ``.metadata``, with trainop's ``manifest.json`` and one shard file per rank), where status.checkpoint
    says it is."""
    files = run.env.claims.files(run.namespace, run.claim, f"{run.name}/checkpoints")  # run name = job name
    final_files = {f.removeprefix(f"step_{max_steps}/") for f in files if f.startswith(f"step_{max_steps}/")}
    assert {".metadata", "manifest.json"} <= final_files, files
    shards = {f for f in final_files if f.endswith(".distcp")}
    assert len(shards) == scenario_module.world_size(run.document), files
    checkpoint = status(final)["checkpoint"]
    assert checkpoint["step"] == max_steps
    assert checkpoint["path"].endswith(f"{run.name}/checkpoints/step_{max_steps}"), checkpoint


# (jobDeploymentStatus, jobStatus) in the order KubeRay v1.5 moves a RayJob through them in HTTPMode, as
# its real controller does on the cluster bed: Running with no job status yet comes between Initializing
# (the RayCluster is starting) and PENDING (the job is submitted to the dashboard).
KUBERAY_LIFECYCLE = [
    ("", ""),
    ("Initializing", ""),
    ("Running", ""),
    ("Running", "PENDING"),
    ("Running", "RUNNING"),
]


def assert_matches_kuberay_recording(run: Scenario, ray_job: str, outcome: str) -> None:
    """What the real KubeRay wrote on ``ray_job``, as the operator reads it, is what the recording says
    (tests/kuberay_lifecycle.py: the same recording holds the operator tier's stand-in to it). With
    E2E_RECORD_KUBERAY_LIFECYCLE=1 the observation becomes the recording instead."""
    assert run.ray_jobs is not None
    statuses = [
        s.obj.get("status") or {} for s in run.ray_jobs.samples if s.obj["metadata"]["name"] == ray_job
    ]
    observed = kuberay_lifecycle.observe(statuses)
    if os.environ.get(kuberay_lifecycle.RECORD_ENV):
        kuberay_lifecycle.record(outcome, observed)
        return
    assert not kuberay_lifecycle.differences(observed, kuberay_lifecycle.golden()[outcome]), observed


def assert_kuberay_lifecycle(states: list[tuple[str, str]], end: tuple[str, str]) -> None:
    """What the RayJob watch saw is KubeRay's lifecycle, in order (a watch started late misses the
    first states), ending in ``end``."""
    assert states and states[-1] == end, states
    order = [*KUBERAY_LIFECYCLE, end]
    positions = [order.index(state) for state in states if state in order]
    assert len(positions) == len(states) and positions == sorted(positions), states


# ----------------------------------------------------------------------------------------- succeeded
def act_apply_and_watch(run: Scenario) -> dict[str, Any]:
    run.apply(MANIFEST)
    run.wait_for(lambda obj: phase(obj) == "Running", timeout_s=START_TIMEOUT_S, what="phase Running")
    final = run.wait_until_finished(timeout_s=RUN_TIMEOUT_S)
    run.wait_for_ray_job(run.ray_job(1), ("Complete", "SUCCEEDED"))  # its watch may lag the owner's
    return {"final": final}


@acts(act_apply_and_watch)
def test_cpu_trainingjob_runs_to_succeeded_with_progress_reported_by_its_own_service_account(
    e2e_script: ScriptRun,
) -> None:
    run, facts = e2e_script.outcome()
    final = facts["final"]
    assert phase(final) == "Succeeded", status(final)

    # What `kubectl get trainingjobs` showed: STEP and CHECKPOINT advanced while Running, never backwards.
    running = [cells for _, cells in run.column_history() if cells["Phase"] == "Running"]
    steps = [cells["Step"] for cells in running if cells["Step"] is not None]
    checkpoints = [cells["Checkpoint"] for cells in running if cells["Checkpoint"] is not None]
    assert len(set(steps)) >= 3, f"STEP took {sorted(set(steps))} while Running"
    assert len(set(checkpoints)) >= 2, f"CHECKPOINT took {sorted(set(checkpoints))} while Running"
    assert steps == sorted(steps) and checkpoints == sorted(checkpoints), (steps, checkpoints)
    assert all(0 < c <= MAX_STEPS and c % CHECKPOINT_EVERY == 0 for c in checkpoints), checkpoints

    # The end state a user reads.
    s = status(final)
    assert s["progress"]["step"] == MAX_STEPS and s["progress"]["totalSteps"] == MAX_STEPS
    assert s["progress"]["workerRestarts"] == 0
    assert s["attempt"] == 1 and s["restarts"] == 0 and not s.get("failures"), s
    gpus = run.document["spec"]["workers"].get("gpusPerWorker", 0)
    assert s["network"]["backend"] == ("nccl" if gpus else "gloo"), s["network"]
    assert s["network"]["worldSize"] == scenario_module.world_size(run.document), s["network"]
    conditions = {c["type"]: c for c in s["conditions"]}
    assert conditions["Complete"]["status"] == "True", s["conditions"]
    assert (conditions["StorageReady"]["status"], conditions["StorageReady"]["reason"]) == (
        "True",
        "ClaimBound",
    )
    states = run.ray_job_states()
    assert list(states) == [run.ray_job(1)], states
    assert_kuberay_lifecycle(states[run.ray_job(1)], ("Complete", "SUCCEEDED"))
    assert_matches_kuberay_recording(run, run.ray_job(1), "succeeded")
    assert_final_checkpoint_on_claim(run, final)

    # Who wrote what. managedFields: the trainer's field manager owns progress/checkpoint/network/cost of
    # the status subresource (and storage, the driver's start-up check; evaluation, profile, communication
    # and tracking only when asked for), the operator's owns phase and the rest, and neither owns the
    # other's fields.
    stored = run.get()
    trainer_fields = scenario_module.managed_status_fields(stored, "trainop-trainer")
    operator_fields = scenario_module.managed_status_fields(stored, "trainop")
    assert trainer_fields == {"progress", "checkpoint", "network", "cost", "storage"}, trainer_fields
    assert {"phase", "attempt", "conditions"} <= operator_fields, operator_fields
    assert not operator_fields & trainer_fields, (operator_fields, trainer_fields)

    # Field managers are names any client may claim; the apiserver's audit log has the authenticated user
    # of every status write: the job's own ServiceAccount (the token its pods get) and the chart's
    # operator ServiceAccount, nobody else. (Local cluster only: a real one's audit log is not ours.)
    audit = run.cluster.audit_log
    if audit is not None:
        writers = audit.writers(namespace=run.namespace, resource="trainingjobs/status", name=run.name)
        assert set(writers) == {run.trainer_identity, run.env.operator_identity}, writers
        assert writers[run.trainer_identity] >= len(set(steps)), writers
        creators = audit.creators(namespace=run.namespace, resource="rayjobs")
        assert creators == {run.env.operator_identity: 1}, creators


# -------------------------------------------- layer 1, then layer 2: a worker dies, then the RayJob fails
# One job for both layers (two until 2026-11-29: a Ray cluster and an attempt's start more, ~150 CPU-seconds
# of make test, issue #14). It trains 1,800 steps, so that the restarted worker group still has steps to go
# when its entrypoint is killed.
LAYERS_MAX_STEPS = 1800


def longer(document: Obj) -> list[str]:
    document["spec"]["hyperparameters"]["maxSteps"] = LAYERS_MAX_STEPS
    return [f"maxSteps={LAYERS_MAX_STEPS}"]


def workers_restarted(obj: Obj) -> int:
    return int((status(obj).get("progress") or {}).get("workerRestarts") or 0)


def act_kill_a_worker_then_the_rayjob(run: Scenario) -> dict[str, Any]:
    run.apply(MANIFEST, longer)
    run.wait_for(lambda obj: phase(obj) == "Running", timeout_s=START_TIMEOUT_S, what="phase Running")
    worker_killed_after = run.kill_worker(attempt=1)  # right after the first committed checkpoint, in the pod
    worker_killed_at = run.timeline.clock()
    # Layer 1: Ray Train restarts the worker group inside the attempt; its first report says so.
    restarted = run.wait_for(
        lambda obj: phase(obj) in ("Succeeded", "Failed") or workers_restarted(obj) == 1,
        timeout_s=RUN_TIMEOUT_S,
        what="status.progress.workerRestarts 1",
    )
    # Layer 2: the entrypoint dies (right after a committed checkpoint, in the head): the RayJob fails.
    driver_killed_after = run.kill_driver(attempt=1)
    restarting = run.wait_for(lambda obj: phase(obj) == "Restarting", timeout_s=120, what="phase Restarting")
    final = run.wait_until_finished(timeout_s=RUN_TIMEOUT_S)
    run.wait_for_ray_job(run.ray_job(2), ("Complete", "SUCCEEDED"))
    return {
        "worker_killed_after": worker_killed_after,
        "worker_killed_at": worker_killed_at,
        "restarted": restarted,
        "driver_killed_after": driver_killed_after,
        "restarting": restarting,
        "final": final,
    }


@acts(act_kill_a_worker_then_the_rayjob)
def test_a_killed_worker_is_restarted_in_the_attempt_and_a_failed_rayjob_is_retried_from_the_checkpoint(
    e2e_script: ScriptRun,
) -> None:
    run, facts = e2e_script.outcome()
    final, restarting = facts["final"], facts["restarting"]
    assert phase(final) == "Succeeded", status(final)

    # Layer 1: Ray Train restarted the worker group; the operator saw no failure and made no new attempt.
    restarted = status(facts["restarted"])
    assert phase(facts["restarted"]) == "Running", restarted
    assert restarted["attempt"] == 1 and int(restarted.get("restarts") or 0) == 0, restarted
    assert not restarted.get("failures"), restarted
    assert 0 < facts["worker_killed_after"] < LAYERS_MAX_STEPS, facts["worker_killed_after"]
    # The restarted group resumed from a checkpoint: once the restart showed on status, STEP never went
    # below the checkpoint that was on the volume when the worker was killed (until attempt 1 ended).
    after = [
        status(sample.obj)["progress"]["step"]
        for sample in run.history()
        if sample.seconds > facts["worker_killed_at"]
        and status(sample.obj).get("attempt") == 1
        and workers_restarted(sample.obj) == 1
    ]
    assert after, "status.progress.workerRestarts never showed 1 while attempt 1 ran"
    assert min(after) >= facts["worker_killed_after"], (facts["worker_killed_after"], after)

    # Layer 2: attempt 2 after a failed RayJob.
    s = status(final)
    assert s["attempt"] == 2 and s["restarts"] == 1, s
    # Failure history: attempt 1, class Unknown (no trainer record: the driver itself was killed; no pod
    # fact: the head pod lives on), with KubeRay's reason and Ray's message about the killed entrypoint
    # (Ray's job supervisor runs it through a shell, which reports a SIGKILLed child as exit code 128 + 9).
    assert [f["attempt"] for f in s["failures"]] == [1], s["failures"]
    assert s["failures"][0]["reason"] == "Unknown", s["failures"]
    assert s["failures"][0]["message"].startswith("AppFailed: "), s["failures"]
    assert "failed with exit code 137" in s["failures"][0]["message"], s["failures"]
    assert s["restartsByReason"] == {"Unknown": 1}, s
    states = run.ray_job_states()
    assert list(states) == [run.ray_job(1), run.ray_job(2)], states
    assert_kuberay_lifecycle(states[run.ray_job(1)], ("Failed", "FAILED"))
    assert_kuberay_lifecycle(states[run.ray_job(2)], ("Complete", "SUCCEEDED"))
    assert_matches_kuberay_recording(run, run.ray_job(1), "failed")

    # Attempt 2 continued from the checkpoint: every step it reported is at or past the checkpoint that
    # status showed when attempt 1 failed (a restart from zero would report small steps first).
    checkpoint_at_failure = checkpoint_step(restarting)
    last_update_of_attempt_1 = (status(restarting).get("progress") or {}).get("updated", "")
    attempt_2_steps = [
        status(sample.obj)["progress"]["step"]
        for sample in run.history()
        if status(sample.obj).get("attempt") == 2
        and phase(sample.obj) == "Running"
        and (status(sample.obj).get("progress") or {}).get("updated", "") > last_update_of_attempt_1
    ]
    assert attempt_2_steps, "attempt 2 never reported progress while Running"
    assert min(attempt_2_steps) >= checkpoint_at_failure, (checkpoint_at_failure, attempt_2_steps)
    assert attempt_2_steps[-1] == LAYERS_MAX_STEPS, attempt_2_steps
    # The trainer's own record on the volume: attempt 2 resumed from the checkpoint that was on the volume
    # when the entrypoint was killed, or a later one (an in-flight save may have committed after the kill).
    events = [
        yaml.safe_load(line)
        for line in run.env.claims.read(
            run.namespace, run.claim, f"{run.name}/trainop/events.jsonl"
        ).splitlines()
    ]
    resumes = [event for event in events if event.get("event") == "resume"]
    assert len(resumes) == 2, events  # the restarted worker group's, then attempt 2's
    driver_killed_after = facts["driver_killed_after"]
    assert driver_killed_after <= resumes[-1]["step"] < LAYERS_MAX_STEPS, (driver_killed_after, resumes)
    assert resumes[-1]["step"] % CHECKPOINT_EVERY == 0, resumes
    assert_final_checkpoint_on_claim(run, final, LAYERS_MAX_STEPS)
