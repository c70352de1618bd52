"""What a cluster does to a job that a process-only test never shows, and what the user must read about it.

Each scenario is something that happens on a real cluster, caused the way it is caused there, with
KubeRay's own controller, the real scheduler and the node agent's pods: a GPU no node has, an image that
cannot be pulled, a job suspended and resumed, pods that do not fit one node while their ReadWriteOnce
claim holds them to one, the head pod deleted (a deleted worker pod: e2e/test_failures.py). The tests
assert on what a user sees: phase, conditions, Events, attempts, the resumed step.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.scenario import Scenario, ScriptRun, acts, phase

pytestmark = pytest.mark.e2e

MANIFESTS = Path(__file__).parent / "manifests"
START_TIMEOUT_S = 420  # apply -> Running: 3 Ray pods on 2 shared cores (KubeRay probes time out under load)
RUN_TIMEOUT_S = 600
LONG_STEPS: int = yaml.safe_load((MANIFESTS / "mlp-long.yaml").read_text())["spec"]["hyperparameters"][
    "maxSteps"
]

Obj = dict[str, Any]


def status(obj: Obj) -> Obj:
    return obj.get("status") or {}


def condition(obj: Obj, type_: str) -> Obj:
    return next((c for c in status(obj).get("conditions") or () if c["type"] == type_), {})


def cluster_problem(reasons: tuple[str, ...]) -> Any:
    """The job's RayClusterReady condition is False for one of ``reasons``."""

    def predicate(obj: Obj) -> bool:
        ready = condition(obj, "RayClusterReady")
        return ready.get("status") == "False" and ready.get("reason") in reasons

    return predicate


def resumes(run: Scenario) -> list[Obj]:
    """The trainer's own record on the volume: every resume, in order."""
    events = run.env.claims.read(run.namespace, run.claim, f"{run.name}/trainop/events.jsonl")
    return [e for e in (yaml.safe_load(line) for line in events.splitlines()) if e.get("event") == "resume"]


# ------------------------------------------------------------------------------------- cannot be placed
def act_ask_for_a_gpu_no_node_has(run: Scenario) -> dict[str, Any]:
    run.apply(MANIFESTS / "mlp-gpu.yaml")
    reported = run.wait_for(
        cluster_problem(("Unschedulable",)), timeout_s=START_TIMEOUT_S, what="RayClusterReady Unschedulable"
    )
    return {"reported": reported}


@acts(act_ask_for_a_gpu_no_node_has)
def test_a_job_asking_for_a_gpu_no_node_has_says_its_workers_cannot_be_scheduled(
    e2e_script: ScriptRun,
) -> None:
    run, facts = e2e_script.outcome()
    reported = facts["reported"]
    # Not a failure: a GPU node may join the cluster (an autoscaler); the job waits and says why.
    assert phase(reported) in ("Pending", "Provisioning"), status(reported)
    message = condition(reported, "RayClusterReady")["message"]
    assert "nvidia.com/gpu" in message, message  # the scheduler's own words, naming the resource
    assert any(
        e.get("reason") == "Unschedulable" and e.get("involvedObject", {}).get("kind") == "TrainingJob"
        for e in (sample.obj for sample in run.events.samples)
    ), "no Unschedulable Event on the TrainingJob"


def act_use_an_image_that_does_not_exist(run: Scenario) -> dict[str, Any]:
    run.apply(MANIFESTS / "mlp-bad-image.yaml")
    reported = run.wait_for(
        cluster_problem(("ErrImagePull", "ImagePullBackOff")),
        timeout_s=START_TIMEOUT_S,
        what="RayClusterReady ErrImagePull/ImagePullBackOff",
    )
    # stuckPodTimeoutSeconds (30) after each attempt's RayJob: InfraError; the second uses up the budget (1).
    final = run.wait_until_finished(timeout_s=START_TIMEOUT_S)
    return {"reported": reported, "final": final}


