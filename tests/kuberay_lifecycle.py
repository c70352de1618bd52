"""The one KubeRay stand-in's substance: what KubeRay v1.5's controller writes on a RayJob's status, step by
step, checked against recordings of the real controller.

Tiers without pods (operator, reliability, security, the scale bench) have no KubeRay; where a RayJob must
get a status, a driver writes these statuses on its status subresource: ``tests/operator/integration/
kuberay_standin.py`` step by step when a test says so, ``tests/reliability/kuberay_async.py`` by itself for
every new RayJob. Both take every status from here, so the stand-in exists once.

The e2e tier runs the real KubeRay controller on the cluster bed. What it wrote there, state by state, is
recorded in :data:`GOLDEN` (``tests/data/kuberay-v1.5.0-rayjob-lifecycle.json``): the sequence of
(jobDeploymentStatus, jobStatus) a succeeded and a failed RayJob went through, and at each state the status
keys the operator reads and their values (``reason``, the start of ``message``). Two tests hold the stand-in
to it: ``tests/unit/test_kuberay_lifecycle.py`` (this module's statuses against the recording) and the e2e
scenarios (the real controller against the same recording, ``assert_matches_golden``), so a KubeRay that
changes its writes, or a stand-in that drifts, fails a test. Re-record with
``E2E_RECORD_KUBERAY_LIFECYCLE=1 make e2e`` after a KubeRay version bump, and review the diff.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parent / "data" / "kuberay-v1.5.0-rayjob-lifecycle.json"
RECORD_ENV = "E2E_RECORD_KUBERAY_LIFECYCLE"
#: The status keys the operator reads (trainop.controller.observe.ray_job): compared state by state.
OPERATOR_READS = (
    "jobDeploymentStatus",
    "jobStatus",
    "reason",
    "message",
    "rayClusterName",
    "rayClusterStatus",
)
#: How much of ``message`` is compared (the rest is Ray's log tail or a timestamp).
MESSAGE_PREFIX = 40

State = tuple[str, str]  # (jobDeploymentStatus, jobStatus)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------ the statuses, in order
def initializing(name: str) -> dict[str, Any]:
    """KubeRay picked the RayJob up and creates its RayCluster (initRayJobStatusIfNeed)."""
    return {
        "jobDeploymentStatus": "Initializing",
        "jobStatus": "",
        "jobId": f"{name}-x7k2p",
        "rayClusterName": f"{name}-q9v4c",
        "startTime": now(),
        "failed": 0,
        "succeeded": 0,
        "rayClusterStatus": {"state": "", "desiredWorkerReplicas": 0},
    }


def cluster_ready(name: str, namespace: str) -> dict[str, Any]:
    """The RayCluster is ready; the job is not submitted yet (the real controller writes this between)."""
    return {
        "jobDeploymentStatus": "Running",
        "dashboardURL": f"{name}-head-svc.{namespace}.svc.cluster.local:8265",
        "rayClusterStatus": {"state": "ready", "readyWorkerReplicas": 2, "desiredWorkerReplicas": 2},
    }


def submitted() -> dict[str, Any]:
    """HTTPMode: the job was submitted to the dashboard."""
    return {"jobDeploymentStatus": "Running", "jobStatus": "PENDING", "message": "Job has not started yet."}


def running() -> dict[str, Any]:
    return {
        "jobDeploymentStatus": "Running",
        "jobStatus": "RUNNING",
        "message": "Job is currently running.",
        "rayJobInfo": {"startTime": now()},
    }


def succeeded() -> dict[str, Any]:
    return {
        "jobDeploymentStatus": "Complete",
        "jobStatus": "SUCCEEDED",
        "endTime": now(),
        "succeeded": 1,
        "message": "Job finished successfully.",
    }


def failed(message: str = "", reason: str = "AppFailed") -> dict[str, Any]:
    """The entrypoint failed (Ray's job supervisor runs it through a shell: a SIGKILLed entrypoint is exit
    code 137, as the real controller reported on the bed)."""
    return {
        "jobDeploymentStatus": "Failed",
        "jobStatus": "FAILED",
        "reason": reason,
        "message": message or "Job entrypoint command failed with exit code 1",
        "endTime": now(),
        "failed": 1,
    }


def validation_failed(message: str) -> dict[str, Any]:
    """KubeRay refused the RayJob's spec (not reached by the e2e scenarios; KubeRay's own value)."""
    return {"jobDeploymentStatus": "ValidationFailed", "reason": "ValidationFailed", "message": message}


def lifecycle(name: str, namespace: str, *, outcome: str, message: str = "") -> list[dict[str, Any]]:
    """Every status patch of a RayJob that ends ``outcome`` ("succeeded" or "failed"), in order."""
    end = succeeded() if outcome == "succeeded" else failed(message)
    return [initializing(name), cluster_ready(name, namespace), submitted(), running(), end]


# ------------------------------------------------------------------------------- the golden recording
def observe(statuses: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a sequence of RayJob statuses (each a whole ``status``, as a watch shows it) looks like to the
    operator: one entry per (jobDeploymentStatus, jobStatus) state change, with the keys the operator reads
    that are set, and the values that identify the state."""
    seen: list[dict[str, Any]] = []
    for status in statuses:
        state = [str(status.get("jobDeploymentStatus") or ""), str(status.get("jobStatus") or "")]
        if state == ["", ""] or (seen and seen[-1]["state"] == state):
            continue
        seen.append(
            {
                "state": state,
                "keys": sorted(k for k in OPERATOR_READS if status.get(k) not in (None, "", {})),
                "reason": str(status.get("reason") or ""),
                "message": str(status.get("message") or "")[:MESSAGE_PREFIX],
            }
        )
    return seen


def merged(patches: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The whole status after each merge patch of ``patches`` (what a watch on the RayJob shows)."""
    whole: dict[str, Any] = {}
    out = []
    for patch in patches:
        whole = {**whole, **patch}
        out.append(dict(whole))
    return out


def record(outcome: str, observed: list[dict[str, Any]]) -> None:
    """Write ``observed`` as the recording of ``outcome`` (E2E_RECORD_KUBERAY_LIFECYCLE=1 in the e2e tier)."""
    data: dict[str, Any] = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
    data["kuberay"] = "v1.5.0 (the real controller on the cluster bed, e2e tier)"
    data["recorded"] = now()
    data.setdefault("lifecycles", {})[outcome] = observed
    GOLDEN.write_text(json.dumps(data, indent=2) + "\n")


def golden() -> dict[str, list[dict[str, Any]]]:
    data: dict[str, list[dict[str, Any]]] = json.loads(GOLDEN.read_text())["lifecycles"]
    return data


def differences(observed: list[dict[str, Any]], expected: list[dict[str, Any]]) -> list[str]:
    """Where ``observed`` departs from ``expected``, in words (empty: they agree). A state the observer
    saw late (a watch started after it) may be missing at the start; nothing else may differ."""
    found = []
    states = [tuple(e["state"]) for e in expected]
    if observed and tuple(observed[0]["state"]) in states:
        expected = expected[states.index(tuple(observed[0]["state"])) :]
    if [e["state"] for e in observed] != [e["state"] for e in expected]:
        found.append(f"states {[e['state'] for e in observed]} != {[e['state'] for e in expected]}")
        return found
    for got, want in zip(observed, expected, strict=True):
        for field in ("keys", "reason", "message"):
            if got[field] != want[field]:
                found.append(f"at {got['state']}: {field} {got[field]!r} != {want[field]!r}")
    return found
