"""The operator-owned part of an owner's status, and the merge patches that write it.

The operator and the trainer's rank 0 (or a sweep's driver) write disjoint subtrees of the same status:
the operator ``phase``, ``conditions``, ``attempt``, ``restarts``, ``failures``, ``children`` and the
times; the trainer ``progress``, ``checkpoint``, ``network``, ``cost`` and the experiment records
``evaluation``, ``profile``, ``communication``, ``tracking`` (a sweep's driver ``trials``, ``bestTrial``).
:class:`OwnedStatus` reads only the operator's keys, and :func:`merge_patch` is computed from what is
stored to what is wanted, so the trainer's keys are never in a patch the operator sends and can never be
overwritten by it.

This module must not talk to the API.
"""

from __future__ import annotations

from collections.abc import Mapping

import pydantic

from trainop.api import base
from trainop.api.trainingjob import Children, Failure, Phase
from trainop.controller import kinds


class OwnedStatus(base.ApiModel):
    """The status fields only the operator writes (the same for every kind; sweeps have no workers/gpus)."""

    phase: Phase | None = None
    conditions: list[base.Condition] = pydantic.Field(default_factory=list)
    observed_generation: int | None = None
    attempt: int = 0
    restarts: int = 0
    failures: list[Failure] = pydantic.Field(default_factory=list)
    children: Children | None = None
    workers: int | None = None
    gpus: int | None = None
    start_time: str | None = None
    completion_time: str | None = None
    next_restart_time: str | None = None

    @classmethod
    def from_status(cls, raw: Mapping[str, object] | None) -> OwnedStatus:
        return cls.model_validate(stored(raw), by_alias=True, by_name=False)

    def wire(self, kind: kinds.Kind) -> dict[str, object]:
        out = self.to_wire()
        if not kind.reports_workers:
            out.pop("workers", None)
            out.pop("gpus", None)
        return out


OWNED_WIRE_KEYS = frozenset(f.alias or name for name, f in OwnedStatus.model_fields.items())


def stored(raw: Mapping[str, object] | None) -> dict[str, object]:
    """The operator-owned part of a status exactly as stored: what a merge patch must be computed against
    (defaults the model would fill in, such as ``restarts: 0``, are not there until written)."""
    return {k: v for k, v in (raw or {}).items() if k in OWNED_WIRE_KEYS}


def merge_patch(old: Mapping[str, object], new: Mapping[str, object]) -> dict[str, object]:
    """An RFC 7386 JSON merge patch turning ``old`` into ``new`` (removed keys become null)."""
    patch: dict[str, object] = {}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            nested = merge_patch(before, value)
            if nested:
                patch[key] = nested
        elif value != before:
            patch[key] = value
    for key in old:
        if key not in new:
            patch[key] = None
    return patch
