"""Pod status as the kubelet computes it: pure functions from the pod spec and container states.

Owns the phase rules (a port of the kubelet's ``getPhase``: init containers first, then the counts of
running, waiting and stopped app containers against ``restartPolicy``), the conditions
(PodReadyToStartContainers, Initialized, ContainersReady, Ready with readiness gates, PodScheduled) with
their reasons and messages, transition times that move only when a status flips, and the
``containerStatuses`` dicts. The pod worker owns the container records and calls these; nothing here does
I/O, so the table tests in ``test_status.py`` pin the rules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

JSON = dict[str, Any]

PENDING, RUNNING, SUCCEEDED, FAILED = "Pending", "Running", "Succeeded", "Failed"
TERMINAL_PHASES = (SUCCEEDED, FAILED)


@dataclasses.dataclass(kw_only=True)
class ContainerRecord:
    """What the agent knows of one container (init or app); mirrors a ``containerStatuses`` entry."""

    name: str
    image: str
    is_init: bool = False
    restart_count: int = 0
    #: ``{"waiting": {...}}`` | ``{"running": {...}}`` | ``{"terminated": {...}}``, API shape.
    state: JSON = dataclasses.field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: JSON = dataclasses.field(default_factory=dict)
    ready: bool = False
    started: bool = False
    container_id: str = ""
    image_id: str = ""

    @property
    def running(self) -> bool:
        return "running" in self.state

    @property
    def terminated(self) -> JSON | None:
        terminated: JSON | None = self.state.get("terminated")
        return terminated

    @property
    def waiting(self) -> JSON | None:
        waiting: JSON | None = self.state.get("waiting")
        return waiting

    @property
    def ever_terminated(self) -> JSON | None:
        """The current termination, else the last one (a container waiting to restart)."""
        terminated: JSON | None = self.terminated or self.last_state.get("terminated")
        return terminated

    def to_status(self) -> JSON:
        status: JSON = {
            "name": self.name,
            "image": self.image,
            "imageID": self.image_id,
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.container_id:
            status["containerID"] = self.container_id
        return status


def pod_phase(*, restart_policy: str, init: Sequence[ContainerRecord], app: Sequence[ContainerRecord]) -> str:
    """The kubelet's ``getPhase`` for a pod that is not being torn down."""
    pending_init = failed_init = 0
    for record in init:
        if record.running:
            pending_init += 1
        elif (terminated := record.terminated) is not None:
            failed_init += int(terminated["exitCode"] != 0)
        elif (last := record.last_state.get("terminated")) is not None:
            failed_init += int(last["exitCode"] != 0)
        else:
            pending_init += 1
    running = waiting = stopped = succeeded = 0
    for record in app:
        if record.running:
            running += 1
        elif (terminated := record.terminated) is not None:
            stopped += 1
            succeeded += int(terminated["exitCode"] == 0)
        elif record.last_state.get("terminated") is not None:
            stopped += 1
        else:
            waiting += 1
    if failed_init and restart_policy == "Never":
        return FAILED
    if pending_init or waiting:
        return PENDING
    if running:
        return RUNNING
    if stopped:
        if restart_policy == "Always":
            return RUNNING
        if stopped == succeeded:
            return SUCCEEDED
        if restart_policy == "Never":
            return FAILED
        return RUNNING
    return PENDING


def _condition(kind: str, ok: bool, reason: str = "", message: str = "") -> JSON:
    condition: JSON = {"type": kind, "status": "True" if ok else "False"}
    if not ok and reason:
        condition["reason"] = reason
    if not ok and message:
        condition["message"] = message
    return condition


