"""Named crash points for the kill-and-restart tests: ``TRAINOP_FAILPOINTS`` makes the process SIGKILL itself.

``TRAINOP_FAILPOINTS=status-written:Restarting`` kills the operator right after it wrote a status whose
phase is Restarting, before it acted on it (deleted the failed RayJob): the precise windows where a
controller that is not idempotent duplicates children or loses a failure. Several points may be given,
comma-separated; a point without ``:<qualifier>`` fires on its first hit.

Unset (always, outside tests) every call is a set lookup on an empty set. This module must not do
anything else.
"""

from __future__ import annotations

import os
import signal

ENV = "TRAINOP_FAILPOINTS"

_ARMED = frozenset(p.strip() for p in os.environ.get(ENV, "").split(",") if p.strip())


def hit(name: str, qualifier: str = "") -> None:
    if _ARMED and (name in _ARMED or f"{name}:{qualifier}" in _ARMED):
        os.kill(os.getpid(), signal.SIGKILL)
