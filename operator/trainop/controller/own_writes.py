"""The children this process wrote, as the apiserver answered: to skip writes and to ignore their echoes.

For every child it created or applied, the reconcile records (uid, resourceVersion after the write,
fingerprint of what was written). Two questions are answered from that record and the cache:

- **Does a server-side applied child need a write?** Not while the cache shows the very version we wrote
  and the desired manifest is the one we applied (for the ConfigMap, which is not watched: not while it
  was written for the current attempt). Any other version means someone else changed it (or we
  never applied it in this process: after a start, each child is applied once), and server-side apply
  puts our fields back; there is no comparison of contents anywhere.
- **Is a watch event our own write coming back?** Then it queues no reconcile: the reconcile that wrote
  it already accounted for it. Any other event of a child (KubeRay's status, a claim binding, a deletion,
  someone's edit) queues its owner as usual.

The record is in memory only and only saves requests: a restarted operator starts without one. It is
keyed by owner, so that forgetting a deleted owner forgets its children. This module must not talk to
the API.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable


@dataclasses.dataclass(frozen=True)
class Record:
    uid: str
    resource_version: str
    fingerprint: str = ""


class OwnWrites:
    def __init__(self) -> None:
        # owner key -> {(kind, name): what we wrote}
        self._owners: dict[Hashable, dict[tuple[str, str], Record]] = {}

    def record(self, owner: Hashable, kind: str, name: str, written: Record) -> None:
        if written.resource_version:
            self._owners.setdefault(owner, {})[(kind, name)] = written

    def current(
        self, owner: Hashable, kind: str, name: str, *, resource_version: str, fingerprint: str
    ) -> bool:
        """Whether the child is still exactly what we applied from a manifest with this fingerprint."""
        written = self._owners.get(owner, {}).get((kind, name))
        return (
            written is not None
            and written.resource_version == resource_version
            and written.fingerprint == fingerprint
        )

    def get(self, owner: Hashable, kind: str, name: str) -> Record | None:
        return self._owners.get(owner, {}).get((kind, name))

    def is_echo(self, owner: Hashable, kind: str, name: str, *, uid: str, resource_version: str) -> bool:
        written = self._owners.get(owner, {}).get((kind, name))
        return written is not None and written.uid == uid and written.resource_version == resource_version

    def forget(self, owner: Hashable) -> None:
        self._owners.pop(owner, None)
