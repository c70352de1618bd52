"""What a user watches, recorded: ``kubectl get ... --watch -o json`` streams, printer columns, timelines.

``KubectlWatch`` runs the real kubectl with ``--watch -o json`` and keeps every version of the watched
objects it prints, with the second it arrived. JSON rather than the table so that nothing is lost to
column alignment; the table's columns are then computed from the CRD's own ``additionalPrinterColumns``
(``PrinterColumns``, read from the cluster), so ``columns["Step"]`` is what ``kubectl get trainingjobs``
shows in its STEP column. ``Timeline`` turns the streams (the owner, its RayJobs, the namespace's Events)
and the scenario's own actions into the short table each scenario prints and docs/e2e.md quotes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from e2e import cluster as cluster_module

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Sample:
    seconds: float  # since the timeline started
    obj: Obj


def jsonpath(obj: Obj, path: str) -> Any:
    """The value at a simple JSONPath of dotted keys (``.status.progress.step``), None when absent."""
    value: Any = obj
    for key in path.strip(".").split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


class PrinterColumns:
    """The CRD's ``additionalPrinterColumns``: ``values(obj)`` gives the cells kubectl prints."""

    def __init__(self, columns: list[tuple[str, str, int]]) -> None:
        self.columns = columns

    @classmethod
    def of(cls, cluster: cluster_module.Cluster, crd: str) -> PrinterColumns:
        definition = cluster.kubectl_json("get", "crd", crd)
        version = next(v for v in definition["spec"]["versions"] if v.get("served"))
        return cls(
            [
                (c["name"], c["jsonPath"], int(c.get("priority", 0)))
                for c in version.get("additionalPrinterColumns", [])
            ]
        )

    def values(self, obj: Obj) -> dict[str, Any]:
        return {"Name": obj["metadata"]["name"]} | {
            name: jsonpath(obj, path) for name, path, _ in self.columns
        }


