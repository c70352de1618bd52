"""Writes to an owner itself that only the incarnation they were decided from takes.

A reconcile reads its owner (a TrainingJob or TuningSweep) and writes back to it by name: its accepted
spec into the ``trainop.dev/applied-spec`` annotation and its operator-owned status fields. If the owner
is deleted and created again under the same name while a reconcile of the old one is in flight, a write by
name alone lands on the new object: it would take the old one's phase, attempts and accepted spec. So each
write carries the uid of the body it was decided from, and the apiserver refuses it when the object under
that name has another uid. Not its resourceVersion: the trainer writes its own status fields all the time,
and optimistic locking on the version would turn every one of them into a conflict.

How the apiserver is made to check the uid differs between the two endpoints (checked against
kube-apiserver v1.37, tests/operator/integration/test_owner_incarnations.py):

- **the object** (the annotation): a JSON merge patch carrying ``metadata.uid``. A uid that is not the
  stored one is a change of an immutable field: ``422 Invalid``, cause ``metadata.uid``;
- **the status subresource**: there the apiserver keeps nothing of a patch but ``status``, so a
  ``metadata.uid`` in a merge patch is dropped without a word and the patch lands on the namesake (200).
  The status is written as a JSON patch (RFC 6902) instead, led by ``test /metadata/uid``, which is
  evaluated against the whole stored object: a failed test is a ``422`` whose message names nothing
  ("the server rejected our request due to an error in our request"). The rest of the patch makes the
  change the merge patch from ``OperatorStatus.merge_patch_from`` describes, against the status as read:
  the operator's keys are written only by the operator, one reconcile of an owner at a time, so the stored
  ones are the ones read; where they are not (someone edited them), a path is missing, the patch fails
  as a whole, and the reconcile is retried from a fresh read -- never a partial status.

A 422 or 404 answer to either is confirmed with a GET: no object under the name, or one with another uid,
raises :class:`Replaced`; anything else is the apiserver's answer as it came.

This module must not decide what is written; ``reconcile`` does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any

from trainop.controller import kube


class Replaced(Exception):
    """The owner a write was decided from is gone: deleted, and maybe created again under its name."""


async def annotate(
    client: kube.Kube,
    resource: kube.Resource,
    namespace: str,
    name: str,
    annotations: Mapping[str, str],
    *,
    uid: str,
) -> None:
    """Set ``annotations`` on the owner incarnation ``uid`` (raises :class:`Replaced` if it is gone)."""
    patch = {"metadata": {"uid": uid, "annotations": dict(annotations)}}
    await _confirmed(client, resource, namespace, name, uid, client.patch(resource, namespace, name, patch))


async def patch_status(
    client: kube.Kube,
    resource: kube.Resource,
    namespace: str,
    name: str,
    merge: Mapping[str, Any],
    *,
    stored: Mapping[str, Any] | None,
    uid: str,
) -> None:
    """Apply the status merge patch ``merge``, computed against the status ``stored`` as read, to the owner
    incarnation ``uid`` (raises :class:`Replaced` if it is gone)."""
    operations = status_operations(merge, stored, uid=uid)
    write = client.json_patch(resource, namespace, name, operations, subresource="status")
    await _confirmed(client, resource, namespace, name, uid, write)


def status_operations(
    merge: Mapping[str, Any], stored: Mapping[str, Any] | None, *, uid: str
) -> list[dict[str, Any]]:
    """The JSON patch that makes the change of the status merge patch ``merge`` to the status ``stored``,
    led by a test of the owner's uid. Pure."""
    operations: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": uid}]
    if not isinstance(stored, Mapping):  # no status yet (nobody wrote one since, or the patch fails)
        operations.append({"op": "test", "path": "/status", "value": None})
        operations.append({"op": "add", "path": "/status", "value": _without_nulls(merge)})
        return operations
    operations.extend(_operations("/status", merge, stored))
    return operations


def _operations(path: str, merge: Mapping[str, Any], stored: Mapping[str, Any]) -> list[dict[str, Any]]:
    """RFC 7386 applied to ``stored``, as RFC 6902 operations (``add`` replaces a member that exists)."""
    operations: list[dict[str, Any]] = []
    for key, value in merge.items():
        at = f"{path}/{_escape(key)}"
        before = stored.get(key)
        if value is None:
            if key in stored:
                operations.append({"op": "remove", "path": at})
        elif isinstance(value, Mapping) and isinstance(before, Mapping):
            operations.extend(_operations(at, value, before))
        else:
            operations.append({"op": "add", "path": at, "value": _without_nulls(value)})
    return operations


def _without_nulls(value: Any) -> Any:
    """A merge patch's value as it is stored: a null member of an object the patch adds sets nothing."""
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


def _escape(key: str) -> str:
    """A JSON pointer reference token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


async def _confirmed(
    client: kube.Kube,
    resource: kube.Resource,
    namespace: str,
    name: str,
    uid: str,
    write: Awaitable[Any],
) -> None:
    try:
        await write
    except kube.ApiError as error:
        if error.status not in (404, 422):
            raise
        current = await client.get(resource, namespace, name)
        if current is None:
            raise Replaced(f"it was deleted (uid {uid})") from error
        if current["metadata"].get("uid") != uid:
            raise Replaced(
                f"it was deleted and created again (uid {uid}, now {current['metadata'].get('uid')})"
            ) from error
        raise
