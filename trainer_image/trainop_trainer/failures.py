"""Failure classes, the classifier of a worker's exception or of Ray's error text, and the budgets.

The classes are ``trainop.api.operator_status.FailureReason``'s values (the operator's enum, issue #17), as
plain strings: they travel in status records and Ray messages.

- ``classify_exception(exc)``: what a worker's training function raised -> ``Failure``: torch.distributed /
  NCCL / gloo errors and collective timeouts -> NCCLError; torch's out of memory -> OOMKilled;
  ``WorkerPreempted`` -> Preempted; anything else -> UserCodeError, with the exception's type, message and
  the innermost frame of the user's code ("ValueError: bad shape at model.py:42 (forward)").
- ``classify_text(text)``: Ray's error when no worker could say (a worker process that died): exit code 137
  or Ray's OOM errors -> OOMKilled, the distributed errors above -> NCCLError, else Unknown.
- ``FAST_RECOVERY``: the classes the driver may restart inside an attempt (pods kept); ``budget(policy,
  reason)``: spec.failurePolicy.budgets of a class.

It must not decide whether to restart (``ray_train``'s driver does) nor know about Ray or status sinks.
"""

from __future__ import annotations

import dataclasses
import os
import re
import traceback
from typing import Any

from trainop.api import trainingjob
from trainop.api.operator_status import FailureReason

# The values of trainop.api.operator_status.FailureReason (issue #17's contract).
PREEMPTED = FailureReason.PREEMPTED.value
NODE_LOST = FailureReason.NODE_LOST.value
OOM_KILLED = FailureReason.OOM_KILLED.value
STALLED = FailureReason.STALLED.value
NCCL_ERROR = FailureReason.NCCL_ERROR.value
USER_CODE_ERROR = FailureReason.USER_CODE_ERROR.value
INFRA_ERROR = FailureReason.INFRA_ERROR.value
INVALID_SPEC = FailureReason.INVALID_SPEC.value
UNKNOWN = FailureReason.UNKNOWN.value
REASONS = (
    PREEMPTED,
    NODE_LOST,
    OOM_KILLED,
    STALLED,
    NCCL_ERROR,
    USER_CODE_ERROR,
    INFRA_ERROR,
    INVALID_SPEC,
    UNKNOWN,
)
# Restarted inside the attempt, on the pods that are there (never NodeLost/Preempted: the pod goes away;
# never InfraError/InvalidSpec: a restart cannot help). Unknown too: a worker process that died without a
# word was restarted by Ray Train before issue #17, and its own budget bounds it.
FAST_RECOVERY = frozenset({USER_CODE_ERROR, STALLED, NCCL_ERROR, OOM_KILLED, UNKNOWN})
# When several ranks report at once, the cause wins over its consequences: a stall or a user's exception
# on one rank shows up as a broken collective on the others.
PRIORITY = (STALLED, OOM_KILLED, USER_CODE_ERROR, PREEMPTED, NCCL_ERROR, UNKNOWN)

_BUDGET_FIELDS = {
    PREEMPTED: "preempted",
    NODE_LOST: "node_lost",
    OOM_KILLED: "oom_killed",
    STALLED: "stalled",
    NCCL_ERROR: "nccl_error",
    USER_CODE_ERROR: "user_code_error",
    INFRA_ERROR: "infra_error",
    INVALID_SPEC: "invalid_spec",
    UNKNOWN: "unknown",
}

# torch.distributed's error types (DistError and its subclasses DistBackendError, DistNetworkError,
# DistStoreError), NCCL's and gloo's texts, and collective timeouts.
_DIST_TYPES = ("DistError", "DistBackendError", "DistNetworkError", "DistStoreError")
_DIST_TEXT = re.compile(
    r"NCCL (error|WARN|communicator)|ncclInternalError|ncclUnhandledCudaError|ncclSystemError|"
    r"ncclRemoteError|ProcessGroupNCCL|ProcessGroupGloo|\[gloo/|gloo::|Gloo connectFullMesh|"
    r"Connection closed by peer|Connection reset by peer|Watchdog caught collective operation timeout|"
    r"collective operation timeout|Timed out waiting .*for (the )?(collective|store|recv|send)|"
    r"c10d|torch\.distributed",
    re.IGNORECASE,
)
# Ray's own memory monitor (ray.exceptions.OutOfMemoryError) and an exit status of 137 (SIGKILL, the OOM
# killer's). Not Ray's generic hint on every dead worker ("Some common causes include: (1) the process was
# killed by the OOM killer ..."): a kernel OOM kill of one worker process reads like any other death there.
_OOM_TEXT = re.compile(
    r"OutOfMemoryError|running low on memory|killed by the memory monitor|exit(ed)? (with )?code:? 137",
    re.IGNORECASE,
)
_RAY_EXIT = re.compile(r"Worker exit type: \w+ Worker exit detail: [^.]*\.")
# Frames that are not the user's: the trainer's own plumbing, torch, Ray, the standard library.
_NOT_USER = (
    os.sep + "torch" + os.sep,
    os.sep + "ray" + os.sep,
    os.sep + "trainop_trainer" + os.sep + "runtime.py",
    os.sep + "trainop_trainer" + os.sep + "ray_train.py",
    os.sep + "trainop_trainer" + os.sep + "user.py",
    os.path.dirname(os.__file__) + os.sep,
)


