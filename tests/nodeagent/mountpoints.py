"""Host mountpoints the agent had to create, counted and removed again.

A container's root filesystem is the host's, so a mountPath such as
``/var/run/secrets/kubernetes.io/serviceaccount`` or an image path such as ``/manager`` needs an empty
directory or file on the host to mount over. This registry creates them (and their missing parents),
counts how many running containers use each, removes them when the last one is gone, and writes the
list to ``/run/trainop-bed/<bed>.mountpoints`` so the next agent start removes what a crashed agent left.

It removes only what it created and only while empty: a file or directory someone wrote into stays.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections import Counter
from pathlib import Path

from tests.clusterbed import network


def registry_path(bed_id: int) -> Path:
    return network.BED_DIR / f"{bed_id}.mountpoints"


def _remove_if_empty(path: str) -> None:
    with contextlib.suppress(OSError):
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)
        elif os.path.isfile(path) and os.path.getsize(path) == 0:
            os.unlink(path)


class Mountpoints:
    def __init__(self, bed_id: int) -> None:
        self._path = registry_path(bed_id)
        self._lock = threading.Lock()
        #: Paths we created, in creation order (parents before children), with their user counts.
        self._created: list[str] = []
        self._users: Counter[str] = Counter()

    def acquire(self, target: str, *, kind: str) -> None:
        """Make sure ``target`` exists (``kind`` "dir" or "file"); count one more user of what we made."""
        with self._lock:
            target = os.path.normpath(target)
            made = self._make(target, kind)
            self._created.extend(path for path in made if path not in self._created)
            for path in self._created_on_the_way(target):
                self._users[path] += 1
            self._save()

    def release(self, target: str) -> None:
        """One user fewer; remove (deepest first) what we created and nobody uses any more."""
        with self._lock:
            for path in self._created_on_the_way(os.path.normpath(target)):
                self._users[path] -= 1
            for path in reversed(list(self._created)):
                if self._users[path] <= 0:
                    _remove_if_empty(path)
                    self._created.remove(path)
                    del self._users[path]
            self._save()

    def release_all(self) -> None:
        with self._lock:
            for path in reversed(self._created):
                _remove_if_empty(path)
            self._created.clear()
            self._users.clear()
            self._save()

    def _created_on_the_way(self, target: str) -> list[str]:
        """What we created of ``target`` and its ancestors."""
        return [path for path in self._created if path == target or target.startswith(path + "/")]

    @staticmethod
    def _make(target: str, kind: str) -> list[str]:
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

    def _save(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        if self._created:
            self._path.write_text(json.dumps(self._created))
        else:
            self._path.unlink(missing_ok=True)


def remove_leftovers(bed_id: int) -> list[str]:
    """Remove (if empty) what a previous agent of bed ``bed_id`` created; return those paths."""
    path = registry_path(bed_id)
    try:
        created: list[str] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return []
    for entry in reversed(created):
        _remove_if_empty(entry)
    path.unlink(missing_ok=True)
    return created