class KubectlWatch:
    """``kubectl get <resource> [<name>] -n <ns> [-l <selector>] --watch -o json``, read in a thread."""

    def __init__(
        self,
        cluster: cluster_module.Cluster,
        resource: str,
        *,
        namespace: str,
        name: str | None = None,
        selector: str | None = None,
        clock: Callable[[], float],
        on_object: Callable[[Sample], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.args = ["get", resource, *([name] if name else []), "-n", namespace, "--watch", "-o", "json"]
        if selector:
            self.args += ["-l", selector]
        self.clock = clock
        self.on_object = on_object
        self.samples: list[Sample] = []
        self._changed = threading.Condition()
        self._process: Any = None
        self._thread: threading.Thread | None = None
        self._stopped = False
        self.stderr = ""

    def start(self) -> KubectlWatch:
        self._process = self.cluster.kubectl_popen(*self.args)
        self._thread = threading.Thread(target=self._read, name=f"kubectl-{self.args[1]}", daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        decoder = json.JSONDecoder()
        buffer = ""
        fd = self._process.stdout.fileno()
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            buffer += chunk.decode()
            while True:
                stripped = buffer.lstrip()
                if not stripped:
                    buffer = ""
                    break
                try:
                    obj, end = decoder.raw_decode(stripped)
                except json.JSONDecodeError:
                    buffer = stripped  # an object split across reads: wait for the rest
                    break
                buffer = stripped[end:]
                sample = Sample(seconds=self.clock(), obj=obj)
                with self._changed:
                    self.samples.append(sample)
                    self._changed.notify_all()
                if self.on_object is not None:
                    self.on_object(sample)
        self.stderr = self._process.stderr.read()
        with self._changed:
            self._changed.notify_all()

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def latest(self, name: str | None = None) -> Obj | None:
        with self._changed:
            for sample in reversed(self.samples):
                if name is None or sample.obj["metadata"]["name"] == name:
                    return sample.obj
        return None

    def wait_for(self, predicate: Callable[[Obj], bool], *, timeout_s: float, what: str) -> Obj:
        """The first object version (seen so far or arriving) for which ``predicate`` holds."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        with self._changed:
            while True:
                for sample in self.samples[seen:]:
                    if predicate(sample.obj):
                        return sample.obj
                seen = len(self.samples)
                if not self.alive and not self._stopped:
                    raise AssertionError(f"kubectl {' '.join(self.args)} exited: {self.stderr}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
                self._changed.wait(min(left, 1.0))

    def stop(self) -> None:
        self._stopped = True
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(timeout=10)
        if self._thread is not None:
            self._thread.join(timeout=10)


# The printer columns a timeline shows next to phase and attempt, per kind.
SHOWN_COLUMNS = {"TrainingJob": ("Step", "Checkpoint"), "TuningSweep": ("Trials", "Running", "Best")}


@dataclasses.dataclass(frozen=True)
class Row:
    seconds: float
    event: str
    phase: str
    attempt: str
    cells: tuple[str, ...]  # SHOWN_COLUMNS of the owner's kind
    progress_only: bool = False  # only STEP/CHECKPOINT changed: runs of these are folded into one row


class Timeline:
    """Seconds since start, what happened, and the owner's phase / attempt / STEP / CHECKPOINT columns."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.columns: PrinterColumns | None = None
        self.shown: tuple[str, ...] = SHOWN_COLUMNS["TrainingJob"]
        self.started = time.monotonic()
        self.rows: list[Row] = []
        self._state: tuple[Any, ...] = ()
        self._owner: Obj = {}
        self._ray_jobs: dict[str, tuple[str, str]] = {}
        self._events: set[str] = set()
        self._lock = threading.Lock()

    def clock(self) -> float:
        return time.monotonic() - self.started

    def follow(self, kind: str, columns: PrinterColumns) -> None:
        """Show ``kind``'s printer columns (``SHOWN_COLUMNS``) from now on."""
        self.columns = columns
        self.shown = SHOWN_COLUMNS[kind]

    def restart(self) -> None:
        """Count seconds from now (a scenario that waited for its turn starts its clock when it acts)."""
        with self._lock:
            self.started = time.monotonic()
            self.rows.clear()

    def _add(self, seconds: float, event: str, *, progress_only: bool = False) -> None:
        status = self._owner.get("status") or {}
        cells = self.columns.values(self._owner) if self.columns and self._owner else {}
        self.rows.append(
            Row(
                seconds=seconds,
                event=event,
                phase=str(status.get("phase") or "-"),
                attempt=str(status.get("attempt") or "-"),
                cells=tuple(_cell(cells.get(name)) for name in self.shown),
                progress_only=progress_only,
            )
        )

    def note(self, event: str) -> None:
        with self._lock:
            self._add(self.clock(), event)

    def observe_owner(self, sample: Sample) -> None:
        """A row whenever what ``kubectl get`` shows (or the restarts inside the attempt) changes."""
        obj = sample.obj
        status = obj.get("status") or {}
        progress = status.get("progress") or {}
        state = (
            status.get("phase"),
            status.get("attempt"),
            progress.get("step"),
            (status.get("checkpoint") or {}).get("step"),
            status.get("restarts"),
            progress.get("workerRestarts"),
            (status.get("bestTrial") or {}).get("id"),
            _trials(status.get("trials")),
        )
        with self._lock:
            previous = self._state
            self._owner = obj
            if state == previous:
                return
            self._state = state
            changes: list[str] = []
            names = (
                "phase",
                "attempt",
                "step",
                "checkpoint",
                "restarts",
                "workerRestarts",
                "bestTrial",
                "trials",
            )
            for key, old, new in zip(names, previous or (None,) * len(state), state, strict=True):
                if old == new or new is None:
                    continue
                if key == "phase":
                    changes.append(f"phase {new}")
                elif key == "trials":
                    changes.append(str(new))
                elif key == "bestTrial":
                    best = status["bestTrial"]
                    changes.append(f"bestTrial {new} ({best.get('metric')}={best.get('value'):.4g})")
                else:
                    changes.append(f"{key}={new}")
            if not changes:
                return
            progress_only = all(change.startswith(("step=", "checkpoint=")) for change in changes)
            self._add(sample.seconds, f"{obj['kind']}: " + ", ".join(changes), progress_only=progress_only)

    def observe_ray_job(self, sample: Sample) -> None:
        obj = sample.obj
        status = obj.get("status") or {}
        name = obj["metadata"]["name"]
        state = (str(status.get("jobDeploymentStatus") or "-"), str(status.get("jobStatus") or "-"))
        with self._lock:
            if self._ray_jobs.get(name) == state:
                return
            self._ray_jobs[name] = state
            if obj["metadata"].get("deletionTimestamp"):
                return
            self._add(sample.seconds, f"RayJob {name}: {state[0]}/{state[1]}")

    def observe_event(self, sample: Sample) -> None:
        event = sample.obj
        key = event["metadata"]["uid"]
        with self._lock:
            if key in self._events:
                return
            self._events.add(key)
            involved = event.get("involvedObject") or {}
            message = " ".join(str(event.get("message", "")).split())
            if len(message) > 72:
                message = message[:71] + "…"
            self._add(sample.seconds, f"Event {involved.get('kind')}/{event.get('reason')}: {message}")

    def render(self) -> str:
        with self._lock:
            rows = _fold_progress(sorted(self.rows, key=lambda row: row.seconds))
        width = max([len(row.event) for row in rows] + [5])
        widths = [max([len(name)] + [len(row.cells[i]) for row in rows]) for i, name in enumerate(self.shown)]
        header = " ".join(f"{name.upper():>{w}}" for name, w in zip(self.shown, widths, strict=True))
        lines = [self.title, f"{'t (s)':>7}  {'event':<{width}}  {'phase':<12} {'attempt':>7} {header}"]
        for row in rows:
            cells = " ".join(f"{cell:>{w}}" for cell, w in zip(row.cells, widths, strict=True))
            lines.append(
                f"{row.seconds:>7.1f}  {row.event:<{width}}  {row.phase:<12} {row.attempt:>7} {cells}"
            )
        return "\n".join(lines)


def _fold_progress(rows: list[Row]) -> list[Row]:
    """Runs of rows where only STEP/CHECKPOINT changed become one row at the run's start, with the ranges
    the columns went through: "step=120..600, checkpoint=200..600 (25 updates, until 80.2s)"."""
    folded: list[Row] = []
    run: list[Row] = []

    def flush() -> None:
        if len(run) <= 2:
            folded.extend(run)
        else:
            first, last = run[0], run[-1]
            ranges = []
            for index, name in enumerate(("step", "checkpoint")):
                if len({row.cells[index] for row in run}) == 1:
                    continue  # this column did not move during the run
                values = [row.cells[index] for row in run if row.cells[index] != "-"]
                shown = values[0] if values[0] == values[-1] else f"{values[0]}..{values[-1]}"
                ranges.append(f"{name}={shown}")
            kind = first.event.split(":")[0]
            event = f"{kind}: {', '.join(ranges)} ({len(run)} updates, until {last.seconds:.1f}s)"
            folded.append(dataclasses.replace(last, seconds=first.seconds, event=event))
        run.clear()

    for row in rows:
        if row.progress_only:
            run.append(row)
            continue
        flush()
        folded.append(row)
    flush()
    return folded


def _trials(trials: Obj | None) -> str | None:
    """``status.trials`` in words: "trials 1/3 succeeded, 2 running" (zero counts left out)."""
    if not trials:
        return None
    parts = [f"{trials.get('succeeded', 0)}/{trials.get('total', 0)} succeeded"]
    parts += [
        f"{trials[key]} {key}" for key in ("running", "pending", "failed", "earlyStopped") if trials.get(key)
    ]
    return "trials " + ", ".join(parts)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)
