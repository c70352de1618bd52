"""Why an attempt ended: the failure class (``FailureReason``) of a failed RayJob, from facts.

Three sources, in this order (issue #17's contract, docs/operator.md "Failures"):

1. The trainer's own account: ``status.workerFailures.last``, the entry of this attempt with
   ``restarted: false`` (the failure that ended the attempt). The trainer knows what only the process
   knows: the exception type and its last frame (UserCodeError), the stuck rank (Stalled), a failed
   collective (NCCLError).
2. What the operator saw of the attempt's Ray pods (:class:`PodFact`, from :func:`pod_facts`): a
   container terminated OOMKilled (or exit 137 under a memory limit), a pod deleted with a grace period or
   evicted (Preempted), a pod of a lost node (NodeLost), an image that cannot be pulled or a pod that
   cannot be scheduled (InfraError). A pod of a failed attempt may be gone when the RayJob reports FAILED,
   so the reconciler keeps the facts it saw while the attempt ran (``reconcile``: in memory, one attempt
   per owner, at most :data:`MAX_FACTS` facts, :func:`remember`).
3. KubeRay's RayJob: its refusal of the spec (InvalidSpec), a submission that never started
   (InfraError), a message naming NCCL or an out-of-memory error. Else Unknown.

Facts later than the RayJob's end are not causes: KubeRay deletes the Ray cluster of a failed RayJob, and
those deletions must not read as a preemption.

This module must not talk to the API or decide what happens next (``state_machine`` does).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trainop.api import trainingjob
from trainop.api.operator_status import FailureReason
from trainop.controller import observe

# Pod facts kept per owner for its current attempt: enough for every pod of a large job to have said one
# thing, small enough that a thousand jobs cost nothing. When it is full a new fact still goes in and the
# least telling one goes out (``remember``).
MAX_FACTS = 32
# ``PodFact.slot`` of a pod's PodScheduled=False/Unschedulable fact: the scheduler rewrites its message as
# nodes come and go, and only the latest one is the pod's state.
UNSCHEDULABLE_SLOT = "PodScheduled"
# Among pod facts of one attempt, the most specific cause wins (a container killed by the kernel for its
# memory says more than the pod's later deletion).
_PRECEDENCE = (
    FailureReason.OOM_KILLED,
    FailureReason.NODE_LOST,
    FailureReason.PREEMPTED,
    FailureReason.INFRA_ERROR,
)
# Container waiting reasons that mean the platform could not start the container.
_INFRA_WAITING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
# KubeRay RayJob reasons that mean the Ray job was never run by the user's code.
_INFRA_RAYJOB_REASONS = frozenset({"SubmissionFailed", "JobDeploymentStatusTransitionGracePeriodExceeded"})
_SIGKILL_EXIT = 137


@dataclasses.dataclass(frozen=True, slots=True)
class PodFact:
    """One thing a Ray pod's status or metadata showed that explains a failure."""

    reason: FailureReason
    message: str
    pod: str
    time: datetime.datetime | None = None  # when it happened, where the API says
    # Set on a fact that is the current state of one thing of its pod (UNSCHEDULABLE_SLOT): a newer fact of
    # the same pod and slot replaces it (``remember``). Empty: an event that happened, kept as it is.
    slot: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Classification:
    reason: FailureReason
    message: str
    source: str  # trainer | pods | rayjob | none


