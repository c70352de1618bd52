"""The children this process wrote, as the apiserver answered: to skip writes and to ignore their echoes.

For every child it created or applied, the reconcile records (uid, resourceVersion after the write,
fingerprint of what was written). Two questions are answered from that record and the watch events:

- **Does a server-side applied child need a write?** Not while the manifest is the one we applied and
  no event other than our own write's echo has been seen for the child since (``observe``: any other --
  someone's edit, a deletion -- forgets the record). The ConfigMap, which is not watched, is written once
  per attempt. Otherwise server-side apply puts our fields back; no code compares contents. After a start
  the record is empty, so each child is applied once.
- **Is a watch event our own write coming back?** Then it queues no reconcile: the reconcile that wrote
  it already accounted for it. Any other event of a child (KubeRay's status, a claim binding, a deletion,
  someone's edit) queues its owner as usual.

It also remembers which server-side applied children were seen being deleted (someone's finalizer holds
them): the status says so while the RayJob waits for them to go.

The record is in memory only and only saves requests. It is keyed by owner, so that forgetting a deleted
or finished owner forgets its children, and each owner's record belongs to one incarnation of it (its
uid): an owner deleted and created again under its name has children of the same names, and must not take
the deleted one's for its own -- a ConfigMap "written for attempt 1" that the garbage collector removed with
the deleted owner would never be written again. The record is asked and extended with the uid of the owner
a reconcile read; one made for another uid (a reconcile of the deleted one that was still in flight when
its deletion forgot it, or a deletion no watch saw) answers nothing and is replaced by the first record of
the new one. The marks of children being deleted are not the incarnation's but the names': a namesake's
child still terminating blocks the new owner's child of that name all the same. This module must not talk
to the API.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Iterable
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    uid: str
    resource_version: str
    fingerprint: str = ""


@dataclasses.dataclass(slots=True)
class _Incarnation:
    """What we wrote for the children of one incarnation of an owner."""

    uid: str
    children: dict[tuple[str, str], Record] = dataclasses.field(default_factory=dict)  # (kind, name)


class OwnWrites:
    def __init__(self) -> None:
        # owner key -> what we wrote for its children, for one uid of the owner
        self._owners: dict[Hashable, _Incarnation] = {}
        # owner key -> {(kind, name)} of server-side applied children seen being deleted
        self._deleting: dict[Hashable, set[tuple[str, str]]] = {}

    def record(self, owner: Hashable, kind: str, name: str, written: Record, *, owner_uid: str) -> None:
        """What we wrote for the owner incarnation ``owner_uid``; what was recorded for another goes."""
        if not written.resource_version:
            return
        incarnation = self._owners.get(owner)
        if incarnation is None or incarnation.uid != owner_uid:
            incarnation = self._owners[owner] = _Incarnation(owner_uid)
        incarnation.children[(kind, name)] = written

    def get(self, owner: Hashable, kind: str, name: str, *, owner_uid: str) -> Record | None:
        incarnation = self._owners.get(owner)
        if incarnation is None or incarnation.uid != owner_uid:
            return None
        return incarnation.children.get((kind, name))

    def current(self, owner: Hashable, kind: str, name: str, *, owner_uid: str, fingerprint: str) -> bool:
        """Whether the child is still what we applied for the owner incarnation ``owner_uid`` from a
        manifest with this fingerprint: no event other than our own write's echo has been seen for it
        since (``observe``)."""
        written = self.get(owner, kind, name, owner_uid=owner_uid)
        return written is not None and written.fingerprint == fingerprint

    def is_echo(self, owner: Hashable, kind: str, name: str, *, uid: str, resource_version: str) -> bool:
        """Whether a child's event is our own write coming back (the child's uid and resourceVersion tell
        which write, whichever incarnation of the owner it was for)."""
        incarnation = self._owners.get(owner)
        written = incarnation.children.get((kind, name)) if incarnation is not None else None
        return written is not None and written.uid == uid and written.resource_version == resource_version

    def observe(
        self,
        owner: Hashable,
        kind: str,
        name: str,
        *,
        uid: str,
        resource_version: str,
        being_deleted: bool,
        deleted: bool,
    ) -> bool:
        """A watch event of a server-side applied child; whether it is our own write's echo. Any other
        event forgets what we wrote, so that the next reconcile applies it again."""
        if not deleted and self.is_echo(owner, kind, name, uid=uid, resource_version=resource_version):
            return True
        incarnation = self._owners.get(owner)
        if incarnation is not None:
            incarnation.children.pop((kind, name), None)
        marks = self._deleting.setdefault(owner, set())
        if being_deleted and not deleted:
            marks.add((kind, name))
        else:
            marks.discard((kind, name))
        return False

    def being_deleted(self, owner: Hashable) -> list[tuple[str, str]]:
        return sorted(self._deleting.get(owner, ()))

    def children_of_kind(self, kind: str) -> list[tuple[Any, str, str]]:
        """(owner, name, uid) of every child of this kind recorded (for ``relist``; its owners are
        ``reconcile.OwnerKey`` objects, which have a namespace)."""
        return [
            (owner, name, written.uid)
            for owner, incarnation in self._owners.items()
            for (child_kind, name), written in incarnation.children.items()
            if child_kind == kind
        ]

    def forget_child(self, owners: Iterable[Hashable], kind: str, name: str, uid: str) -> None:
        """Forget what we wrote to this incarnation of a child for these owners (gone without a DELETED
        event: ``relist``), so that the next reconcile writes it again."""
        for owner in owners:
            incarnation = self._owners.get(owner)
            written = incarnation.children.get((kind, name)) if incarnation is not None else None
            if incarnation is not None and written is not None and written.uid == uid:
                del incarnation.children[(kind, name)]

    def forget(self, owner: Hashable) -> None:
        self._owners.pop(owner, None)
        self._deleting.pop(owner, None)
