"""Failure classes, budgets and the operator's stall watchdog against the real apiserver.

The trainer's part (status.progress, status.workerFailures) is written by the test through the status
subresource, as the trainer's rank 0 / driver would; KubeRay's part is played by its stand-in. The trainer's
own watchdog is absent here by construction: only the operator's can fire.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import operator_factories as factories
import pytest
from cluster_api import Api, wait_for
from operator_process import OperatorProcess

from trainop.controller import observe

pytestmark = pytest.mark.controlplane

# The operator's watchdog fires after stallTimeoutSeconds + 2 x reporting.everySeconds = 10 + 2 s.
FAST_STALL = {
    "failurePolicy": {"maxRestarts": None, "stallTimeoutSeconds": 10, "backoffSeconds": 1},
    "reporting": {"everySeconds": 1},
}


def status_of(api: Api, namespace: str) -> dict[str, Any]:
    body = api.get(api.job(namespace, "mlp"))
    assert body is not None
    return body.get("status") or {}


def live_ray_jobs(api: Api, namespace: str) -> list[str]:
    items = api.list(api.ray_jobs(namespace), "trainop.dev/job=mlp")
    return sorted(r["metadata"]["name"] for r in items if not r["metadata"].get("deletionTimestamp"))


def report(api: Api, namespace: str, fields: dict[str, Any]) -> None:
    """A status patch as the trainer writes it."""
    api.patch(api.job(namespace, "mlp") + "/status", {"status": fields})


def now() -> str:
    return observe.format_time(datetime.datetime.now(datetime.UTC))


def event_reasons(api: Api, namespace: str) -> list[str]:
    events = api.list(f"/api/v1/namespaces/{namespace}/events")
    return [e["reason"] for e in events if e["involvedObject"]["name"] == "mlp"]


def test_a_trainer_that_stops_reporting_is_restarted_by_the_operator_across_an_operator_restart(
    dedicated_operator: OperatorProcess, api: Api, apply: Any, kuberay: Any, namespace: str
) -> None:
    dedicated_operator.start(namespaces=[namespace])
    try:
        apply(factories.manifest("mlp", namespace, spec=FAST_STALL))
        wait_for(lambda: live_ray_jobs(api, namespace), lambda names: names == ["mlp-a1"], what="mlp-a1")
        kuberay.run(namespace, "mlp-a1")
        wait_for(lambda: status_of(api, namespace), lambda s: s.get("phase") == "Running", what="Running")
        report(api, namespace, {"progress": {"step": 5, "updated": now()}})  # once, then silence

        # The operator that armed the watchdog goes away; the one that comes back reads the timing from the
        # status (the Running condition's transition and progress.updated), not from memory.
        dedicated_operator.kill()
        time.sleep(2)
        dedicated_operator.start(namespaces=[namespace])

        restarted = wait_for(
            lambda: status_of(api, namespace),
            lambda s: s.get("attempt") == 2,
            timeout_s=60,
            what="attempt 2 after the stall",
        )
        assert restarted["restartsByReason"] == {"Stalled": 1}
        assert [(f["attempt"], f["reason"]) for f in restarted["failures"]] == [(1, "Stalled")]
        assert "no reported progress for" in restarted["failures"][0]["message"]
        assert "(step 5)" in restarted["failures"][0]["message"]
        wait_for(lambda: live_ray_jobs(api, namespace), lambda names: names == ["mlp-a2"], what="mlp-a2 only")
        assert "Stalled" in event_reasons(api, namespace)

        # The new attempt runs and is not stalled at once: the watchdog is re-armed at its Running entry.
        kuberay.run(namespace, "mlp-a2")
        running = wait_for(
            lambda: status_of(api, namespace), lambda s: s.get("phase") == "Running", what="attempt 2 Running"
        )
        progressing = {c["type"]: c for c in running["conditions"]}["Progressing"]
        assert (progressing["status"], progressing["reason"]) == ("True", "Progressing")
        kuberay.succeed(namespace, "mlp-a2")
        done = wait_for(
            lambda: status_of(api, namespace), lambda s: s.get("phase") == "Succeeded", what="Succeeded"
        )
        assert (done["attempt"], done["restarts"]) == (2, 1)
    finally:
        if dedicated_operator.running:
            dedicated_operator.kill()


def test_a_user_code_error_is_retried_once_then_fails_the_job_naming_its_budget(
    operator: Any, api: Api, apply: Any, kuberay: Any, namespace: str
) -> None:
    apply(factories.manifest("mlp", namespace, spec={"failurePolicy": {"maxRestarts": None}}))
    for attempt in (1, 2):
        name = f"mlp-a{attempt}"
        wait_for(lambda n=name: live_ray_jobs(api, namespace), lambda names, n=name: names == [n], what=name)
        kuberay.run(namespace, name)
        wait_for(lambda: status_of(api, namespace), lambda s: s.get("phase") == "Running", what="Running")
        entry = {
            "attempt": attempt,
            "reason": "UserCodeError",
            "message": "ValueError: bad shape at model.py:42 (forward)",
            "rank": 0,
            "step": 17,
            "time": now(),
            "restarted": False,
        }
        report(api, namespace, {"workerFailures": {"counts": {}, "last": [entry]}})
        kuberay.fail(namespace, name, message="the Ray job's entrypoint exited with code 1")
        if attempt == 1:
            wait_for(
                lambda: status_of(api, namespace), lambda s: s.get("phase") == "Restarting", what="Restarting"
            )

    failed = wait_for(lambda: status_of(api, namespace), lambda s: s.get("phase") == "Failed", what="Failed")
    assert (failed["attempt"], failed["restarts"], failed["restartsByReason"]) == (2, 1, {"UserCodeError": 1})
    assert [f["reason"] for f in failed["failures"]] == ["UserCodeError", "UserCodeError"]
    condition = {c["type"]: c for c in failed["conditions"]}["Failed"]
    assert condition["reason"] == "UserCodeError"
    assert condition["message"] == (
        "UserCodeError: ValueError: bad shape at model.py:42 (forward) (rank 0, step 17) (attempt 2); "
        "the userCodeError budget (1) is used up: fix the code, or raise "
        "spec.failurePolicy.budgets.userCodeError."
    )
