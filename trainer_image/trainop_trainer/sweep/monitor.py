"""The driver's view of the sweep on the CR: a Tune ``Callback`` that keeps the books and publishes them,
and a Tune ``Stopper`` that ends the sweep at the goal or when too many trials failed.

``SweepMonitor`` feeds ``book.TrialBook`` from Tune's events (trial start/result/complete/error and, at
every controller step, every trial's status) and publishes ``status.trials``, ``status.bestTrial`` and
``status.updated`` through the trainer's own status sinks (``trainop_trainer.status``): ``FileSink`` to
``<experiment>/status.json`` always, ``KubernetesSink`` (a JSON merge patch of the status subresource, in a
background thread, latest record wins, retried with backoff) when the config names a ``statusTarget`` —
the same code path and credentials as the trainer's rank 0, allowed by the sweep's narrow Role
(``patch`` on ``tuningsweeps/status`` of this sweep only). It also writes ``<experiment>/trials.json``
(one row per trial) for local mode's table.

Publishing is throttled: at most every ``min_interval_s`` (results arrive every few seconds per trial and
a status patch per result would load the API server for nothing), and only when something a user sees
changed; the experiment's end always publishes.

Tune pickles both objects with the Tuner (``tuner.pkl``) and restores copies on ``Tuner.restore``, so
they hold no live resources (sinks are opened on first publish and dropped when pickled). The book's
content comes back from Tune's experiment checkpoint through ``get_state`` / ``set_state``; how the stopper
finds the live book is said in ``SweepStopper``.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import signal
import threading
import time
from typing import Any

from ray.tune import Callback, Stopper

from trainop.api import trainer_config, tuningsweep
from trainop_trainer import run_record, status
from trainop_trainer.sweep import book as book_module
from trainop_trainer.sweep import layout, space

log = logging.getLogger(__name__)

DEFAULT_MIN_INTERVAL_S = 5.0
# The book of each running experiment (by experiment directory), for its stopper: see SweepStopper.
_LIVE_BOOKS: dict[str, book_module.TrialBook] = {}
# The failure budget each running experiment's stopper enforces (by experiment directory), for the
# driver's outcome: a restored stopper keeps the limit it was created with, whatever the spec says now.
_FAILURE_BUDGETS: dict[str, int] = {}


def pop_failure_budget(key: str, default: int) -> int:
    """The limit the stopper of the experiment ``key`` enforced (``default`` if it never ran)."""
    return _FAILURE_BUDGETS.pop(key, default)


# The line of a formatted exception: "pkg.module.SomeError: message".
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\w*): (.*)$")


def error_summary(text: str) -> str:
    """One line for the status and the table out of Tune's text of a trial's error (which wraps the
    user's error in Ray's traceback): the last ``Type: message`` line, with the detail that follows a
    wrapper's ``...errors:`` line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for index in range(len(lines) - 1, -1, -1):
        match = _EXCEPTION_LINE.match(lines[index])
        if match is None:
            continue
        name, message = match.group(1).rsplit(".", 1)[-1], match.group(2).strip()
        if message.endswith(":"):
            detail = next((line for line in lines[index + 1 :] if not line.startswith("[")), "")
            message = f"{message} {detail}".strip()
        return f"{name}: {message}"[:500]
    return (lines[-1] if lines else "failed without an error message")[:500]


def trial_error(trial: Any) -> str:
    """The summary of a failed Tune trial's latest error, from the error file Tune wrote on the driver."""
    try:
        text = pathlib.Path(trial.error_file).read_text()
    except (OSError, TypeError):
        return "failed (Tune recorded no error text)"
    return error_summary(text.rsplit("Failure # ", 1)[-1])