@acts(act_use_an_image_that_does_not_exist)
def test_an_image_that_cannot_be_pulled_is_named_then_fails_its_attempts_as_infra_errors_within_the_budget(
    e2e_script: ScriptRun,
) -> None:
    run, facts = e2e_script.outcome()
    reported = facts["reported"]
    assert phase(reported) in ("Pending", "Provisioning"), status(reported)
    message = condition(reported, "RayClusterReady")["message"]
    assert "ghcr.io/trainop/trainer:no-such-tag" in message, message

    final = facts["final"]
    s = status(final)
    assert phase(final) == "Failed", s
    assert [(f["attempt"], f["reason"]) for f in s["failures"]] == [(1, "InfraError"), (2, "InfraError")], s
    for failure in s["failures"]:
        assert "ghcr.io/trainop/trainer:no-such-tag" in failure["message"], failure
        assert "(spec.failurePolicy.stuckPodTimeoutSeconds: 30)" in failure["message"], failure
    assert s["restartsByReason"] == {"InfraError": 1}, s
    failed = condition(final, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "InfraError"), failed
    assert failed["message"].endswith(
        "the infraError budget (1) is used up: fix the image or what the pods ask for (kubectl describe the "
        "Ray pods), or raise spec.failurePolicy.budgets.infraError."
    ), failed
    # Each attempt was its own RayJob, and the Ray pods of the stuck one went with it.
    assert [name for name in run.ray_job_states()] == [run.ray_job(1), run.ray_job(2)], run.ray_job_states()


def act_apply_a_job_wider_than_a_node(run: Scenario) -> dict[str, Any]:
    run.apply(MANIFESTS / "mlp-wide.yaml")
    reported = run.wait_for(
        cluster_problem(("Unschedulable",)), timeout_s=START_TIMEOUT_S, what="RayClusterReady Unschedulable"
    )
    # The pods that fit are placed (and the claim's node chosen) around the same time: wait for the claim.
    claim = run.wait_for_object(
        "pvc",
        run.claim,
        lambda obj: "volume.kubernetes.io/selected-node" in obj["metadata"].get("annotations", {}),
        timeout_s=120,
        what="the claim's node chosen by the scheduler",
    )
    # The scheduler annotates the claim in PreBind, before the volume is provisioned and the pod bound:
    # wait until the pods that fit are bound too.
    deadline = time.monotonic() + 120
    while True:
        pods = run.cluster.kubectl_json("get", "pods", "-n", run.namespace, "-l", "ray.io/is-ray-node=yes")
        if any(p["spec"].get("nodeName") for p in pods["items"]) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    return {"reported": reported, "pods": pods["items"], "claim": claim}


@acts(act_apply_a_job_wider_than_a_node)
def test_pods_that_do_not_fit_the_node_of_their_readwriteonce_claim_are_reported_unschedulable(
    e2e_script: ScriptRun,
) -> None:
    _run, facts = e2e_script.outcome()
    message = condition(facts["reported"], "RayClusterReady")["message"]
    # Two nodes have room for the job between them, but the claim's volume lives on one node (node-local,
    # like a cloud block volume in one zone): the scheduler's refusal names the CPUs the claim's node lacks
    # and the volume the other node cannot have.
    # Before the claim's volume is bound the scheduler says "didn't find available persistent volumes to
    # bind", after it "didn't match PersistentVolume's node affinity" (k8s v1.37 volumebinding/binder.go).
    assert "Insufficient cpu" in message and re.search(r"persistent ?volume", message, re.IGNORECASE), message
    placed = {p["spec"].get("nodeName") for p in facts["pods"] if p["spec"].get("nodeName")}
    assert len(placed) == 1, f"the job's scheduled pods are on {placed}, not on the one node of its claim"
    selected = facts["claim"]["metadata"]["annotations"]["volume.kubernetes.io/selected-node"]
    assert placed == {selected}, (placed, selected)


