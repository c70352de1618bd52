"""What rank 0 records about a run beside the checkpoints (``<run>/trainop/``: volume or bucket).

- ``events.jsonl``: one JSON line per worker-group ``start`` (with the launch id, attempt and world size) and
  per ``resume`` (the checkpoint step and path). Worker-group restarts inside one ``fit()`` are the starts of
  that launch less one: Ray Train restarts the group with the same launch settings.
- ``outcome.json``: how this launch's training ended (completed / stopped / preempted, at which step), read by
  the driver after ``fit()`` returns.

Only rank 0 writes; every method is a no-op elsewhere. It must not decide anything.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from trainop_trainer import config as config_module
from trainop_trainer import storage


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class RunRecord:
    def __init__(self, *, paths: config_module.RunPaths, launch_id: str, is_rank0: bool) -> None:
        self._paths = paths
        self._launch_id = launch_id
        self._is_rank0 = is_rank0

    def _event(self, event: str, **fields: Any) -> None:
        record = {"event": event, "launch": self._launch_id, "time": utc_now(), **fields}
        storage.append_line(self._paths.events_file, json.dumps(record))

    def started(self, *, attempt: int, world_size: int) -> int:
        """Record a worker-group start; returns how many restarts of this launch preceded it (rank 0)."""
        if not self._is_rank0:
            return 0
        self._event("start", attempt=attempt, worldSize=world_size)
        starts = 0
        for line in self._paths.events_file.read_text().splitlines():
            record = json.loads(line)
            if record.get("event") == "start" and record.get("launch") == self._launch_id:
                starts += 1
        return starts - 1

    def resumed(self, *, step: int, path: str) -> None:
        if self._is_rank0:
            self._event("resume", step=step, path=path)

    def outcome(self, outcome: str, step: int) -> None:
        if not self._is_rank0:
            return
        record = {"launch": self._launch_id, "outcome": outcome, "step": step}
        storage.write_text(self._paths.outcome_file, json.dumps(record))
