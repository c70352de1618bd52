"""Checkpoints in an S3 bucket, a job on two nodes, one node lost: the next attempt resumes on the others.

The user creates a Secret with the bucket's keys and applies e2e/manifests/mlp-s3.yaml (checkpoint.storage.s3
naming the session's S3 server, versitygw on the bed's root address, and that Secret). No claim exists, so
the scheduler may put the two workers anywhere; the scenario's node pool (e2e/cluster.py) makes it two
nodes. Once a checkpoint is committed in the bucket, the node of one worker (not the head's) loses power
(the node agent's hook: its pods' processes die, it stops reporting). The worker's death fails attempt 1
(maxWorkerFailures 0); the operator starts attempt 2 after its backoff, whose pods go to the nodes left, and
attempt 2 resumes from the bucket. Everything is real except the node agent (docs/nodeagent.md).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import cluster as cluster_module
from e2e import scenario as scenario_module
from e2e.scenario import Scenario, ScriptRun, acts, phase

pytestmark = pytest.mark.e2e

MANIFEST = Path(__file__).parent / "manifests" / "mlp-s3.yaml"
SPEC = yaml.safe_load(MANIFEST.read_text())["spec"]
MAX_STEPS: int = SPEC["hyperparameters"]["maxSteps"]
CHECKPOINT_EVERY: int = SPEC["checkpoint"]["intervalSteps"]
START_TIMEOUT_S = 300
RUN_TIMEOUT_S = 600
SECRET = SPEC["checkpoint"]["storage"]["s3"]["credentialsSecret"]

Obj = dict[str, Any]


def status(obj: Obj) -> Obj:
    return obj.get("status") or {}


def committed_steps(checkpoints: Path) -> list[int]:
    """Committed checkpoints in the bucket, seen in the server's directory (``.metadata`` is DCP's commit)."""
    if not checkpoints.is_dir():
        return []
    return sorted(
        int(path.name.removeprefix("step_"))
        for path in checkpoints.glob("step_*")
        if path.name.removeprefix("step_").isdigit() and (path / ".metadata").is_file()
    )


def worker_nodes(run: Scenario, attempt: int, *, timeout_s: float = 300) -> dict[str, str]:
    """Worker pod -> node of ``attempt``'s RayCluster, once every worker is scheduled."""
    deadline = time.monotonic() + timeout_s
    found: dict[str, str] = {}
    while time.monotonic() < deadline:
        cluster = status(run.cluster.kubectl_json("get", "rayjob", run.ray_job(attempt), "-n", run.namespace))
        name = cluster.get("rayClusterName")
        if name:
            pods = run.cluster.kubectl_json(
                "get", "pods", "-n", run.namespace, "-l", f"ray.io/cluster={name},ray.io/node-type=worker"
            )["items"]
            found = {p["metadata"]["name"]: str(p["spec"].get("nodeName") or "") for p in pods}
            if len(found) == SPEC["workers"]["replicas"] and all(found.values()):
                return found
        time.sleep(1)
    raise AssertionError(f"the workers of attempt {attempt} were not all scheduled: {found}")


def act_lose_a_node(run: Scenario) -> dict[str, Any]:
    store = run.env.object_store
    assert store is not None, "the object-storage scenario needs the local bed's S3 server"
    bucket = store.create_bucket(f"e2e-{uuid.uuid4().hex[:10]}")
    run.timeline.note(f"kubectl create secret generic {SECRET} (the bucket's keys)")
    run.cluster.kubectl(
        "create",
        "secret",
        "generic",
        SECRET,
        "-n",
        run.namespace,
        f"--from-literal=AWS_ACCESS_KEY_ID={store.access_key}",
        f"--from-literal=AWS_SECRET_ACCESS_KEY={store.secret_key}",
    )

    def fill_in(document: Obj) -> list[str]:
        s3 = document["spec"]["checkpoint"]["storage"]["s3"]
        s3["bucket"], s3["endpoint"] = bucket, store.endpoint
        return [f"bucket={bucket}", f"endpoint={store.endpoint}"]

    run.apply(MANIFEST, edit=fill_in)
    run.wait_for(lambda obj: phase(obj) == "Running", timeout_s=START_TIMEOUT_S, what="phase Running")
    first_workers = worker_nodes(run, 1)
    ray_jobs = [run.cluster.kubectl_json("get", "rayjob", run.ray_job(1), "-n", run.namespace)]
    head = run.env.faults.pods(run.namespace, run.ray_job(1), "head")[0]
    head_node = run.env.faults.node_of(run.namespace, head)

    checkpoints = store.root / bucket / run.name / "checkpoints"  # the run's name is the job's
    deadline = time.monotonic() + START_TIMEOUT_S
    while not committed_steps(checkpoints):
        assert time.monotonic() < deadline, "no checkpoint was committed in the bucket"
        time.sleep(0.05)
    lost_after = committed_steps(checkpoints)[-1]
    victim = sorted(node for node in first_workers.values() if node != head_node)[0]
    run.lose_node(victim)

    restarting = run.wait_for(lambda obj: phase(obj) == "Restarting", timeout_s=300, what="phase Restarting")
    run.wait_for(
        lambda obj: status(obj).get("attempt") == 2 and phase(obj) == "Running",
        timeout_s=START_TIMEOUT_S,
        what="attempt 2 Running",
    )
    second_workers = worker_nodes(run, 2)
    ray_jobs.append(run.cluster.kubectl_json("get", "rayjob", run.ray_job(2), "-n", run.namespace))
    final = run.wait_until_finished(timeout_s=RUN_TIMEOUT_S)
    run.wait_for_ray_job(run.ray_job(2), ("Complete", "SUCCEEDED"))
    events_file = store.root / bucket / run.name / "trainop" / "events.jsonl"
    return {
        "bucket": bucket,
        "store": store,
        "first_workers": first_workers,
        "head_node": head_node,
        "victim": victim,
        "lost_after": lost_after,
        "restarting": restarting,
        "second_workers": second_workers,
        "final": final,
        "committed": committed_steps(checkpoints),
        "events": [json.loads(line) for line in events_file.read_text().splitlines()],
        "claims": run.cluster.kubectl("get", "pvc", "-n", run.namespace, "-o", "name").stdout.split(),
        "ray_jobs": ray_jobs,  # as they were while running (the operator deletes a failed attempt's)
    }


