"""The operator killed with SIGKILL at every step of a run-fail-restart-succeed flow, then restarted:
no duplicate children, no lost or double-counted failure, the same outcome as without the crash.

Kills between steps are plain SIGKILLs of the process; kills inside a reconcile (status written but
not yet acted on) use failpoints (``trainop.controller.failpoints``): the operator SIGKILLs itself at a
named point. Each test runs its own namespace-scoped operator (``dedicated_operator``).
KubeRay's part is played by its stand-in (``kuberay_standin``, the tier's only mock): it writes the RayJob
statuses KubeRay would (Running, Failed with Ray's message, Succeeded) at each step of the flow.
"""

from __future__ import annotations

from typing import Any

import operator_factories as factories
import pytest
from cluster_api import Api, wait_for
from operator_process import OperatorProcess, wait_until_dead

from trainop.controller import observe

pytestmark = pytest.mark.controlplane

SIGKILLED = -9


class Flow:
    """One job's flow, observed through the API only."""

    def __init__(self, api: Api, kuberay: Any, apply: Any, namespace: str, operator: OperatorProcess) -> None:
        self.api, self.kuberay, self.apply, self.ns, self.operator = api, kuberay, apply, namespace, operator

    def start_operator(self, failpoints: str = "") -> None:
        self.operator.start(namespaces=[self.ns], failpoints=failpoints)

    def crash_at(self, failpoints: str) -> None:
        """Restart the operator armed with ``failpoints`` and wait for it to kill itself there."""
        if self.operator.running:
            self.operator.kill()
        self.start_operator(failpoints)

    def wait_crashed(self) -> None:
        assert wait_until_dead(self.operator) == SIGKILLED, self.operator.log_tail()

    def status(self) -> dict[str, Any]:
        body = self.api.get(self.api.job(self.ns, "mlp"))
        assert body is not None
        return body.get("status") or {}

    def wait_phase(self, phase: str, timeout_s: float = 20) -> dict[str, Any]:
        return wait_for(
            self.status, lambda s: s.get("phase") == phase, timeout_s=timeout_s, what=f"phase {phase}"
        )

    def ray_jobs(self) -> list[str]:
        items = self.api.list(self.api.ray_jobs(self.ns), "trainop.dev/job=mlp")
        return sorted(r["metadata"]["name"] for r in items if not r["metadata"].get("deletionTimestamp"))

    def wait_ray_jobs(self, names: list[str]) -> None:
        wait_for(self.ray_jobs, lambda found: found == names, what=f"RayJobs {names}")

    def finish_successfully(self, attempt: int) -> dict[str, Any]:
        name = f"mlp-a{attempt}"
        self.wait_ray_jobs([name])
        self.kuberay.run(self.ns, name)
        self.wait_phase("Running")
        self.kuberay.succeed(self.ns, name)
        return self.wait_phase("Succeeded")

    def assert_one_of_each_child(self) -> None:
        selector = "trainop.dev/job=mlp"
        counts = {
            "configmaps": len(self.api.list(self.api.core(self.ns, "configmaps"), selector)),
            "persistentvolumeclaims": len(
                self.api.list(self.api.core(self.ns, "persistentvolumeclaims"), selector)
            ),
            "serviceaccounts": len(self.api.list(self.api.core(self.ns, "serviceaccounts"), selector)),
            "roles": len(self.api.list(self.api.rbac(self.ns, "roles"), selector)),
            "rolebindings": len(self.api.list(self.api.rbac(self.ns, "rolebindings"), selector)),
        }
        assert counts == dict.fromkeys(counts, 1)

    def phase_events(self) -> list[str]:
        events = self.api.list(f"/api/v1/namespaces/{self.ns}/events")
        ours = [e for e in events if e["involvedObject"]["name"] == "mlp"]
        return [
            e["reason"]
            for e in sorted(
                ours, key=lambda e: (e["metadata"]["creationTimestamp"], e["metadata"]["resourceVersion"])
            )
        ]


@pytest.fixture
def flow(api: Api, kuberay: Any, apply: Any, namespace: str, dedicated_operator: OperatorProcess) -> Any:
    yield Flow(api, kuberay, apply, namespace, dedicated_operator)
    if dedicated_operator.running:
        dedicated_operator.kill()


def test_killed_after_writing_pending_but_before_creating_the_rayjob(flow: Flow) -> None:
    flow.start_operator("status-written:Pending")
    flow.apply(factories.manifest("mlp", flow.ns))
    flow.wait_crashed()
    assert flow.status()["phase"] == "Pending" and flow.status()["attempt"] == 1
    assert flow.ray_jobs() == []

    flow.start_operator()
    status = flow.finish_successfully(attempt=1)
    assert (status["attempt"], status["restarts"]) == (1, 0)
    flow.assert_one_of_each_child()


def test_killed_right_after_creating_the_rayjob(flow: Flow) -> None:
    flow.start_operator("ray-job-created")
    flow.apply(factories.manifest("mlp", flow.ns))
    flow.wait_crashed()
    assert flow.ray_jobs() == ["mlp-a1"]

    flow.start_operator()
    status = flow.finish_successfully(attempt=1)
    assert (status["attempt"], status["restarts"]) == (1, 0)
    flow.assert_one_of_each_child()


