"""Labels, owner references and object metadata shared by every child builder. Pure.

Every child carries ``app.kubernetes.io/managed-by: trainop`` (the operator watches its children through
this one server-side label selector), ``app.kubernetes.io/component``, and the owner label
(``trainop.dev/job`` or ``trainop.dev/sweep``) whose value is the owner's name: a child event is routed
to its owner from the labels alone. Ray pods also carry ``trainop.dev/attempt``.

This module must not talk to the API.
"""

from __future__ import annotations

from typing import Any

from trainop.api import manifest
from trainop.controller import kinds


def labels(resource: manifest.Resource) -> dict[str, str]:
    kind = kinds.kind_of(resource)
    return {
        kinds.LABEL_MANAGED_BY: kinds.MANAGED_BY,
        kinds.LABEL_COMPONENT: kind.component,
        kind.owner_label: resource.metadata.name,
    }


def attempt_labels(resource: manifest.Resource, attempt: int) -> dict[str, str]:
    found = {**labels(resource), kinds.LABEL_ATTEMPT: str(attempt)}
    if resource.metadata.uid:
        found[kinds.LABEL_OWNER_UID] = resource.metadata.uid
    return found


def owner_reference(resource: manifest.Resource) -> dict[str, Any]:
    """A controller reference: the garbage collector deletes the child with its owner."""
    kind = kinds.kind_of(resource)
    if not resource.metadata.uid:
        raise ValueError(f"{kind.kind} {resource.metadata.name} has no uid: children need a stored owner")
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "name": resource.metadata.name,
        "uid": resource.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_metadata(
    resource: manifest.Resource, name: str, *, owned: bool = True, attempt: int | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": resource.metadata.namespace,
        "labels": labels(resource) if attempt is None else attempt_labels(resource, attempt),
    }
    if owned:
        meta["ownerReferences"] = [owner_reference(resource)]
    return meta