# --------------------------------------------------------------- suspend, resume; then the head pod lost
# One job for both (two until 2026-11-29: a whole Ray cluster and an attempt's start more, ~150 CPU-seconds
# of make test, issue #14): suspended after its first checkpoint and resumed (attempt 2), then attempt 2's
# head pod is deleted while it trains (attempt 3).
# A deleted worker pod (kubectl delete pod with its 30 s grace period, as a drained node or a spot reclaim
# does) is the second half of e2e/test_failures.py's stall + preemption scenario, which asserts more of it
# (the attempt's Preempted failure, the resume from the SIGTERM's own checkpoint).
def act_suspend_resume_then_delete_the_head_pod(run: Scenario) -> dict[str, Any]:
    run.apply(MANIFESTS / "mlp-long.yaml")
    run.wait_for(lambda obj: phase(obj) == "Running", timeout_s=START_TIMEOUT_S, what="phase Running")
    before_suspend = run.wait_for_checkpoint_on_volume(attempt=1)
    run.patch_spec({"suspend": True})
    suspended = run.wait_for(lambda obj: phase(obj) == "Suspended", timeout_s=120, what="phase Suspended")
    ray_pods_left = run.wait_until_no_ray_pods(timeout_s=120)
    # Attempt 1's processes are gone, so its last report is on the job now (it reported after the phase
    # went Suspended: the SIGTERM's checkpoint).
    last_report_of_attempt_1 = (status(run.get()).get("progress") or {}).get("updated", "")
    run.patch_spec({"suspend": False})
    # Attempt 2 trains: it has reported progress of its own (phase Running alone comes from KubeRay's
    # RUNNING, before the trainer has restored anything: the first run of this test deleted the head then).
    resumed = run.wait_for(
        lambda obj: (
            phase(obj) in ("Succeeded", "Failed")
            or (
                int(status(obj).get("attempt") or 0) == 2
                and phase(obj) == "Running"
                and (status(obj).get("progress") or {}).get("updated", "") > last_report_of_attempt_1
            )
        ),
        timeout_s=START_TIMEOUT_S,
        what="progress reported by attempt 2",
    )
    before_head_loss = run.wait_for_checkpoint_on_volume(attempt=2)
    # A grace period of 1 s, not the pod's 30: on a quiet machine the 3,000 steps end inside 30 s, while
    # Ray's processes in the terminating head still run the job to SUCCEEDED.
    run.delete_pod(attempt=2, node_type="head", grace_s=1)
    final = run.wait_until_finished(timeout_s=RUN_TIMEOUT_S)
    return {
        "before_suspend": before_suspend,
        "suspended": suspended,
        "ray_pods_left": ray_pods_left,
        "resumed": resumed,
        "before_head_loss": before_head_loss,
        "final": final,
    }


@acts(act_suspend_resume_then_delete_the_head_pod)
def test_a_suspended_job_resumes_from_its_checkpoint_and_a_lost_head_pod_fails_that_attempt_as_preempted(
    e2e_script: ScriptRun,
) -> None:
    """Suspend: the Ray cluster goes (every Ray pod), and the resume is a new attempt, not a restart
    (nothing failed). A lost head: KubeRay v1.5 does not make a new head for a RayJob's provisioned cluster
    and, in HTTPMode, never fails the RayJob either (it retries the dead dashboard): the RayCluster says
    HeadPodReady=False (HeadPodNotFound), and the operator ends the attempt on that, classified from the
    pod's deletion with a grace period (Preempted, no backoff). Each new attempt gets a new Ray cluster and
    resumes from the newest checkpoint."""
    run, facts = e2e_script.outcome()
    final = facts["final"]
    assert phase(final) == "Succeeded", status(final)
    assert facts["ray_pods_left"] == 0
    assert int(status(facts["resumed"]).get("attempt") or 0) == 2, status(facts["resumed"])
    assert status(facts["suspended"])["attempt"] == 1 and not status(facts["suspended"]).get("failures")
    s = status(final)
    # The suspension made attempt 2 without a failure; the lost head is the one restart.
    assert s["attempt"] == 3 and s["restarts"] == 1, s
    assert [(f["attempt"], f["reason"]) for f in s["failures"]] == [(2, "Preempted")], s["failures"]
    assert "head pod is gone" in s["failures"][0]["message"], s["failures"]
    assert s["restartsByReason"] == {"Preempted": 1}, s
    assert s["progress"]["step"] == LONG_STEPS
    states = run.ray_job_states()
    assert list(states) == [run.ray_job(1), run.ray_job(2), run.ray_job(3)], states
    resumed = [event["step"] for event in resumes(run)]
    assert len(resumed) == 2, resumed
    assert resumed[0] >= facts["before_suspend"], (facts["before_suspend"], resumed)
    assert resumed[1] >= facts["before_head_loss"] >= resumed[0], (facts["before_head_loss"], resumed)
