"""Writing children: server-side apply where the operator keeps content in line, create-only where not.

==========================  ==================================================================
ServiceAccount, Role,       server-side apply, field manager ``trainop``, forced: the apiserver
RoleBinding                 sets what we apply, takes back fields someone else changed, and
                            leaves fields other managers added alone -- no comparison of ours
ConfigMap                   server-side apply as well, once per attempt (``reconcile`` decides:
                            a running attempt's config never changes under it)
PersistentVolumeClaim       create-only (storage is immutable; a claim of an earlier job of the
                            same name is used as it is: that is how a re-created job resumes), and
                            adopted (our owner reference applied) when deleteWithJob asks for it
RayJob                      create-only: one RayJob is one attempt, fixed for its lifetime
==========================  ==================================================================

A create of a child that already exists answers 409, which is :attr:`Written.EXISTED`, not an error:
names are deterministic, so it is this owner's child made by an earlier reconcile (the cache had not seen
it yet), or a namesake's leftover, which the next reconcile sees in the cache and waits for. A server-side
apply that lands on an object being deleted (only possible when someone put a finalizer on it) raises
:class:`ChildBeingDeleted`: it is not brought back to life; its deletion event queues the owner again.
RayJobs that are not the current attempt's are deleted with a uid precondition (``prune_ray_jobs``).

Which children need a write at all is the caller's business (``reconcile``, from the cache). This module
must not decide which children should exist; ``children`` and ``state_machine`` do.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from trainop.controller import cache, failpoints, kube


class ChildBeingDeleted(Exception):
    """A child with the desired name is terminating; retry once it is gone."""


class Written(enum.Enum):
    CREATED = "created"
    EXISTED = "existed"  # a create answered 409
    APPLIED = "applied"  # server-side apply (created or brought in line; the apiserver knows which)


@dataclasses.dataclass(frozen=True)
class Write:
    """One write of a child and what the apiserver answered (``object`` is None after a 409)."""

    kind: str
    name: str
    written: Written
    object: Mapping[str, Any] | None = None

    @property
    def resource_version(self) -> str:
        return str((self.object or {}).get("metadata", {}).get("resourceVersion") or "")

    @property
    def uid(self) -> str:
        return str((self.object or {}).get("metadata", {}).get("uid") or "")


def fingerprint(manifest: Mapping[str, Any]) -> str:
    """A short digest of a manifest (it is kept per child in memory; 64 bits tell two manifests apart)."""
    encoded = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(encoded, digest_size=8).hexdigest()


async def create(client: kube.Kube, manifest: Mapping[str, Any]) -> Write:
    """Create a create-only child; an existing one of that name (409) is left as it is."""
    kind, name = manifest["kind"], manifest["metadata"]["name"]
    try:
        created = await client.create(kube.BY_KIND[kind], manifest["metadata"]["namespace"], manifest)
    except kube.ApiError as error:
        if error.status != 409 or error.reason != "AlreadyExists":  # another 409 is a conflict: retried
            raise
        return Write(kind, name, Written.EXISTED)
    return Write(kind, name, Written.CREATED, created)


async def server_side_apply(client: kube.Kube, manifest: Mapping[str, Any]) -> Write:
    kind, name = manifest["kind"], manifest["metadata"]["name"]
    stored = await client.apply(kube.BY_KIND[kind], manifest["metadata"]["namespace"], manifest)
    if stored.get("metadata", {}).get("deletionTimestamp"):
        raise ChildBeingDeleted(f"{kind} {name} is being deleted; waiting for it to go")
    return Write(kind, name, Written.APPLIED, stored)


async def adopt(client: kube.Kube, claim: Mapping[str, Any]) -> Write:
    """Apply the desired claim's owner reference (only that) to an existing claim of its name."""
    meta = claim["metadata"]
    reference = {
        "apiVersion": claim["apiVersion"],
        "kind": claim["kind"],
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "ownerReferences": meta["ownerReferences"],
        },
    }
    stored = await client.apply(kube.CLAIMS, meta["namespace"], reference)
    return Write(claim["kind"], meta["name"], Written.APPLIED, stored)


async def prune_ray_jobs(
    client: kube.Kube,
    namespace: str,
    ray_jobs: Iterable[cache.RayJobRecord],
    *,
    keep: str | None,
    owner_uid: str,
) -> list[str]:
    """Delete this owner's RayJobs other than ``keep`` (each by the uid seen); returns the names deleted."""
    deleted = []
    for record in ray_jobs:
        seen = record.seen
        if seen.name == keep or seen.being_deleted or owner_uid not in seen.owner_uids:
            continue
        if await client.delete(kube.RAY_JOBS, namespace, seen.name, uid=seen.uid):
            deleted.append(seen.name)
            failpoints.hit("ray-job-deleted")
    return deleted
