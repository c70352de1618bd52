"""Session-scoped beds the e2e tier does not use, stopped before it starts.

The e2e tier runs last (``testpaths``) and brings up its own cluster bed. Until this module, the beds the
earlier tiers started (the shared control plane, the reliability tier's isolated one, the node agent's bed,
the trainer tier's Ray runtime) stayed up until pytest exited, and they were not idle: the shared plane's
controller-manager ran no pvc-protection controller then (it does now, tests/controlplane/flags.py), so every
test namespace that held a claim stayed Terminating and the namespace controller kept retrying it (CI
rehearsal 2026-11-27 00:36 UTC: about 0.9 of the box's 2 cores went to idle control planes while the e2e
scenarios' Ray pods waited for CPU).

Fixtures register a stop function when they start a bed; the root conftest calls :func:`stop_all` at the
setup of the first test after which only e2e tests remain. Every stop is idempotent, so the fixtures' own
finalizers still run at session end as before.
"""

from __future__ import annotations

from collections.abc import Callable

_STOPS: dict[str, Callable[[], None]] = {}


def register(name: str, stop: Callable[[], None]) -> None:
    _STOPS[name] = stop


def unregister(name: str) -> None:
    _STOPS.pop(name, None)


def stop_all() -> list[str]:
    """Stop every registered bed; return their names."""
    stopped = list(_STOPS)
    for name in stopped:
        _STOPS.pop(name)()
    return stopped
