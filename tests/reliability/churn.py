"""A seeded churn of many TrainingJobs through every life the operator handles, and what must hold after.

Each job gets a :class:`JobPlan` from a seeded RNG: a sequence of what happens to its attempts (the Ray
job fails with a message of its own, succeeds, is suspended and resumed by its user, or the job is deleted
while it runs), ending in Succeeded, Failed (restarts exhausted) or deletion. The plan alone fixes the
outcome: final phase, attempt, restarts and the exact failure history -- however the operator's crashes,
the apiserver's restarts or injected API errors interleave with it. Jobs are created staggered, so
disruptions hit every stage.

Two actors play the world around the operator, both on watches (kube_async):

- KubeRay (``kuberay_async.KubeRayStandIn``): every new RayJob goes Initializing -> Running, then to the
  planned outcome of that attempt (or stays Running for a suspend or delete);
- the user: suspends a job when it runs the planned attempt, resumes it once Suspended, deletes it.

:func:`verify` then checks, from the API alone: every job's final status against its plan; that each
attempt's RayJob was created exactly once (the stand-in saw every RayJob and its uid) and that no attempt
number was skipped; that only the final attempt's RayJob is left; exactly one of each other child per
job; no child without a live owner (deleted jobs' children garbage-collected; the checkpoint claim is kept
by design); and one ``Restarting`` Event per restart, one final Event per job.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import enum
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import operator_factories as factories

from tests.reliability import kube_async, kuberay_async

GROUP = "/apis/trainop.dev/v1alpha1"


class Step(enum.Enum):
    FAIL = "fail"
    SUCCEED = "succeed"
    SUSPEND = "suspend"  # the user suspends the running attempt, then resumes (attempt + 1, no restart)
    DELETE = "delete"  # the user deletes the job while this attempt runs


@dataclasses.dataclass(frozen=True)
class JobPlan:
    name: str
    steps: tuple[Step, ...]  # one per attempt
    max_restarts: int
    backoff_seconds: int
    create_after_s: float
    outcome_delay_s: float

    def message(self, attempt: int) -> str:
        return f"{self.name} attempt {attempt}: NCCL watchdog timeout"

    def manifest(self, namespace: str) -> dict[str, Any]:
        policy = {
            "maxRestarts": self.max_restarts,
            "backoffSeconds": self.backoff_seconds,
            "maxBackoffSeconds": self.backoff_seconds,
            # The failures are NCCLError (the message names NCCL): maxRestarts, not the class's budget,
            # is what the churn plans count against.
            "budgets": {"ncclError": 100},
        }
        return factories.manifest(self.name, namespace, spec={"failurePolicy": policy})

    @property
    def expected(self) -> Expected:
        restarts, failures = 0, []
        for attempt, step in enumerate(self.steps, 1):
            if step == Step.SUCCEED:
                return Expected("Succeeded", attempt, restarts, tuple(failures))
            if step == Step.DELETE:
                return Expected(None, attempt, restarts, tuple(failures))
            if step == Step.FAIL:
                failures.append((attempt, "NCCLError", f"AppFailed: {self.message(attempt)}"))
                if restarts == self.max_restarts:
                    return Expected("Failed", attempt, restarts, tuple(failures))
                restarts += 1
        raise AssertionError(f"plan {self} has no end")


@dataclasses.dataclass(frozen=True)
class Expected:
    phase: str | None  # None: deleted
    attempt: int
    restarts: int
    failures: tuple[tuple[int, str, str], ...]


def plan_jobs(rng: random.Random, num_jobs: int, *, spread_s: float) -> list[JobPlan]:
    plans = []
    for i in range(num_jobs):
        max_restarts = rng.choice([0, 1, 2, 3])
        steps: list[Step] = []
        restarts = 0
        while True:
            roll = rng.random()
            if roll < 0.1 and len(steps) < 6:
                steps.append(Step.SUSPEND)
            elif roll < 0.2:
                steps.append(Step.DELETE)
                break
            elif roll < 0.6 and len(steps) < 6:
                steps.append(Step.FAIL)
                if restarts == max_restarts:
                    break
                restarts += 1
            else:
                steps.append(Step.SUCCEED)
                break
        plans.append(
            JobPlan(
                name=f"churn-{i:04d}",
                steps=tuple(steps),
                max_restarts=max_restarts,
                backoff_seconds=rng.choice([0, 1]),
                create_after_s=rng.uniform(0, spread_s),
                outcome_delay_s=rng.uniform(0, 1.5),
            )
        )
    return plans


class Churn:
    """Runs the plans against the operator; ``disrupt`` (the killer, a restarter...) runs alongside."""

    def __init__(self, api: kube_async.AsyncApi, namespace: str, plans: list[JobPlan]) -> None:
        self.api = api
        self.namespace = namespace
        self.plans = {p.name: p for p in plans}
        self.unexpected: list[str] = []  # things the world saw that no plan allows
        self.kuberay = kuberay_async.KubeRayStandIn(api, namespace, self._plan_for)
        self._finished: set[str] = set()
        self._done = asyncio.Event()
        self._acted: set[tuple[str, str, int]] = set()
        self.num_created = 0  # jobs created so far (they are created on a schedule, not all at once)

    @property
    def num_final(self) -> int:
        """Jobs that reached their end (a final phase, or deleted) so far."""
        return len(self._finished)

    def jobs_path(self, name: str = "") -> str:
        return f"{GROUP}/namespaces/{self.namespace}/trainingjobs" + (f"/{name}" if name else "")

    def _plan_for(self, rayjob: dict[str, Any]) -> kuberay_async.Plan:
        labels = rayjob["metadata"].get("labels") or {}
        plan = self.plans.get(labels.get("trainop.dev/job", ""))
        attempt = int(labels.get("trainop.dev/attempt", "0"))
        if plan is None or not 1 <= attempt <= len(plan.steps):
            self.unexpected.append(f"RayJob {rayjob['metadata']['name']} matches no planned attempt")
            return kuberay_async.Plan(kuberay_async.Outcome.HOLD)
        step = plan.steps[attempt - 1]
        if step == Step.SUCCEED:
            return kuberay_async.Plan(kuberay_async.Outcome.SUCCEED, delay_s=plan.outcome_delay_s)
        if step == Step.FAIL:
            return kuberay_async.Plan(
                kuberay_async.Outcome.FAIL, plan.message(attempt), delay_s=plan.outcome_delay_s
            )
        return kuberay_async.Plan(kuberay_async.Outcome.HOLD)

    async def run(
        self, *, timeout_s: float, disrupt: Callable[[asyncio.Event], Awaitable[None]] | None = None
    ) -> float:
        """Create every job on its schedule and play KubeRay and the users until each job is final."""
        started = time.monotonic()
        self.kuberay.start()
        user = asyncio.create_task(self._play_users(), name="churn-users")
        creator = asyncio.create_task(self._create_jobs(), name="churn-create")
        disruptor = asyncio.create_task(disrupt(self._done), name="churn-disrupt") if disrupt else None
        done = asyncio.create_task(self._done.wait())
        watched = {user, creator, *([disruptor] if disruptor else [])}
        deadline = time.monotonic() + timeout_s
        try:
            # Until every job is final; a helper task that fails (the user actions, the creation, a
            # disruptor, e.g. the operator died on its own) ends the churn at once with its error.
            while not self._done.is_set() and time.monotonic() < deadline:
                finished, _ = await asyncio.wait(
                    {done, *watched}, timeout=deadline - time.monotonic(), return_when="FIRST_COMPLETED"
                )
                for task in finished - {done}:
                    watched.discard(task)
                    if task.exception() is not None and not self._done.is_set():
                        raise task.exception()  # type: ignore[misc]
            if not self._done.is_set():
                raise AssertionError(await self._describe_stuck(timeout_s))
        finally:
            done.cancel()
            self._done.set()
            if disruptor is not None:
                await disruptor  # lets a killer leave the operator running
            await kube_async.cancel(user, creator)
            await self.kuberay.stop()
        return time.monotonic() - started

    async def _describe_stuck(self, timeout_s: float) -> str:
        missing = sorted(set(self.plans) - self._finished)
        lines = [f"{len(missing)} of {len(self.plans)} jobs not final after {timeout_s:.0f}s:"]
        rayjobs = await self.api.list(kuberay_async.rayjobs_path(self.namespace))
        for name in missing[:10]:
            status = ((await self.api.get(self.jobs_path(name))) or {}).get("status") or {}
            mine = {
                r["metadata"]["name"]: (r.get("status") or {}).get("jobStatus")
                for r in rayjobs
                if r["metadata"]["name"].rsplit("-a", 1)[0] == name
            }
            lines.append(
                f"  {name} plan {[s.value for s in self.plans[name].steps]}: phase {status.get('phase')} "
                f"attempt {status.get('attempt')} restarts {status.get('restarts')}; RayJobs {mine}"
            )
        return "\n".join(lines + self.kuberay.errors + self.unexpected)

    async def _create_jobs(self) -> None:
        loop_start = time.monotonic()
        for plan in sorted(self.plans.values(), key=lambda p: p.create_after_s):
            await asyncio.sleep(max(0.0, plan.create_after_s - (time.monotonic() - loop_start)))
            body = plan.manifest(self.namespace)
            try:
                await self.api.retrying(lambda body=body: self.api.create(self.jobs_path(), body))
            except kube_async.ApiStatus as error:
                if error.code != 409:  # created before an apiserver restart cut the answer off
                    raise
            self.num_created += 1

    async def _play_users(self) -> None:
        async for kind, job in self.api.watch(self.jobs_path()):
            name = job["metadata"]["name"]
            plan = self.plans.get(name)
            if plan is None:
                continue
            if kind == "DELETED":
                self._finish(name)
                continue
            status = job.get("status") or {}
            phase, attempt = status.get("phase"), int(status.get("attempt") or 0)
            if phase in ("Succeeded", "Failed"):
                self._finish(name)
                continue
            step = plan.steps[attempt - 1] if 1 <= attempt <= len(plan.steps) else None
            if phase == "Running" and step == Step.SUSPEND:
                await self._act(name, "suspend", attempt, {"spec": {"suspend": True}})
            elif phase == "Suspended" and job["spec"].get("suspend"):
                await self._act(name, "resume", attempt, {"spec": {"suspend": False}})
            elif phase == "Running" and step == Step.DELETE and ("delete", name, attempt) not in self._acted:
                self._acted.add(("delete", name, attempt))
                await self.api.retrying(lambda name=name: self.api.delete(self.jobs_path(name)))

    async def _act(self, name: str, what: str, attempt: int, patch: dict[str, Any]) -> None:
        if (what, name, attempt) in self._acted:
            return
        self._acted.add((what, name, attempt))
        await self.api.retrying(lambda: self.api.patch(self.jobs_path(name), patch))

    def _finish(self, name: str) -> None:
        self._finished.add(name)
        if len(self._finished) == len(self.plans):
            self._done.set()


# ------------------------------------------------------------------------------------------ checks
async def verify(churn: Churn, *, settle_s: float = 60.0) -> list[str]:
    """Every invariant, polled until it holds (the garbage collector works in the background) or
    ``settle_s`` passes; returns what is still wrong (empty: all good)."""
    deadline = time.monotonic() + settle_s
    while True:
        problems = await _problems(churn)
        if not problems or time.monotonic() > deadline:
            return problems
        await asyncio.sleep(1.0)


async def _problems(churn: Churn) -> list[str]:
    api, ns = churn.api, churn.namespace
    problems = list(churn.unexpected) + list(churn.kuberay.errors)
    jobs = {j["metadata"]["name"]: j for j in await api.list(churn.jobs_path())}
    core, rbac = f"/api/v1/namespaces/{ns}", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    selector = "app.kubernetes.io/managed-by=trainop"
    children = {
        "RayJob": await api.list(kuberay_async.rayjobs_path(ns), selector=selector),
        "ConfigMap": await api.list(f"{core}/configmaps", selector=selector),
        "ServiceAccount": await api.list(f"{core}/serviceaccounts", selector=selector),
        "Role": await api.list(f"{rbac}/roles", selector=selector),
        "RoleBinding": await api.list(f"{rbac}/rolebindings", selector=selector),
        "PersistentVolumeClaim": await api.list(f"{core}/persistentvolumeclaims", selector=selector),
    }
    events: collections.Counter[tuple[str, str]] = collections.Counter(
        (e["involvedObject"]["name"], e["reason"]) for e in await api.list(f"{core}/events")
    )
    by_owner: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    live_uids = {j["metadata"]["uid"] for j in jobs.values()}
    for kind, items in children.items():
        for item in items:
            by_owner[(kind, item["metadata"]["labels"].get("trainop.dev/job", ""))].append(item)
            owners = {ref["uid"] for ref in item["metadata"].get("ownerReferences") or ()}
            if kind != "PersistentVolumeClaim" and not owners & live_uids:
                problems.append(f"orphan {kind} {item['metadata']['name']} (owner gone)")

    for name, plan in churn.plans.items():
        want = plan.expected
        seen = {n: uids for n, uids in churn.kuberay.seen.items() if n.rsplit("-a", 1)[0] == name}
        attempts = sorted(int(n.rsplit("-a", 1)[1]) for n in seen)
        if attempts != list(range(1, want.attempt + 1)):
            problems.append(f"{name}: RayJobs created for attempts {attempts}, planned 1..{want.attempt}")
        problems += [f"{name}: RayJob {n} created {len(u)} times" for n, u in seen.items() if len(u) > 1]
        job = jobs.get(name)
        if want.phase is None:
            if job is not None:
                problems.append(f"{name}: should be deleted, is {job.get('status', {}).get('phase')}")
            for kind in ("RayJob", "ConfigMap", "ServiceAccount", "Role", "RoleBinding"):
                if by_owner.get((kind, name)):
                    problems.append(f"{name}: deleted job still has a {kind}")
            continue
        if job is None:
            problems.append(f"{name}: missing, planned to end {want.phase}")
            continue
        status = job.get("status") or {}
        got = (
            status.get("phase"),
            status.get("attempt"),
            status.get("restarts"),
            tuple((f["attempt"], f["reason"], f["message"]) for f in status.get("failures") or ()),
        )
        if got != (want.phase, want.attempt, want.restarts, want.failures):
            problems.append(f"{name}: status {got}, planned {dataclasses.astuple(want)}")
        rayjobs = sorted(r["metadata"]["name"] for r in by_owner.get(("RayJob", name), []))
        if rayjobs != [f"{name}-a{want.attempt}"]:
            problems.append(f"{name}: RayJobs left {rayjobs}, expected only attempt {want.attempt}'s")
        for kind in ("ConfigMap", "ServiceAccount", "Role", "RoleBinding", "PersistentVolumeClaim"):
            if len(by_owner.get((kind, name), [])) != 1:
                problems.append(f"{name}: {len(by_owner.get((kind, name), []))} {kind}s")
        config = by_owner.get(("ConfigMap", name), [{}])[0]
        if (config.get("metadata", {}).get("annotations") or {}).get("trainop.dev/attempt") != str(
            want.attempt
        ):
            problems.append(f"{name}: ConfigMap not rendered for the final attempt {want.attempt}")
        if events[(name, "Restarting")] != want.restarts:
            problems.append(f"{name}: {events[(name, 'Restarting')]} Restarting Events for {want.restarts}")
        if events[(name, want.phase)] != 1:
            problems.append(f"{name}: {events[(name, want.phase)]} {want.phase} Events")
    return problems


def watchdog(alive: Callable[[], bool], what: str) -> Callable[[asyncio.Event], Awaitable[None]]:
    """A ``disrupt`` that only watches: it fails the churn as soon as ``alive()`` turns false."""

    async def watch(done: asyncio.Event) -> None:
        while not done.is_set():
            if not alive():
                raise AssertionError(f"{what} died during the churn")
            await asyncio.sleep(0.5)

    return watch


def kill_and_restart(
    operator: Any,
    rng: random.Random,
    every_s: tuple[float, float] = (1.0, 4.0),
    *,
    progress: Callable[[], int] | None = None,
    milestones: Sequence[int] = (),
    reconciles_per_life: int = 3,
) -> Callable[[asyncio.Event], Awaitable[None]]:
    """A ``disrupt`` that SIGKILLs ``operator`` (an ``operator_runner.Operator``) at random intervals and
    starts it again at once, until the churn is done; the last start leaves it running.

    Besides the random kills, one kill as soon as ``progress()`` (e.g. the jobs created so far) reaches
    each of ``milestones``: those kills happen whatever the machine's speed, so a test may count on them
    (random intervals alone give a fast machine fewer kills before the churn ends).

    A random kill also waits until the running operator has finished ``reconciles_per_life`` reconciles
    since it started (its own reconcile counter): wall-clock intervals alone let a loaded machine (load 70,
    an operator needing more than 4 s to start) kill every operator before it did anything, and the churn
    then tested start-up only and never ended.
    """

    async def disrupt(done: asyncio.Event) -> None:
        pending = sorted(milestones)
        next_random = time.monotonic() + rng.uniform(*every_s)
        while not done.is_set():
            reached = bool(pending) and progress is not None and progress() >= pending[0]
            if reached:
                pending.pop(0)
            due = time.monotonic() >= next_random and (
                await asyncio.to_thread(_reconciles_since_start, operator) >= reconciles_per_life
            )
            if reached or due:
                operator.kill()
                await operator.start_async()
                next_random = time.monotonic() + rng.uniform(*every_s)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), timeout=0.1)

    return disrupt


def _reconciles_since_start(operator: Any) -> float:
    try:
        return float(operator.reconciles("success") + operator.reconciles("error"))
    except AssertionError:  # its metrics endpoint is not up yet
        return 0.0
