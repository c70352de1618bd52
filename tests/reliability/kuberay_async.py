"""STAND-IN for KubeRay's Go controller, asynchronous and watch-driven, for many RayJobs at once.

Same statuses as ``tests/operator/integration/kuberay_standin.py`` -- both take them from
``tests/kuberay_lifecycle.py``, the one definition, held to recordings of the real controller -- but it
*reacts*: it watches RayJobs and takes each new one (empty status) through Initializing -> Running (the
cluster ready, the job submitted, the job running) by itself, then applies the outcome the test planned for
that RayJob:

    Outcome.SUCCEED   jobStatus SUCCEEDED, jobDeploymentStatus Complete
    Outcome.FAIL      jobStatus FAILED, reason AppFailed, the planned message
    Outcome.HOLD      stays RUNNING (until the operator deletes it: suspend, or its owner is deleted)

It also records every RayJob it ever saw by name and uid (``seen``), so a test can prove that no RayJob
was created twice. What it does not do: create a RayCluster or pods, or add KubeRay's finalizer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from collections.abc import Callable
from typing import Any

from tests import kuberay_lifecycle
from tests.reliability import kube_async

MANAGED = "app.kubernetes.io/managed-by=trainop"


class Outcome(enum.Enum):
    SUCCEED = "succeed"
    FAIL = "fail"
    HOLD = "hold"


@dataclasses.dataclass(frozen=True)
class Plan:
    outcome: Outcome
    message: str = ""
    delay_s: float = 0.0  # between Running and the outcome


def rayjobs_path(namespace: str, name: str = "") -> str:
    return f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs" + (f"/{name}" if name else "")


class KubeRayStandIn:
    def __init__(
        self,
        api: kube_async.AsyncApi,
        namespace: str,
        plan_for: Callable[[dict[str, Any]], Plan],
        *,
        on_created: Callable[[str, float], None] | None = None,
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._plan_for = plan_for
        self._on_created = on_created
        #: RayJob name -> every uid seen under that name (more than one: created twice).
        self.seen: dict[str, list[str]] = {}
        #: Failures of the stand-in itself (a test must not blame the operator for them).
        self.errors: list[str] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._runner = asyncio.create_task(self._watch(), name="kuberay-standin")

    async def stop(self) -> None:
        await kube_async.cancel(*([self._runner] if self._runner else []), *self._tasks)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        async for kind, obj in self._api.watch(rayjobs_path(self._namespace), selector=MANAGED):
            if kind == "DELETED":
                continue
            meta = obj["metadata"]
            uids = self.seen.setdefault(meta["name"], [])
            if meta["uid"] in uids:
                continue
            uids.append(meta["uid"])
            if self._on_created is not None:
                self._on_created(meta["name"], loop.time())
            if (obj.get("status") or {}).get("jobDeploymentStatus") or meta.get("deletionTimestamp"):
                continue  # already handled before a relist
            task = asyncio.create_task(self._drive(meta["name"], self._plan_for(obj)))
            self._tasks.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.errors.append(f"stand-in: {task.get_name()}: {task.exception()!r}")

    async def _drive(self, name: str, plan: Plan) -> None:
        for status in (
            kuberay_lifecycle.initializing(name),
            kuberay_lifecycle.cluster_ready(name, self._namespace),
            kuberay_lifecycle.submitted(),
            kuberay_lifecycle.running(),
        ):
            if not await self.patch(name, status):
                return
        if plan.outcome == Outcome.HOLD:
            return
        await asyncio.sleep(plan.delay_s)
        if plan.outcome == Outcome.SUCCEED:
            await self.succeed(name)
        else:
            await self.fail(name, plan.message)

    async def succeed(self, name: str) -> None:
        await self.patch(name, kuberay_lifecycle.succeeded())

    async def fail(self, name: str, message: str) -> None:
        await self.patch(name, kuberay_lifecycle.failed(message))

    async def patch(self, name: str, status: dict[str, Any]) -> bool:
        """Patch the status subresource; False when the RayJob is gone (deleted by the operator)."""
        path = rayjobs_path(self._namespace, name) + "/status"
        try:
            await self._api.retrying(lambda: self._api.patch(path, {"status": status}))
        except kube_async.ApiStatus as error:
            if error.code in (404, 409):
                return False
            raise
        return True