class StatusPublisher:
    """Status records to the status file (always) and the CR (with a target); trial rows to trials.json."""

    def __init__(
        self, *, paths: layout.SweepPaths, sweep_name: str, target: trainer_config.StatusTarget | None
    ) -> None:
        self.paths = paths
        self.sweep_name = sweep_name
        self.target = target
        self._sinks: list[status.Sink] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_sinks"] = None
        return state

    def _open(self) -> list[status.Sink]:
        if self._sinks is None:
            sinks: list[status.Sink] = [status.FileSink(self.paths.status_file)]
            if self.target is not None:
                sinks.append(status.KubernetesSink(self.target))
            self._sinks = sinks
        return self._sinks

    def checkpoint_of(self, trial_id: str) -> str | None:
        """The newest checkpoint of a trial: the one its own trainer recorded (``<run>/status.json``), or a
        newer committed one next to it. The trainer records a checkpoint after committing it, and ASHA may
        stop a trial at ``maxT`` (its last step) between the two (seen once in a CI rehearsal, 2026-11-27)."""
        run_status = self.paths.run_dir(self.sweep_name, trial_id) / "status.json"
        try:
            path = json.loads(run_status.read_text()).get("checkpoint", {}).get("path")
        except (OSError, ValueError):
            return None
        if not path:
            return None
        from trainop_trainer import checkpoint_store

        recorded = str(path)
        step = checkpoint_store.step_of_dir_name(pathlib.Path(recorded).name)
        if step is None:
            return recorded
        try:
            store = checkpoint_store.CheckpointStore(pathlib.Path(recorded).parent)
            newest = max(store.committed_steps(), default=-1)
        except Exception:  # a directory this process cannot list (another machine's path): the record
            return recorded
        return store.step_path(newest).path if newest > step else recorded

    def publish(self, records: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        for sink in self._open():
            try:
                sink.publish(records)
            except Exception:
                log.exception("sweep status sink %s failed", type(sink).__name__)
        _write_json(self.paths.trials_file, {"trials": rows, "updated": records.get("updated")})

    def close(self, timeout_s: float = 10.0) -> None:
        for sink in self._sinks or []:
            sink.close(timeout_s)
        self._sinks = None


def _write_json(path: pathlib.Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)


class SweepMonitor(Callback):
    """Keeps ``book`` up to date from Tune's events and publishes it through ``publisher``."""

    def __init__(
        self,
        *,
        book: book_module.TrialBook,
        publisher: StatusPublisher,
        spec: tuningsweep.TuningSweepSpec,
        key: str,
        min_interval_s: float = DEFAULT_MIN_INTERVAL_S,
    ) -> None:
        self.key = key
        self.book = book
        self.publisher = publisher
        self.spec = spec
        self.min_interval_s = min_interval_s
        self._last_published: tuple[str, str] | None = None
        self._last_publish_time = float("-inf")

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_last_published"] = None
        state["_last_publish_time"] = float("-inf")
        return state

    # ---------------------------------------------------------------------------------- Tune's hooks
    def setup(
        self,
        stop: Any = None,
        num_samples: int | None = None,
        total_num_samples: int | None = None,
        **info: Any,
    ) -> None:
        _LIVE_BOOKS[self.key] = self.book

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.book.started(trial.trial_id)

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        self.book.result(trial.trial_id, result)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.book.completed(trial.trial_id)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.book.errored(trial.trial_id, trial_error(trial))
        log.warning("trial %s failed: %s", trial.trial_id, self.book.records[trial.trial_id].error)

    def on_step_begin(self, iteration: int, trials: list[Any], **info: Any) -> None:
        # Before Tune asks the stopper: a restored experiment has put its failed trials back to PENDING
        # (resume_errored), and the failure budget must not count them as failed any more.
        self._observe(trials)

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        self._observe(trials)
        self._maybe_publish(force=False)

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        # Not ``_observe(trials)``: Tune calls this from its cleanup, after stopping the actors of the trials
        # still running and marking them TERMINATED, which the book would read as early-stopped. Tune's
        # last checkpoint of the experiment (its final one, or the last periodic one when an error ends the
        # loop) is older and keeps them unfinished, so the next attempt resumes them, whatever ended this
        # one: the failure budget, a Ctrl+C, an error. The last ``on_step_end`` observed every other status
        # (a goal's stop_all included: those trials are TERMINATED for good and count as early-stopped).
        self.book.requeue_unfinished()
        self._maybe_publish(force=True)
        self.publisher.close()
        _LIVE_BOOKS.pop(self.key, None)

    def get_state(self) -> dict[str, Any] | None:
        return self.book.to_state()

    def set_state(self, state: dict[str, Any]) -> None:
        self.book.load_state(state)

    # ------------------------------------------------------------------------------------- publishing
    def _observe(self, trials: list[Any]) -> None:
        for trial in trials:
            self.book.observe(
                trial.trial_id, status=trial.status, parameters=space.parameters_of(trial.config, self.spec)
            )

    def records(self) -> dict[str, Any]:
        """``trials`` and ``bestTrial``, always both: the sinks merge records by key (the status file) and
        by JSON merge patch (the CR), so a best trial that has failed since, or a checkpoint the new best
        lacks, is cleared with a null rather than left behind."""
        records: dict[str, Any] = {"trials": self.book.counts().to_wire(), "bestTrial": None}
        best = self.book.best()
        if best is not None and best.best_value is not None:
            records["bestTrial"] = tuningsweep.BestTrial(
                id=best.id,
                parameters=best.parameters,
                metric=self.book.metric,
                value=best.best_value,
                checkpoint=self.publisher.checkpoint_of(best.id),
            ).to_wire()
        return records

    def _maybe_publish(self, *, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self._last_publish_time < self.min_interval_s:
            return
        records = self.records()
        rows = self.book.rows()
        fingerprint = (json.dumps(records, sort_keys=True), json.dumps(rows, sort_keys=True, default=str))
        if not force and fingerprint == self._last_published:
            return
        records["updated"] = run_record.utc_now()
        self.publisher.publish(records, rows)
        self._last_published = fingerprint
        self._last_publish_time = now


class SweepStopper(Stopper):
    """Ends the sweep at ``objective.goal``, and interrupts it when more than ``maxFailedTrials`` failed.

    Goal: the trial whose result reaches it is stopped, then every other trial (Tune's ``stop_all``): the
    sweep is done, and a restore finds nothing left to run.

    Failure budget: the attempt must end, but the trials still running or waiting must not be lost. Tune's
    ``stop_all`` would mark them TERMINATED, i.e. finished for good (a restore never runs them again, and
    the search stops generating the rest). So the stopper ends the attempt the way Tune ends an interrupted
    run: it sends the driver process ``SIGUSR1``, on which Tune's handler stops the loop, checkpoints the
    experiment with those trials still unfinished, and returns. The next attempt restores them (and the
    failed ones, ``resume_errored``). Tune installs that handler only when ``fit()`` runs on the main
    thread; elsewhere the stopper falls back to ``stop_all``, and the trials still running then end for
    good (early-stopped, never resumed).

    Failures are not results, so the stopper counts them in the monitor's book. It cannot hold that book
    itself: Tune checkpoints a stopper with its controller's state and restores that copy apart from the
    callbacks (restored from ``tuner.pkl`` plus their ``get_state``), so after a restore a book held here
    would be a stale copy that still counts the failed trials Tune has just queued again. The monitor
    registers its live book under the experiment directory when Tune sets it up; the stopper looks it up.
    """

    def __init__(
        self, *, key: str, metric: str, mode: tuningsweep.Mode, goal: float | None, max_failed_trials: int
    ) -> None:
        self.key = key
        self.metric = metric
        self.mode = mode
        self.goal = goal
        self.max_failed_trials = max_failed_trials
        self.goal_reached = False

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        if book_module.reaches_goal(result.get(self.metric), goal=self.goal, mode=self.mode):
            self.goal_reached = True
            return True
        return False

    def stop_all(self) -> bool:
        _FAILURE_BUDGETS[self.key] = self.max_failed_trials
        if self.goal_reached:
            return True
        book = _LIVE_BOOKS.get(self.key)
        if book is None or len(book.failed()) <= self.max_failed_trials:
            return False
        if book.interrupted:
            return False  # asked already; Tune ends the loop after this step
        book.interrupted = True
        log.warning(
            "%d trials failed, more than maxFailedTrials (%d): ending this attempt; unfinished trials "
            "resume in the next one",
            len(book.failed()),
            self.max_failed_trials,
        )
        if _tune_interrupt_handler_installed():
            os.kill(os.getpid(), signal.SIGUSR1)
            return False
        return True


def _tune_interrupt_handler_installed() -> bool:
    """Whether SIGUSR1 reaches Tune's interrupt handler (installed by ``tune.run`` on the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    handler = signal.getsignal(signal.SIGUSR1)
    return callable(handler) and getattr(handler, "__module__", "").startswith("ray.tune")
