"""The kopf handlers: thin. Each keeps the ``cache`` (kopf indexes) and turns a watch event into a queued
owner key (see ``engine``).

Watched resources, with ``kopf.on.event`` (routing) and, for what a reconcile reads, ``kopf.index`` (see
``cache``) -- no kopf change handlers, so kopf keeps no per-object progress annotations and adds no
finalizers: deleting an owner is plain garbage collection:

- trainingjobs and tuningsweeps (trainop.dev/v1alpha1): every object; indexed by the claims they use;
- rayjobs and rayclusters (ray.io/v1), pods and serviceaccounts (v1), roles and rolebindings
  (rbac.authorization.k8s.io/v1): only objects labelled ``app.kubernetes.io/managed-by=trainop``,
  filtered server-side (``settings.watching.label_selectors``), so the operator never streams every pod
  of the cluster. Not ConfigMaps: watching them needs ``list`` on every ConfigMap of the cluster, which
  the operator must not hold (tests/security); see ``reconcile`` for how the trainer's config is kept;
- persistentvolumeclaims (v1): every claim, since an ``existingClaim`` is the user's and has no label.

A liveness probe reports the work queue and fails when a worker task died. This module must not
reconcile or talk to the API.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from trainop.api import base
from trainop.controller import cache, engine, kinds, kube, relist

# Every handler is a coroutine: kopf runs plain functions in a thread pool, a thread hand-off per event.
# (group, version, plural) of the children the operator watches, the cache index each one fills (None:
# its events only route, see ``cache``), and whether the watch takes only the operator's own (labelled)
# objects.
CHILD_RESOURCES: tuple[tuple[str, str, str, str | None, bool], ...] = (
    ("ray.io", "v1", "rayjobs", cache.RAY_JOBS, True),
    ("ray.io", "v1", "rayclusters", cache.RAY_CLUSTERS, True),
    ("", "v1", "persistentvolumeclaims", cache.CLAIMS, False),
    ("", "v1", "pods", cache.PODS, True),
    ("", "v1", "serviceaccounts", None, True),
    ("rbac.authorization.k8s.io", "v1", "roles", None, True),
    ("rbac.authorization.k8s.io", "v1", "rolebindings", None, True),
)


def watched() -> list[relist.Watched]:
    """Every watched resource as ``relist`` sweeps it: listed as its watch lists it."""
    found = [relist.watched_owner(kind) for kind in kinds.ALL]
    for group, version, plural, index_id, labelled in CHILD_RESOURCES:
        resource = kube.Resource(f"{group}/{version}" if group else version, plural)
        kind = next(k for k, r in kube.BY_KIND.items() if r == resource)
        found.append(relist.Watched(resource, kind, index_id, kinds.MANAGED_SELECTOR if labelled else None))
    return found


def register(
    registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, runtime: engine.Engine
) -> None:
    for kind in kinds.ALL:
        _register_owner(registry, runtime, kind)
    for group, version, plural, index_id, labelled in CHILD_RESOURCES:
        selector = (group, version, plural) if group else (version, plural)
        if labelled:
            settings.watching.label_selectors[selector] = kinds.MANAGED_SELECTOR
        _register_child(registry, runtime, selector, plural, index_id)

    @kopf.on.probe(id="reconcile-workers", registry=registry)
    async def workers_alive(**_: Any) -> dict[str, int]:
        if not runtime.healthy():  # permanent: kopf answers the probe with HTTP 500 at once, no retries
            raise kopf.PermanentError("a reconcile worker task has stopped")
        return {"queued": len(runtime.queue)}


def _register_child(
    registry: kopf.OperatorRegistry,
    runtime: engine.Engine,
    selector: tuple[str, ...],
    plural: str,
    index_id: str | None,
) -> None:
    async def child_event(event: kopf.RawEvent, body: kopf.Body, **kwargs: Any) -> None:
        _bind(runtime, kwargs)
        runtime.listed(event.get("type"), body)
        runtime.child_event(body, deleted=event.get("type") == "DELETED")

    kopf.on.event(*selector, id=f"child-{plural}", registry=registry)(child_event)
    if index_id is None:
        return
    index_function = cache.INDEX_FUNCTIONS[index_id]

    async def index(body: kopf.Body, **_: Any) -> Mapping[Any, Any] | None:
        return index_function(body)

    kopf.index(*selector, id=cache.handler_id(index_id, plural), registry=registry)(index)


def _register_owner(registry: kopf.OperatorRegistry, runtime: engine.Engine, kind: kinds.Kind) -> None:
    async def owner_event(event: kopf.RawEvent, body: kopf.Body, **kwargs: Any) -> None:
        _bind(runtime, kwargs)
        runtime.listed(event.get("type"), body)
        runtime.owner_event(kind, event.get("type"), body)

    async def claims(body: kopf.Body, **_: Any) -> Mapping[Any, Any] | None:
        return cache.index_owner_claims(body)

    selector = (base.GROUP, base.VERSION, kind.plural)
    kopf.index(*selector, id=cache.handler_id(cache.OWNERS_BY_CLAIM, kind.plural), registry=registry)(claims)
    kopf.on.event(*selector, id=f"owner-{kind.plural}", registry=registry)(owner_event)


def _bind(runtime: engine.Engine, indexes: Mapping[str, Any]) -> None:
    if not runtime.cache.bound:
        runtime.cache.bind(indexes)