def test_killed_after_recording_a_failure_but_before_deleting_the_failed_rayjob(flow: Flow) -> None:
    flow.start_operator()
    flow.apply(factories.manifest("mlp", flow.ns))
    flow.wait_ray_jobs(["mlp-a1"])
    flow.kuberay.run(flow.ns, "mlp-a1")
    flow.wait_phase("Running")

    flow.crash_at("status-written:Restarting")
    flow.kuberay.fail(flow.ns, "mlp-a1", message="NCCL timeout")
    flow.wait_crashed()
    assert flow.status()["phase"] == "Restarting"
    assert flow.ray_jobs() == ["mlp-a1"]  # recorded, not yet acted on

    flow.start_operator()
    status = flow.finish_successfully(attempt=2)
    assert (status["attempt"], status["restarts"]) == (2, 1)
    assert [(f["attempt"], f["reason"], f["message"]) for f in status["failures"]] == [
        (1, "NCCLError", "AppFailed: NCCL timeout")
    ]
    assert flow.phase_events().count("Restarting") == 1
    flow.assert_one_of_each_child()


def test_killed_after_deleting_the_failed_rayjob(flow: Flow) -> None:
    flow.start_operator()
    flow.apply(factories.manifest("mlp", flow.ns))
    flow.wait_ray_jobs(["mlp-a1"])
    flow.kuberay.run(flow.ns, "mlp-a1")
    flow.wait_phase("Running")

    flow.crash_at("ray-job-deleted")
    flow.kuberay.fail(flow.ns, "mlp-a1")
    flow.wait_crashed()

    flow.start_operator()
    status = flow.finish_successfully(attempt=2)
    assert (status["attempt"], status["restarts"], len(status["failures"])) == (2, 1, 1)


@pytest.mark.parametrize("point", ["status-written:Pending", "ray-job-created"])
def test_killed_while_starting_the_next_attempt_counts_the_restart_once(flow: Flow, point: str) -> None:
    flow.start_operator()
    flow.apply(factories.manifest("mlp", flow.ns))
    flow.wait_ray_jobs(["mlp-a1"])
    flow.kuberay.run(flow.ns, "mlp-a1")
    flow.wait_phase("Running")

    flow.crash_at(point)  # the next Pending write / RayJob creation is attempt 2's
    flow.kuberay.fail(flow.ns, "mlp-a1")
    flow.wait_crashed()
    assert (flow.status()["attempt"], flow.status()["restarts"]) == (2, 1)

    flow.start_operator()
    status = flow.finish_successfully(attempt=2)
    assert (status["attempt"], status["restarts"], len(status["failures"])) == (2, 1, 1)
    assert flow.phase_events().count("Restarting") == 1
    flow.assert_one_of_each_child()


def test_a_failure_that_happens_while_the_operator_is_down_is_found_on_restart(flow: Flow) -> None:
    flow.start_operator()
    flow.apply(factories.manifest("mlp", flow.ns))
    flow.wait_ray_jobs(["mlp-a1"])
    flow.kuberay.run(flow.ns, "mlp-a1")
    flow.wait_phase("Running")

    flow.operator.kill()
    flow.kuberay.fail(flow.ns, "mlp-a1", message="lost the head node")
    flow.start_operator()

    status = flow.finish_successfully(attempt=2)
    assert (status["attempt"], status["restarts"]) == (2, 1)
    assert [(f["reason"], f["message"]) for f in status["failures"]] == [
        ("Unknown", "AppFailed: lost the head node")
    ]
    flow.assert_one_of_each_child()


def test_a_restart_backoff_survives_an_operator_restart_and_is_neither_skipped_nor_repeated(
    flow: Flow,
) -> None:
    flow.start_operator()
    backoff = {"failurePolicy": {"backoffSeconds": 4, "maxBackoffSeconds": 4}}
    flow.apply(factories.manifest("mlp", flow.ns, spec=backoff))
    flow.wait_ray_jobs(["mlp-a1"])
    flow.kuberay.run(flow.ns, "mlp-a1")
    flow.kuberay.fail(flow.ns, "mlp-a1")
    status = flow.wait_phase("Restarting")
    due = observe.parse_time(status["nextRestartTime"])
    assert due is not None

    flow.operator.kill()
    flow.start_operator()  # a fresh process: nothing in memory about the backoff
    flow.wait_ray_jobs(["mlp-a2"])
    created = flow.api.get(flow.api.ray_jobs(flow.ns, "mlp-a2"))
    assert created is not None
    started = observe.parse_time(created["metadata"]["creationTimestamp"])
    assert started is not None and started >= due

    status = flow.finish_successfully(attempt=2)
    assert (status["attempt"], status["restarts"]) == (2, 1)


def test_killed_while_running_changes_nothing(flow: Flow) -> None:
    flow.start_operator()
    flow.apply(factories.manifest("mlp", flow.ns))
    flow.wait_ray_jobs(["mlp-a1"])
    flow.kuberay.run(flow.ns, "mlp-a1")
    before = flow.wait_phase("Running")

    flow.operator.kill()
    flow.start_operator()
    after = wait_for(flow.status, lambda s: s.get("phase") == "Running", what="Running after restart")
    assert {k: after[k] for k in ("attempt", "restarts", "startTime", "children")} == {
        k: before[k] for k in ("attempt", "restarts", "startTime", "children")
    }
    assert flow.ray_jobs() == ["mlp-a1"]
    flow.kuberay.succeed(flow.ns, "mlp-a1")
    flow.wait_phase("Succeeded")
    flow.assert_one_of_each_child()
