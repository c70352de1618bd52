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
or finished owner forgets its children. This module must not talk to the API.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    uid: str
    resource_version: str
    fingerprint: str = ""


class OwnWrites:
    def __init__(self) -> None:
        # owner key -> {(kind, name): what we wrote}
        self._owners: dict[Hashable, dict[tuple[str, str], Record]] = {}
        # owner key -> {(kind, name)} of server-side applied children seen being deleted
        self._deleting: dict[Hashable, set[tuple[str, str]]] = {}

    def record(self, owner: Hashable, kind: str, name: str, written: Record) -> None:
        if written.resource_version:
            self._owners.setdefault(owner, {})[(kind, name)] = written

    def get(self, owner: Hashable, kind: str, name: str) -> Record | None:
        return self._owners.get(owner, {}).get((kind, name))

    def current(self, owner: Hashable, kind: str, name: str, *, fingerprint: str) -> bool:
        """Whether the child is still what we applied from a manifest with this fingerprint: no event
        other than our own write's echo has been seen for it since (``observe``)."""
        written = self.get(owner, kind, name)
        return written is not None and written.fingerprint == fingerprint

    def is_echo(self, owner: Hashable, kind: str, name: str, *, uid: str, resource_version: str) -> bool:
        written = self.get(owner, kind, name)
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
        self._owners.get(owner, {}).pop((kind, name), None)
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
            for owner, children in self._owners.items()
            for (child_kind, name), written in children.items()
            if child_kind == kind
        ]

    def forget_child(self, kind: str, namespace: str, name: str, uid: str) -> None:
        """Forget what we wrote to this incarnation of a child (gone without a DELETED event: ``relist``),
        so that the next reconcile writes it again."""
        for owner, children in self._owners.items():
            written = children.get((kind, name))
            if written is not None and written.uid == uid and getattr(owner, "namespace", None) == namespace:
                del children[(kind, name)]

    def forget(self, owner: Hashable) -> None:
        self._owners.pop(owner, None)
        self._deleting.pop(owner, None)
