"""The kopf handlers: thin. Each turns a watch event into a queued owner key (see ``engine``).

Watched resources, all with ``kopf.on.event`` (no kopf change handlers, so kopf keeps no per-object
progress annotations and adds no finalizers: deleting an owner is plain garbage collection):

- trainingjobs and tuningsweeps (trainop.dev/v1alpha1): every object;
- rayjobs and rayclusters (ray.io/v1), persistentvolumeclaims and pods (v1): only objects labelled
  ``app.kubernetes.io/managed-by=trainop``, filtered server-side (``settings.watching.label_selectors``),
  so the operator never streams every pod of the cluster.

A liveness probe reports the work queue and fails when a worker task died. This module must not
reconcile or talk to the API.
"""

from __future__ import annotations

from typing import Any

import kopf

from trainop.api import base
from trainop.controller import engine, kinds

# (group, version, plural) of the children the operator watches to notice changes.
CHILD_RESOURCES: tuple[tuple[str, str, str], ...] = (
    ("ray.io", "v1", "rayjobs"),
    ("ray.io", "v1", "rayclusters"),
    ("", "v1", "persistentvolumeclaims"),
    ("", "v1", "pods"),
)


def register(
    registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, runtime: engine.Engine
) -> None:
    for kind in kinds.ALL:
        _register_owner(registry, runtime, kind)
    for group, version, plural in CHILD_RESOURCES:
        settings.watching.label_selectors[_selector(group, version, plural)] = kinds.MANAGED_SELECTOR

        async def child_event(body: kopf.Body, **_: Any) -> None:
            runtime.child_event(body)

        if group:
            decorator = kopf.on.event(group, version, plural, id=f"child-{plural}", registry=registry)
        else:  # the core group is spelled by its version alone: ("v1", "pods")
            decorator = kopf.on.event(version, plural, id=f"child-{plural}", registry=registry)
        decorator(child_event)

    @kopf.on.probe(id="reconcile-workers", registry=registry)
    async def workers_alive(**_: Any) -> dict[str, int]:
        if not runtime.healthy():  # permanent: kopf answers the probe with HTTP 500 at once, no retries
            raise kopf.PermanentError("a reconcile worker task has stopped")
        return {"queued": len(runtime.queue)}


def _register_owner(registry: kopf.OperatorRegistry, runtime: engine.Engine, kind: kinds.Kind) -> None:
    async def owner_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        runtime.owner_event(kind, event.get("type"), body)

    kopf.on.event(base.GROUP, base.VERSION, kind.plural, id=f"owner-{kind.plural}", registry=registry)(
        owner_event
    )


def _selector(group: str, version: str, plural: str) -> tuple[str, str] | tuple[str, str, str]:
    return (group, version, plural) if group else (version, plural)
