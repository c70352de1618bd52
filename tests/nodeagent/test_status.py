"""Pod phase and conditions as the kubelet computes them (``status.py``)."""

from __future__ import annotations

import pytest

from tests.nodeagent import status
from tests.nodeagent.status import ContainerRecord


def _record(
    state: str, exit_code: int = 0, *, last_exit: int | None = None, init: bool = False
) -> ContainerRecord:
    record = ContainerRecord(name=f"c-{state}-{exit_code}", image="i", is_init=init)
    if state == "running":
        record.state = {"running": {"startedAt": "t"}}
    elif state == "terminated":
        record.state = {"terminated": {"exitCode": exit_code, "reason": "x"}}
    else:
        record.state = {"waiting": {"reason": state}}
    if last_exit is not None:
        record.last_state = {"terminated": {"exitCode": last_exit}}
    return record


@pytest.mark.parametrize(
    ("policy", "init", "app", "phase"),
    [
        ("Always", [], [_record("ContainerCreating")], "Pending"),
        ("Always", [], [_record("running")], "Running"),
        ("Always", [], [_record("terminated", 0)], "Running"),  # will be restarted
        ("Always", [], [_record("CrashLoopBackOff", last_exit=1)], "Running"),
        ("Never", [], [_record("terminated", 0)], "Succeeded"),
        ("Never", [], [_record("terminated", 2)], "Failed"),
        ("Never", [], [_record("terminated", 0), _record("running")], "Running"),
        ("Never", [], [_record("terminated", 0), _record("terminated", 1)], "Failed"),
        ("OnFailure", [], [_record("terminated", 0)], "Succeeded"),
        ("OnFailure", [], [_record("terminated", 1)], "Running"),
        ("Never", [_record("running", init=True)], [_record("PodInitializing")], "Pending"),
        ("Never", [_record("terminated", 1, init=True)], [_record("PodInitializing")], "Failed"),
        ("OnFailure", [_record("terminated", 1, init=True)], [_record("PodInitializing")], "Pending"),
        ("Always", [_record("terminated", 0, init=True)], [_record("ErrImagePull")], "Pending"),
        ("Always", [_record("terminated", 0, init=True)], [_record("running")], "Running"),
    ],
)
def test_phase_follows_the_kubelets_getphase(
    policy: str, init: list[ContainerRecord], app: list[ContainerRecord], phase: str
) -> None:
    assert status.pod_phase(restart_policy=policy, init=init, app=app) == phase


def _conditions(**kwargs: object) -> dict[str, dict[str, object]]:
    conditions = status.pod_conditions(**kwargs)  # type: ignore[arg-type]
    return {str(c["type"]): c for c in conditions}


def test_ready_needs_every_container_ready_and_names_the_unready_ones() -> None:
    ready, unready = _record("running"), _record("running")
    ready.ready = True
    unready.name = "slow"
    conditions = _conditions(phase="Running", sandbox_ready=True, init=[], app=[ready, unready])
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Ready"]["message"] == "containers with unready status: [slow]"
    assert conditions["ContainersReady"]["status"] == "False"
    assert conditions["PodReadyToStartContainers"]["status"] == "True"
    unready.ready = True
    conditions = _conditions(phase="Running", sandbox_ready=True, init=[], app=[ready, unready])
    assert conditions["Ready"]["status"] == conditions["ContainersReady"]["status"] == "True"


def test_readiness_gates_hold_ready_back_until_their_condition_is_true() -> None:
    app = _record("running")
    app.ready = True
    kwargs = {
        "phase": "Running",
        "sandbox_ready": True,
        "init": [],
        "app": [app],
        "readiness_gates": ["x/ok"],
    }
    assert _conditions(**kwargs)["Ready"]["reason"] == "ReadinessGatesNotReady"
    gated = _conditions(**kwargs, existing=[{"type": "x/ok", "status": "True"}])
    assert gated["Ready"]["status"] == "True"
    assert gated["ContainersReady"]["status"] == "True"


def test_initialized_waits_for_every_init_container_and_completed_pods_are_not_ready() -> None:
    first, second = _record("terminated", 0, init=True), _record("running", init=True)
    second.name = "second"
    conditions = _conditions(phase="Pending", sandbox_ready=True, init=[first, second], app=[_record("x")])
    assert conditions["Initialized"]["message"] == "containers with incomplete status: [second]"
    done = _conditions(phase="Succeeded", sandbox_ready=False, init=[first], app=[_record("terminated")])
    assert done["Initialized"]["status"] == "True"
    assert done["Ready"]["reason"] == done["ContainersReady"]["reason"] == "PodCompleted"


def test_transition_times_move_only_when_a_status_flips() -> None:
    before = {"Ready": {"type": "Ready", "status": "False", "lastTransitionTime": "t0"}}
    same = status.with_transition_times([{"type": "Ready", "status": "False"}], before, "t1")
    flipped = status.with_transition_times([{"type": "Ready", "status": "True"}], before, "t1")
    assert same[0]["lastTransitionTime"] == "t0"
    assert flipped[0]["lastTransitionTime"] == "t1"


@pytest.mark.parametrize(
    ("exit_code", "oom", "reason"), [(0, False, "Completed"), (1, False, "Error"), (137, True, "OOMKilled")]
)
def test_exit_reasons_are_containerds(exit_code: int, oom: bool, reason: str) -> None:
    assert status.exit_reason(exit_code=exit_code, oom_killed=oom) == reason


def test_adopting_a_pod_after_an_agent_restart_reports_its_running_containers_killed() -> None:
    pod = {
        "spec": {
            "initContainers": [{"name": "init", "image": "i"}],
            "containers": [{"name": "app", "image": "i"}],
        },
        "status": {
            "phase": "Running",
            "startTime": "t0",
            "initContainerStatuses": [
                {
                    "name": "init",
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
                }
            ],
            "containerStatuses": [
                {
                    "name": "app",
                    "restartCount": 2,
                    "containerID": "c1",
                    "state": {"running": {"startedAt": "t1"}},
                }
            ],
        },
    }
    adopted = status.adopt(pod, now="t2")
    app = adopted.records["app"]
    assert app.restart_count == 2
    assert app.terminated == {
        "exitCode": 137,
        "reason": "Error",
        "message": status.LOST_ON_RESTART,
        "startedAt": "t1",
        "finishedAt": "t2",
        "containerID": "c1",
    }
    assert adopted.awaiting_restart == {"app", "init"}
    assert adopted.records["init"].terminated == {"exitCode": 0, "reason": "Completed"}
    assert (adopted.terminal, adopted.start_time) == (False, "t0")


def test_a_new_pod_starts_with_waiting_containers() -> None:
    pod = {
        "spec": {"initContainers": [{"name": "i", "image": "x"}], "containers": [{"name": "a", "image": "x"}]}
    }
    adopted = status.adopt(pod, now="t")
    assert adopted.records["i"].waiting == {"reason": "ContainerCreating"}
    assert adopted.records["a"].waiting == {"reason": "PodInitializing"}
    assert not adopted.awaiting_restart and not adopted.terminal
