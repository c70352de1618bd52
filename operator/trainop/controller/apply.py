"""Bringing children to their desired state, idempotently: create, or patch only what differs.

Names are deterministic, so "create" is safe to repeat: a 409 means the child exists and is compared
instead. How an existing child is updated depends on its kind:

==========================  ==================================================================
PersistentVolumeClaim       never patched (storage is immutable; a claim from an earlier job of
                            the same name is adopted as is: that is how a re-created job resumes)
RayJob                      never patched: one RayJob is one attempt, fixed for its lifetime
ConfigMap                   rewritten only for a new attempt (its ``trainop.dev/attempt``
                            annotation), so a running attempt's config never changes under it
ServiceAccount, Role,       merge-patched whenever they drift from the desired manifest
RoleBinding
==========================  ==================================================================

The caller may pass what it already knows about the child (``existing``): the object it just read (the
reconcile reads its RayJobs and claim fresh anyway), or ``None`` when it has reason to believe there is
none yet (an owner never reconciled before), which makes the create the first request instead of a GET
that would answer 404. A wrong belief costs one request more, never a wrong result: a create that meets
an existing child (409) falls back to reading and comparing it.

A child that is being deleted (for instance by the garbage collector, after an owner of the same name
was deleted) is waited for with a retryable error, never patched back to life. RayJobs that are not the
current attempt's are deleted (``prune_ray_jobs``). This module must not decide which children should
exist; ``children`` and ``status`` do.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from trainop.controller import failpoints, kinds, kube

log = logging.getLogger(__name__)


class Update(enum.Enum):
    NEVER = "never"
    NEW_ATTEMPT = "new-attempt"
    DRIFT = "drift"


UPDATE_POLICY: Mapping[str, Update] = {
    "PersistentVolumeClaim": Update.NEVER,
    "RayJob": Update.NEVER,
    "ConfigMap": Update.NEW_ATTEMPT,
    "ServiceAccount": Update.DRIFT,
    "Role": Update.DRIFT,
    "RoleBinding": Update.DRIFT,
}


class ChildBeingDeleted(Exception):
    """A child with the desired name is terminating; retry once it is gone."""


class ChildNotOurs(Exception):
    """A child with the desired name belongs to another owner (for instance a deleted namesake)."""


class Unknown(enum.Enum):
    UNKNOWN = "unknown"


UNKNOWN = Unknown.UNKNOWN
"""``ensure(existing=UNKNOWN)``: nothing is known about the child, so it is read first."""


async def ensure(
    client: kube.Kube,
    manifest: Mapping[str, Any],
    *,
    existing: Mapping[str, Any] | Unknown | None = UNKNOWN,
) -> str:
    """Create ``manifest`` or bring the existing object in line; returns created | updated | unchanged.

    ``existing``: the child as just read, ``None`` if it is believed absent, ``UNKNOWN`` to read it here.
    """
    resource = kube.BY_KIND[manifest["kind"]]
    namespace = manifest["metadata"]["namespace"]
    name = manifest["metadata"]["name"]
    if existing is UNKNOWN:
        existing = await client.get(resource, namespace, name)
    if existing is None:
        try:
            await client.create(resource, namespace, manifest)
        except kube.ApiError as error:
            if error.status != 409:
                raise
            existing = await client.get(resource, namespace, name)
            if existing is None:  # created and deleted again in between: let the retry sort it out
                raise
        else:
            return "created"
    if existing["metadata"].get("deletionTimestamp"):
        raise ChildBeingDeleted(f"{manifest['kind']} {name} is being deleted; waiting for it to go")
    policy = UPDATE_POLICY[manifest["kind"]]
    if policy == Update.NEVER:
        if manifest["kind"] == "RayJob" and not _same_owner(existing, manifest):
            raise ChildNotOurs(
                f"RayJob {name} belongs to another owner (a deleted namesake?); waiting for it to go"
            )
        return "unchanged"
    if policy == Update.NEW_ATTEMPT:
        have = existing["metadata"].get("annotations", {}).get(kinds.ANNOTATION_ATTEMPT)
        want = manifest["metadata"].get("annotations", {}).get(kinds.ANNOTATION_ATTEMPT)
        if have == want and _same_owner(existing, manifest):
            return "unchanged"
    elif contains(existing, manifest):
        return "unchanged"
    await client.patch(resource, namespace, name, manifest)
    return "updated"


async def prune_ray_jobs(
    client: kube.Kube,
    namespace: str,
    ray_jobs: Iterable[Mapping[str, Any]],
    *,
    keep: str | None,
    owner_uid: str,
) -> list[str]:
    """Delete this owner's RayJobs other than ``keep``; returns the names deleted."""
    deleted = []
    for ray_job in ray_jobs:
        meta = ray_job["metadata"]
        if meta["name"] == keep or meta.get("deletionTimestamp") or not owned_by(ray_job, owner_uid):
            continue
        if await client.delete(kube.RAY_JOBS, namespace, meta["name"], uid=meta.get("uid")):
            deleted.append(meta["name"])
            failpoints.hit("ray-job-deleted")
    return deleted


def owned_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    return any(ref.get("uid") == owner_uid for ref in obj["metadata"].get("ownerReferences") or ())


def _same_owner(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    wanted = [ref["uid"] for ref in desired["metadata"].get("ownerReferences") or ()]
    return all(owned_by(existing, uid) for uid in wanted)


def contains(existing: Any, desired: Any) -> bool:
    """Whether ``existing`` already has every field of ``desired`` (the apiserver adds defaults, so a
    superset is "the same"); lists must match item by item."""
    if isinstance(desired, Mapping):
        return isinstance(existing, Mapping) and all(contains(existing.get(k), v) for k, v in desired.items())
    if isinstance(desired, list):
        return (
            isinstance(existing, list)
            and len(existing) == len(desired)
            and all(contains(e, d) for e, d in zip(existing, desired, strict=True))
        )
    return bool(existing == desired)