def pod_facts(pod: Mapping[str, Any]) -> tuple[PodFact, ...]:
    """The failure facts of one Ray pod, as its watch event shows it."""
    meta = pod["metadata"]
    name = str(meta["name"])
    status: Mapping[str, Any] = pod.get("status") or {}
    facts: list[PodFact] = []
    node = (pod.get("spec") or {}).get("nodeName") or "its node"

    for condition in status.get("conditions") or ():
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            why = str(condition.get("reason") or "")
            when = observe.parse_time(condition.get("lastTransitionTime"))
            text = f"pod {name}: {why or 'disrupted'}: {condition.get('message') or ''}".rstrip(": ")
            if why == "DeletionByTaintManager":
                facts.append(PodFact(FailureReason.NODE_LOST, text, name, when))
            else:
                facts.append(PodFact(FailureReason.PREEMPTED, text, name, when))
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            facts.append(
                PodFact(
                    FailureReason.INFRA_ERROR,
                    f"pod {name} cannot be scheduled: {condition.get('message') or ''}".rstrip(": "),
                    name,
                    observe.parse_time(condition.get("lastTransitionTime")),
                    slot=UNSCHEDULABLE_SLOT,
                )
            )
    pod_reason = str(status.get("reason") or "")
    if pod_reason == "Evicted":
        facts.append(
            PodFact(FailureReason.PREEMPTED, f"pod {name} was evicted: {status.get('message')}", name)
        )
    elif pod_reason == "NodeLost":
        facts.append(PodFact(FailureReason.NODE_LOST, f"pod {name}: {node} was lost (NodeLost)", name))
    elif pod_reason in ("Shutdown", "NodeShutdown", "Terminated"):
        facts.append(PodFact(FailureReason.PREEMPTED, f"pod {name}: {node} shut down ({pod_reason})", name))
    if meta.get("deletionTimestamp"):
        grace = meta.get("deletionGracePeriodSeconds")
        due = observe.parse_time(meta.get("deletionTimestamp"))
        asked = due - datetime.timedelta(seconds=int(grace or 0)) if due is not None else None
        facts.append(
            PodFact(
                FailureReason.PREEMPTED,
                f"pod {name} was deleted with a grace period of {grace if grace is not None else '?'} s",
                name,
                asked,
            )
        )
    limits = _memory_limits(pod)
    statuses = [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]
    for container in statuses:
        cname = str(container.get("name") or "")
        states = [(container.get("state") or {}), (container.get("lastState") or {})]
        for state in states:
            terminated = state.get("terminated") or {}
            if terminated:
                exit_code = terminated.get("exitCode")
                when = observe.parse_time(terminated.get("finishedAt"))
                if terminated.get("reason") == "OOMKilled":
                    facts.append(
                        PodFact(
                            FailureReason.OOM_KILLED,
                            f"pod {name} container {cname} was OOMKilled (memory limit "
                            f"{limits.get(cname, 'none')})",
                            name,
                            when,
                        )
                    )
                elif exit_code == _SIGKILL_EXIT and cname in limits and not meta.get("deletionTimestamp"):
                    # Not for a pod being deleted: its containers get SIGKILL when the grace period ends.
                    facts.append(
                        PodFact(
                            FailureReason.OOM_KILLED,
                            f"pod {name} container {cname} was killed (exit 137) under its memory limit "
                            f"{limits[cname]}",
                            name,
                            when,
                        )
                    )
            waiting = state.get("waiting") or {}
            if waiting.get("reason") in _INFRA_WAITING:
                facts.append(
                    PodFact(
                        FailureReason.INFRA_ERROR,
                        f"pod {name} container {cname}: {waiting.get('reason')}: "
                        f"{waiting.get('message') or ''}".rstrip(": "),
                        name,
                    )
                )
    return tuple(facts)


def remember(
    kept: Sequence[PodFact], seen: Iterable[PodFact], *, limit: int = MAX_FACTS
) -> tuple[PodFact, ...]:
    """``kept`` plus the facts of ``seen`` not in it yet, oldest first, at most ``limit``.

    A fact with a ``slot`` replaces the kept fact of the same pod and slot: a pod waiting for nodes is one
    Unschedulable fact, the scheduler's latest message, however often that message changed. When the list
    is full, the fact of the lowest precedence (``classify_facts``' order), the oldest of them, goes out --
    the new one only when it ranks below every kept fact. So a job that waited long for nodes still keeps
    the OOMKilled, NodeLost or Preempted fact that ends its attempt.
    """
    out = list(kept)
    for fact in seen:
        if fact in out:
            continue
        if fact.slot:
            out = [f for f in out if not (f.pod == fact.pod and f.slot == fact.slot)]
        out.append(fact)
        while len(out) > limit:
            lowest = max(_rank(f) for f in out)
            del out[next(i for i, f in enumerate(out) if _rank(f) == lowest)]
    return tuple(out)