@acts(act_lose_a_node)
def test_a_two_node_job_with_checkpoints_in_a_bucket_resumes_on_the_remaining_nodes_after_losing_one(
    e2e_script: ScriptRun,
) -> None:
    if e2e_script.scenario.cluster.kind != "local":
        pytest.skip("needs the local cluster bed: its S3 server and the node agent's lose-node hook")
    run, facts = e2e_script.outcome()
    final = facts["final"]
    assert phase(final) == "Succeeded", status(final)
    pool = {node.name for node in cluster_module.POOL_NODES}

    # A two-node job: one worker per pool node, the head elsewhere; and no claim anywhere.
    first = set(facts["first_workers"].values())
    assert len(first) == 2 and first <= pool, facts["first_workers"]
    assert facts["head_node"] not in pool and facts["victim"] in first, facts
    assert facts["claims"] == [], facts["claims"]
    for ray_job in facts["ray_jobs"]:
        cluster = ray_job["spec"]["rayClusterSpec"]
        for template in [
            cluster["headGroupSpec"]["template"],
            *(g["template"] for g in cluster["workerGroupSpecs"]),
        ]:
            assert not [v for v in template["spec"]["volumes"] if "persistentVolumeClaim" in v], template
        # The credentials reach the pods by reference only: no key is in any object the operator wrote.
        assert facts["store"].secret_key not in json.dumps(ray_job), "a secret key is in the RayJob"
    assert facts["store"].secret_key not in json.dumps(final)

    # The lost node failed attempt 1; attempt 2 ran on the nodes left, still two of them.
    s = status(final)
    assert s["attempt"] == 2 and s["restarts"] == 1, s
    assert [f["attempt"] for f in s["failures"]] == [1], s["failures"]
    # The trainer saw a worker die (maxWorkerFailures 0: the attempt ends) seconds after the node went, before
    # the node lifecycle controller marks it NotReady (its grace period): no pod fact says "lost node" yet,
    # so the class is the trainer's Unknown (docs/operator.md, "Failures": a known limit).
    assert [f["reason"] for f in s["failures"]] == ["Unknown"], s["failures"]
    ended = [w for w in s["workerFailures"]["last"] if w["attempt"] == 1 and not w["restarted"]]
    assert [w["reason"] for w in ended] == ["Unknown"], s["workerFailures"]
    second = set(facts["second_workers"].values())
    assert len(second) == 2 and second <= pool - {facts["victim"]}, (facts["victim"], facts["second_workers"])

    # Attempt 2 resumed from the bucket: the trainer's record there, and every step it reported.
    starts = {e["attempt"]: e["launch"] for e in facts["events"] if e["event"] == "start"}
    resumes = [e for e in facts["events"] if e["event"] == "resume" and e["launch"] == starts[2]]
    assert resumes, facts["events"]
    resumed = resumes[0]["step"]
    assert facts["lost_after"] <= resumed < MAX_STEPS and resumed % CHECKPOINT_EVERY == 0, (facts, resumes)
    assert resumes[0]["path"] == f"s3://{facts['bucket']}/{run.name}/checkpoints/step_{resumed}", resumes
    last_update_of_attempt_1 = (status(facts["restarting"]).get("progress") or {}).get("updated", "")
    attempt_2_steps = [
        status(sample.obj)["progress"]["step"]
        for sample in run.history()
        if status(sample.obj).get("attempt") == 2
        and (status(sample.obj).get("progress") or {}).get("updated", "") > last_update_of_attempt_1
    ]
    assert attempt_2_steps and min(attempt_2_steps) >= resumed, (resumed, attempt_2_steps)
    assert attempt_2_steps[-1] == MAX_STEPS, attempt_2_steps

    # The end: the last checkpoint committed in the bucket, where status.checkpoint says it is; the
    # driver's check of the bucket on the status, for attempt 2.
    assert facts["committed"][-1] == MAX_STEPS, facts["committed"]
    path = f"s3://{facts['bucket']}/{run.name}/checkpoints/step_{MAX_STEPS}"
    assert s["checkpoint"]["step"] == MAX_STEPS and s["checkpoint"]["path"] == path, s["checkpoint"]
    storage = s["storage"]
    assert (storage["ready"], storage["reason"], storage["attempt"]) == (True, "Writable", 2), storage
    assert storage["location"] == f"s3://{facts['bucket']}/{run.name}", storage
    # ... and the operator's StorageReady tells it (no claim: from that check, of the current attempt).
    ready = {c["type"]: c for c in s["conditions"]}["StorageReady"]
    assert (ready["status"], ready["reason"]) == ("True", "BucketWritable"), ready
    trainer_fields = scenario_module.managed_status_fields(run.get(), "trainop-trainer")
    assert trainer_fields == {"progress", "checkpoint", "network", "cost", "storage", "workerFailures"}, (
        trainer_fields
    )