def pod_conditions(
    *,
    phase: str,
    sandbox_ready: bool,
    init: Sequence[ContainerRecord],
    app: Sequence[ContainerRecord],
    readiness_gates: Sequence[str] = (),
    existing: Sequence[JSON] = (),
) -> list[JSON]:
    """The kubelet-owned conditions, without transition times (see :func:`with_transition_times`)."""
    incomplete = [r.name for r in init if not (r.terminated and r.terminated["exitCode"] == 0)]
    initialized = _condition(
        "Initialized",
        not incomplete,
        "ContainersNotInitialized",
        f"containers with incomplete status: [{' '.join(incomplete)}]",
    )
    terminal = phase in TERMINAL_PHASES
    unready = [r.name for r in app if not r.ready]
    if terminal:
        containers_ready = _condition("ContainersReady", False, "PodCompleted")
        ready = _condition("Ready", False, "PodCompleted")
        if not incomplete:
            initialized["reason"] = "PodCompleted"
    else:
        containers_ready = _condition(
            "ContainersReady",
            not unready,
            "ContainersNotReady",
            f"containers with unready status: [{' '.join(unready)}]",
        )
        statuses = {c["type"]: c.get("status") for c in existing}
        gates_false = [gate for gate in readiness_gates if statuses.get(gate) != "True"]
        if unready:
            ready = _condition(
                "Ready", False, "ContainersNotReady", f"containers with unready status: [{' '.join(unready)}]"
            )
        elif gates_false:
            ready = _condition(
                "Ready",
                False,
                "ReadinessGatesNotReady",
                f'corresponding condition of pod readiness gate "{gates_false[0]}" does not exist.',
            )
        else:
            ready = _condition("Ready", True)
    return [
        _condition("PodReadyToStartContainers", sandbox_ready),
        initialized,
        ready,
        containers_ready,
        _condition("PodScheduled", True),
    ]


def with_transition_times(conditions: Sequence[JSON], previous: Mapping[str, JSON], now: str) -> list[JSON]:
    """Carry ``lastTransitionTime`` over from ``previous`` (by type) unless the status changed."""
    result = []
    for condition in conditions:
        before = previous.get(condition["type"])
        stamp = (
            before.get("lastTransitionTime")
            if before and before.get("status") == condition["status"]
            else None
        )
        result.append({**condition, "lastProbeTime": None, "lastTransitionTime": stamp or now})
    return result


def terminated_state(
    *,
    exit_code: int,
    reason: str,
    started_at: str,
    finished_at: str,
    container_id: str,
    message: str = "",
    signal: int | None = None,
) -> JSON:
    terminated: JSON = {
        "exitCode": exit_code,
        "reason": reason,
        "startedAt": started_at,
        "finishedAt": finished_at,
        "containerID": container_id,
    }
    if message:
        terminated["message"] = message
    if signal:
        terminated["signal"] = signal
    return {"terminated": terminated}


def exit_reason(*, exit_code: int, oom_killed: bool) -> str:
    """Completed / OOMKilled / Error, as containerd reports them."""
    if exit_code == 0:
        return "Completed"
    return "OOMKilled" if oom_killed else "Error"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Adopted:
    """What a pod worker starts from (see :func:`adopt`)."""

    records: dict[str, ContainerRecord]
    #: Containers that terminated and wait for the restart policy's decision.
    awaiting_restart: frozenset[str]
    terminal: bool
    start_time: str
    conditions: dict[str, JSON]


LOST_ON_RESTART = "the node agent restarted; the container's processes were killed"


def adopt(pod: JSON, *, now: str) -> Adopted:
    """Container records for a pod the agent (re)starts working on: fresh ones for a new pod; for a pod
    with a status, its restart counts and last states, and every container it says was running recorded
    as killed (the agent's start killed all leftovers: *kill-and-report*)."""
    spec, status = pod["spec"], pod.get("status") or {}
    records: dict[str, ContainerRecord] = {}
    awaiting: set[str] = set()
    for is_init, key, status_key in (
        (True, "initContainers", "initContainerStatuses"),
        (False, "containers", "containerStatuses"),
    ):
        previous = {cs["name"]: cs for cs in status.get(status_key) or []}
        for container in spec.get(key) or []:
            record = ContainerRecord(name=container["name"], image=container["image"], is_init=is_init)
            if not is_init and spec.get("initContainers"):
                record.state = {"waiting": {"reason": "PodInitializing"}}
            records[record.name] = record
            old = previous.get(record.name)
            if old is None:
                continue
            record.restart_count = int(old.get("restartCount") or 0)
            record.last_state = old.get("lastState") or {}
            record.container_id = old.get("containerID") or ""
            state = old.get("state") or {}
            if "running" in state:
                record.state = terminated_state(
                    exit_code=137,
                    reason="Error",
                    message=LOST_ON_RESTART,
                    started_at=state["running"].get("startedAt") or now,
                    finished_at=now,
                    container_id=record.container_id,
                )
                awaiting.add(record.name)
            elif "terminated" in state:
                record.state = state
                awaiting.add(record.name)
    return Adopted(
        records=records,
        awaiting_restart=frozenset(awaiting),
        terminal=status.get("phase") in TERMINAL_PHASES,
        start_time=str(status.get("startTime") or now),
        conditions={c["type"]: c for c in status.get("conditions") or []},
    )
