"""Which children this process has already brought to their desired state, so a reconcile can skip them.

Most reconciles of an owner change nothing about its ConfigMap, ServiceAccount, Role and RoleBinding:
they follow its RayJob's status. Re-reading four unchanged children on each of them was most of the
operator's API traffic. A :class:`Verified` record says "child C of owner incarnation U was created,
patched or found equal to the desired manifest with fingerprint F, at time T"; while the desired
manifest keeps fingerprint F and T is younger than ``resync_seconds``, the child is not read again.

What this trades, stated plainly: a change made to one of those children by someone else (drift) is
repaired at the first reconcile after ``resync_seconds`` (default 10 minutes), or at the next
operator start, instead of at the very next reconcile. The claim and the RayJob are never skipped this
way: each reconcile reads them fresh anyway (they decide the status), and the reconcile hands what it
read to ``apply.ensure``.

The record lives only in memory and only speeds things up: a restarted operator starts with none and
verifies every child once. It is keyed by the owner's uid, so an owner deleted and created again under
the same name starts afresh. This module must not talk to the API.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

#: Re-verify a child at least this often (seconds) even when nothing we know of changed it.
DEFAULT_RESYNC_SECONDS = 600.0


def fingerprint(manifest: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Verified:
    def __init__(
        self,
        *,
        resync_seconds: float = DEFAULT_RESYNC_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._resync = resync_seconds
        self._clock = clock
        # owner key -> (owner uid, {(kind, name): (fingerprint, verified at)})
        self._owners: dict[Hashable, tuple[str, dict[tuple[str, str], tuple[str, float]]]] = {}

    def _children(self, owner: Hashable, uid: str) -> dict[tuple[str, str], tuple[str, float]]:
        entry = self._owners.get(owner)
        if entry is None or entry[0] != uid:
            entry = self._owners[owner] = (uid, {})
        return entry[1]

    def is_current(self, owner: Hashable, uid: str, manifest: Mapping[str, Any]) -> bool:
        """Whether ``manifest`` was applied (or found in place) recently enough to skip it."""
        record = self._children(owner, uid).get(_child(manifest))
        return (
            record is not None
            and record[0] == fingerprint(manifest)
            and self._clock() - record[1] < self._resync
        )

    def knows(self, owner: Hashable, uid: str) -> bool:
        """Whether any child of this owner incarnation was verified by this process."""
        return bool(self._children(owner, uid))

    def record(self, owner: Hashable, uid: str, manifest: Mapping[str, Any]) -> None:
        self._children(owner, uid)[_child(manifest)] = (fingerprint(manifest), self._clock())

    def forget(self, owner: Hashable) -> None:
        self._owners.pop(owner, None)


def _child(manifest: Mapping[str, Any]) -> tuple[str, str]:
    return str(manifest["kind"]), str(manifest["metadata"]["name"])