def _rank(fact: PodFact) -> int:
    """Where the fact's class stands in ``_PRECEDENCE`` (0: the most specific); after it, any other."""
    return _PRECEDENCE.index(fact.reason) if fact.reason in _PRECEDENCE else len(_PRECEDENCE)


def where(rank: int | None, step: int | None) -> str:
    """`` (rank 1, step 42)``, `` (rank 1)`` when the rank failed before its first step, "" without a rank."""
    if rank is None:
        return ""
    return f" (rank {rank})" if step is None else f" (rank {rank}, step {step})"


def classify(
    *,
    attempt: int,
    ray: observe.RayJobObservation,
    worker_failures: trainingjob.WorkerFailures | None,
    facts: Sequence[PodFact],
) -> Classification:
    """The class of the failed attempt ``attempt`` whose RayJob is ``ray``."""
    if ray.state == observe.AttemptState.INVALID:
        return Classification(
            FailureReason.INVALID_SPEC,
            f"KubeRay refused RayJob {ray.name}: {ray.message or 'ValidationFailed'}",
            "rayjob",
        )
    entry = _ending_entry(attempt, worker_failures)
    trainers: Classification | None = None
    if entry is not None:
        trainers = Classification(
            as_reason(entry.reason), f"{entry.message}{where(entry.rank, entry.step)}", "trainer"
        )
        if trainers.reason != FailureReason.UNKNOWN:
            return trainers
    # The trainer saw a worker die without a word (Unknown): the pods may say why (OOM, a lost node).
    from_pods = classify_facts(facts, ended=ray.ended)
    if from_pods is not None:
        return from_pods
    if trainers is not None:
        return trainers
    text = f"{ray.reason}: {ray.message}" if ray.message else ray.reason
    if ray.reason in _INFRA_RAYJOB_REASONS:
        return Classification(FailureReason.INFRA_ERROR, text, "rayjob")
    if "NCCL" in ray.message:
        return Classification(FailureReason.NCCL_ERROR, text, "rayjob")
    if "OutOfMemoryError" in ray.message or "OOMKilled" in ray.message:
        return Classification(FailureReason.OOM_KILLED, text, "rayjob")
    return Classification(FailureReason.UNKNOWN, text or "the RayJob failed without a message", "none")


def classify_facts(facts: Sequence[PodFact], *, ended: datetime.datetime | None) -> Classification | None:
    """The class the pods' facts give, the most specific first; None without one. Only facts strictly before
    ``ended`` count (both in whole seconds): KubeRay deletes a failed RayJob's pods within the second it
    writes endTime, and those deletions are consequences."""
    causes = [f for f in facts if ended is None or f.time is None or f.time < ended]
    for reason in _PRECEDENCE:
        found = [f for f in causes if f.reason == reason]
        if found:
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            return Classification(reason, found[0].message + more, "pods")
    return None


def _ending_entry(
    attempt: int, worker_failures: trainingjob.WorkerFailures | None
) -> trainingjob.WorkerFailure | None:
    if worker_failures is None:
        return None
    for entry in worker_failures.last:  # newest first
        if entry.attempt == attempt and not entry.restarted:
            return entry
    return None


def as_reason(value: str) -> FailureReason:
    """The class named ``value``; Unknown for anything else (a newer trainer's class, an old record)."""
    try:
        return FailureReason(value)
    except ValueError:
        return FailureReason.UNKNOWN


def _memory_limits(pod: Mapping[str, Any]) -> dict[str, str]:
    spec: Mapping[str, Any] = pod.get("spec") or {}
    limits: dict[str, str] = {}
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        memory = ((container.get("resources") or {}).get("limits") or {}).get("memory")
        if memory:
            limits[str(container.get("name") or "")] = str(memory)
    return limits


def worker_failure_counts(worker_failures: trainingjob.WorkerFailures | None) -> Mapping[str, int]:
    return worker_failures.counts if worker_failures is not None else {}
