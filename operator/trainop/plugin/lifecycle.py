"""``kubectl trainop suspend|resume|restart NAME``: the job's lifecycle through its spec, which the operator
acts on (it owns the RayJob; the plugin never touches it).

- ``suspend``: ``spec.suspend: true``. The operator deletes the attempt's RayJob (and with it the Ray pods);
  checkpoints stay; the phase becomes Suspended.
- ``resume``: ``spec.suspend: false``. The operator starts a new attempt, which resumes from the newest
  checkpoint (not counted as a restart).
- ``restart``: suspend, wait until the operator reports Suspended, resume: a new attempt from the newest
  checkpoint (the operator creates it once the old attempt's Ray pods have stopped, whose preStop hook may
  still be writing that checkpoint). ``--from-step S`` also waits for those pods to be gone here and sets
  the checkpoints after S aside in between (``checkpoints.set_aside``; they are renamed, not deleted), so
  the new attempt resumes from the newest checkpoint at or before S. A finished job (Succeeded, Failed)
  has no attempt to restart: the verb says how to run it again instead.

Waiting polls the object (and the pods) with ``kubectl get``; ``timeout_s`` bounds each wait.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable

from trainop.plugin import checkpoints
from trainop.plugin import kubectl as kubectl_module
from trainop.plugin import target as target_module

FINISHED = ("Succeeded", "Failed")


class LifecycleError(target_module.TargetError):
    pass


def set_suspend(
    client: kubectl_module.Kubectl, target: target_module.Target, *, suspend: bool
) -> tuple[target_module.Target, bool]:
    """Patch ``spec.suspend``; returns the object after the patch and whether it changed anything."""
    if bool((target.body.get("spec") or {}).get("suspend")) == suspend:
        return target, False
    if target.phase in FINISHED:
        raise LifecycleError(
            f"{target.describe()} has {target.phase}: a finished {target.kind.kind} cannot be "
            f"{'suspended' if suspend else 'resumed'}"
        )
    body = client.merge_patch(target.resource, target.name, {"spec": {"suspend": suspend}})
    return target_module.Target(kind=target.kind, body=body), True


def wait_for(
    client: kubectl_module.Kubectl,
    target: target_module.Target,
    until: Callable[[target_module.Target], bool],
    *,
    what: str,
    timeout_s: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> target_module.Target:
    deadline = clock() + timeout_s
    current = target
    while not until(current):
        if clock() >= deadline:
            raise LifecycleError(
                f"{target.describe()}: {what} did not happen within {timeout_s:.0f} s (phase "
                f"{current.phase}); is the trainop operator running? kubectl trainop status shows where it "
                "stands"
            )
        sleep(1.0)
        body = client.get(target.resource, target.name)
        if body is None:
            raise LifecycleError(f"{target.describe()} was deleted while waiting for {what}")
        current = target_module.Target(kind=target.kind, body=body)
    return current


def restart(
    client: kubectl_module.Kubectl,
    target: target_module.Target,
    *,
    from_step: int | None,
    timeout_s: float,
    say: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> target_module.Target:
    if target.phase in FINISHED:
        raise LifecycleError(
            f"{target.describe()} has {target.phase}, so there is no attempt to restart; to train on from "
            "its checkpoints, delete it and apply its manifest again: the checkpoint claim stays (unless "
            "checkpoint.storage.deleteWithJob is true) and the new job resumes from it"
        )
    if from_step is not None and not target.kind.reports_workers:
        raise LifecycleError(
            "--from-step applies to TrainingJobs; a TuningSweep resumes its trials by itself"
        )
    before = target.attempt
    target, changed = set_suspend(client, target, suspend=True)
    if changed:
        say(f"suspending {target.describe()} (attempt {before})")
    target = wait_for(
        client,
        target,
        lambda t: t.phase == "Suspended",
        what="phase Suspended",
        timeout_s=timeout_s,
        sleep=sleep,
        clock=clock,
    )
    if from_step is not None:
        _wait_pods_gone(client, target, timeout_s=timeout_s, sleep=sleep, clock=clock)
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
        result = checkpoints.set_aside(
            client, target, step=from_step, stamp=stamp, timeout_s=timeout_s, sleep=sleep
        )
        moved = ", ".join(str(s) for s in result.get("setAside", [])) or "none"
        renamed = f"step_<N>{checkpoints.SET_ASIDE_SUFFIX}{stamp}"
        say(
            f"checkpoints after step {from_step} set aside (renamed {renamed}): {moved}; the next attempt "
            f"resumes from step {result.get('resume')}"
        )
    target, _ = set_suspend(client, target, suspend=False)
    say(f"resuming {target.describe()}: the operator starts a new attempt from the newest checkpoint")
    return wait_for(
        client,
        target,
        lambda t: t.phase not in ("Suspended",) and t.attempt > before,
        what="a new attempt",
        timeout_s=timeout_s,
        sleep=sleep,
        clock=clock,
    )


def _wait_pods_gone(
    client: kubectl_module.Kubectl,
    target: target_module.Target,
    *,
    timeout_s: float,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> None:
    """No Ray pod of the job may write checkpoints while they are set aside."""
    selector = f"{target.kind.owner_label}={target.name}"
    deadline = clock() + timeout_s
    while pods := [
        p
        for p in client.list("pods", selector=selector)
        if "ray.io/node-type" in p["metadata"].get("labels", {})
    ]:
        if clock() >= deadline:
            names = ", ".join(p["metadata"]["name"] for p in pods)
            raise LifecycleError(
                f"the Ray pods of {target.describe()} are still there after {timeout_s:.0f} s: {names}"
            )
        sleep(1.0)
