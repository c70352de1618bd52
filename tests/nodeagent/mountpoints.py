"""Host mountpoints the agents had to create, counted across every bed on the machine, removed again.

A container's root filesystem is the host's, so a mountPath such as
``/var/run/secrets/kubernetes.io/serviceaccount`` or an image path such as ``/manager`` needs an empty
directory or file on the host to mount over. Several agents (one per bed, other test sessions included)
share the host's filesystem and so these mountpoints: removing one that another bed's container is
mounted on would detach that mount. So there is one registry for the machine,
``/run/trainop-bed/mountpoints.json``, changed only under ``flock`` of ``mountpoints.lock``: for each
path an agent created, the number of containers using it per bed. A path is removed (only if still
empty) when no bed uses it any more; the uses of a bed whose lock nobody holds are dropped by the next
agent start (:func:`remove_leftovers`), so a crashed agent's mountpoints go too.

It removes only what an agent created and only while empty: a file or directory someone wrote into
stays, and paths that existed before are never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.clusterbed import network

#: path -> {bed id (str) -> containers using it}; insertion order is creation order (parents first).
Registry = dict[str, dict[str, int]]


def _registry_path() -> Path:
    return network.BED_DIR / "mountpoints.json"


@contextlib.contextmanager
def _locked_registry() -> Iterator[Registry]:
    """The machine-wide registry, held under its flock; written back when the block ends."""
    network.BED_DIR.mkdir(parents=True, exist_ok=True)
    with open(network.BED_DIR / "mountpoints.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            registry: Registry = json.loads(_registry_path().read_text())
        except (FileNotFoundError, ValueError):
            registry = {}
        yield registry
        tmp = _registry_path().with_suffix(".tmp")
        tmp.write_text(json.dumps(registry))
        os.replace(tmp, _registry_path())


def _remove_if_empty(path: str) -> bool:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)
        elif os.path.isfile(path) and os.path.getsize(path) == 0:
            os.unlink(path)
        else:
            return not os.path.lexists(path)
    except OSError:
        return False
    return True


def _make(target: str, kind: str) -> list[str]:
    """Create ``target`` (a "dir" or an empty "file") and its missing parents; return what was made."""
    missing: list[str] = []
    path = target
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    made: list[str] = []
    for path in reversed(missing):
        if path == target and kind == "file":
            with open(path, "a"):
                pass
        else:
            os.mkdir(path, 0o755)
        made.append(path)
    return made


def _on_the_way(registry: Registry, target: str) -> list[str]:
    """Registered paths that are ``target`` or one of its ancestors."""
    return [path for path in registry if path == target or target.startswith(path + "/")]


def _collect(registry: Registry) -> None:
    """Remove (deepest first) registered paths nobody uses; keep the ones that cannot go yet."""
    for path in reversed(list(registry)):
        if not any(registry[path].values()) and _remove_if_empty(path):
            del registry[path]


class Mountpoints:
    """One agent's view of the registry: its bed's uses."""

    def __init__(self, bed_id: int) -> None:
        self.bed = str(bed_id)
        self._lock = threading.Lock()

    def acquire(self, target: str, *, kind: str) -> None:
        """Make sure ``target`` exists; count one more use of whatever agents created on its way."""
        target = os.path.normpath(target)
        with self._lock, _locked_registry() as registry:
            for path in _make(target, kind):
                registry.setdefault(path, {})
            for path in _on_the_way(registry, target):
                registry[path][self.bed] = registry[path].get(self.bed, 0) + 1

    def release(self, target: str) -> None:
        """One use fewer; remove what agents created and no bed uses any more."""
        target = os.path.normpath(target)
        with self._lock, _locked_registry() as registry:
            for path in _on_the_way(registry, target):
                registry[path][self.bed] = max(0, registry[path].get(self.bed, 0) - 1)
            _collect(registry)

    def release_all(self) -> None:
        """Drop every use of this bed (the agent stops)."""
        with self._lock:
            _drop_beds(lambda bed: bed == self.bed)


def _drop_beds(dead: Callable[[str], bool]) -> list[str]:
    with _locked_registry() as registry:
        for users in registry.values():
            for bed in [bed for bed in users if dead(bed)]:
                del users[bed]
        before = set(registry)
        _collect(registry)
        return sorted(before - set(registry))


def remove_leftovers(bed_id: int) -> list[str]:
    """Drop the uses of bed ``bed_id`` and of every bed nobody holds; return the paths removed."""
    return _drop_beds(lambda bed: bed == str(bed_id) or not network.bed_is_live(int(bed)))