@dataclasses.dataclass(frozen=True)
class Failure:
    reason: str
    message: str  # one sentence
    rank: int | None = None
    step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Failure:
        return cls(
            reason=str(data["reason"]),
            message=str(data["message"]),
            rank=data.get("rank"),
            step=data.get("step"),
        )


def _first_line(text: str, limit: int = 300) -> str:
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def user_frame(tb: Any) -> str | None:
    """``file.py:42 (function)`` of the innermost frame of ``tb`` that is the user's (or the built-in
    workload's) code rather than torch's, Ray's, the standard library's or the trainer's plumbing."""
    chosen: traceback.FrameSummary | None = None
    frames = traceback.extract_tb(tb)
    for frame in frames:
        if not any(part in frame.filename for part in _NOT_USER):
            chosen = frame
    if chosen is None and frames:
        chosen = frames[-1]
    if chosen is None:
        return None
    return f"{os.path.basename(chosen.filename)}:{chosen.lineno} ({chosen.name})"


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def is_distributed_error(exc: BaseException) -> bool:
    for link in _chain(exc):
        if any(cls.__name__ in _DIST_TYPES for cls in type(link).__mro__):
            return True
        if _DIST_TEXT.search(f"{type(link).__name__}: {link}"):
            return True
    return False


def classify_exception(exc: BaseException, *, rank: int | None = None, step: int | None = None) -> Failure:
    """The class of what a worker's training function raised (see the module docstring)."""
    name = type(exc).__name__
    text = _first_line(str(exc))
    where = user_frame(exc.__traceback__)
    at = f" at {where}" if where else ""
    if name == "WorkerPreempted":
        return Failure(PREEMPTED, text or "another worker received SIGTERM", rank, step)
    if any(type(link).__name__ == "OutOfMemoryError" for link in _chain(exc)):
        message = f"{name}: {text}{at}; lower spec.hyperparameters.batchSizePerWorker (or use auto)"
        return Failure(OOM_KILLED, message, rank, step)
    if is_distributed_error(exc):
        return Failure(NCCL_ERROR, f"{name}: {text}{at}", rank, step)
    return Failure(USER_CODE_ERROR, f"{name}: {text}{at}", rank, step)


def classify_text(text: str) -> Failure:
    """The class of Ray's error when no worker said what happened (a worker process died)."""
    exit_detail = _RAY_EXIT.search(text)
    line = exit_detail.group(0) if exit_detail else _first_line(text)
    if _OOM_TEXT.search(text):
        return Failure(OOM_KILLED, f"a worker was killed for memory: {line}; lower batchSizePerWorker")
    if _DIST_TEXT.search(text):
        return Failure(NCCL_ERROR, line)
    return Failure(UNKNOWN, line or "the worker group failed without an error message")


def choose(reports: list[Failure]) -> Failure | None:
    """The cause among several ranks' reports (``PRIORITY``; the first reported within a class)."""
    ranked = sorted(
        enumerate(reports),
        key=lambda item: (PRIORITY.index(item[1].reason) if item[1].reason in PRIORITY else 99, item[0]),
    )
    return ranked[0][1] if ranked else None


def budget(policy: trainingjob.FailurePolicy, reason: str) -> int:
    return int(getattr(policy.budgets, _BUDGET_FIELDS.get(reason, "unknown")))


def budget_field(reason: str) -> str:
    """The spec field of a class's budget as a user writes it: spec.failurePolicy.budgets.userCodeError."""
    parts = _BUDGET_FIELDS.get(reason, "unknown").split("_")
    return "spec.failurePolicy.budgets." + parts[0] + "".join(p.title() for p in parts[1:])


def decide(
    failure: Failure,
    *,
    used: int,
    allowed: int,
    restarts: int,
    max_worker_failures: int,
    stopping: bool,
    generation: int | None = None,
) -> dict[str, Any]:
    """The restart decision on ``failure`` as the driver records it (``why`` empty: restart the group), with
    the counts after it: ``restarts`` of this attempt and ``used`` of the failure's class."""
    why = ""  # restart the group, unless:
    if failure.reason not in FAST_RECOVERY:
        why = f"{failure.reason} is not restarted inside an attempt"
    elif stopping:
        why = "the driver is stopping"
    elif restarts >= max_worker_failures:
        limit = f"spec.failurePolicy.maxWorkerFailures ({max_worker_failures})"
        why = f"{restarts} in-attempt restart{_s(restarts)} used up {limit}"
    elif used >= allowed:
        why = f"{used} {failure.reason} failure{_s(used)} used up {budget_field(failure.reason)} ({allowed})"
    step = 0 if why else 1
    return {
        "failure": failure.to_dict(),
        "why": why,
        "generation": generation,
        "restarts": restarts + step,
        "used": used + step,
        "allowed": allowed,
    }


def _s(count: int) -> str:
    return "" if count == 1 else "s"
