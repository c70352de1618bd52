"""The per-rank watchdog: heartbeats of progress, shared between ranks, and a stall turned into a verdict.

Every rank keeps a ``Heartbeat``: the step it finished last and the phase it is in (``start-up``,
``forward_backward``, ``optimizer``, ``control``, ``checkpoint``, ``report``, ``evaluate``, ...) with the time
it entered it. A step, or entering or leaving a phase, is progress. A ``Watchdog`` thread per rank posts the
heartbeat, with the training thread's current frame (``file:line (function)``), once a second to a
key-value store every rank can reach, and checks its own progress. A rank that made no progress for
``spec.failurePolicy.stallTimeoutSeconds``:

1. reads every rank's heartbeat and names the stuck rank: a rank whose heartbeats stopped coming (a frozen
   process cannot speak: SIGSTOP, a hung driver call holding the GIL), else the rank at the lowest step,
   else the rank that is not inside a collective, else itself;
2. dumps the Python stacks of all its threads (``faulthandler.dump_traceback(all_threads=True)``) into the
   worker's log and into ``<runDir>/stalls/attempt-<N>-try-<k>-rank-<r>.txt``;
3. reports a ``Stalled`` failure (``failures.Failure``: the stuck rank, its step, where it was, the stacks
   file) through the store for the driver, and ends its process (exit code ``EXIT_STALLED``): the training
   thread is blocked in a collective and cannot be interrupted from Python, and a dead worker is what
   makes Ray Train end the worker group.

The store is a ``torch.distributed.TCPStore`` served by the driver (``ray_train``), not by a worker: the
default process group's store lives in rank 0's process under Ray Train, so a frozen rank 0 would freeze
the heartbeats of every rank with it. The driver also reads the failure reports from it after ``fit()``.
Without a store (torchrun, sweeps) each rank watches only itself: it still dumps its stacks and fails,
naming itself.

It must not know about models, checkpoints or Ray; the training loop only calls ``Heartbeat.step`` and
``Heartbeat.phase``.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import functools
import json
import logging
import os
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from trainop_trainer import failures, storage

log = logging.getLogger(__name__)

EXIT_STALLED = 86
# Phases in which a rank waits for the others: a rank stuck there is waiting, not the cause.
COLLECTIVE_PHASES = frozenset({"forward_backward", "control", "checkpoint", "report/evaluate/checkpoint"})
_POST_INTERVAL_S = 0.25  # a TCPStore set: ~0.1 ms; the peers' view of a rank lags by at most this
# Python's own library and installed packages: a frame there says *how* a rank waits (threading.py, a
# collective), not where in the training code it is (``_kind``).
_LIBRARY_DIRS = tuple(
    sorted({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})
)
_OWN_DIR = os.path.dirname(os.path.abspath(__file__))


# The number of the worker group that runs now inside the attempt (0, 1 after the first in-attempt
# restart, ...): bumped by whoever restarts the group (restart_policy, or the driver), read by each group as
# it starts, so one group's heartbeats and failure reports never meet another's.
GENERATION_KEY = "trainop/generation"


def store_key(attempt_try: int, what: str, rank: int) -> str:
    return f"trainop/{attempt_try}/{what}/{rank}"


def generation(store: Any, fallback: int) -> int:
    """The number of the worker group starting now (``fallback`` without a store or when it fails)."""
    if store is None:
        return fallback
    try:
        return int(store.add(GENERATION_KEY, 0))
    except Exception as exc:
        log.warning("reading the worker group's number from the driver's store failed (%s)", exc)
        return fallback


def connect(address: str | None, *, timeout_s: float = 30.0) -> Any:
    """A client of the driver's store at ``host:port`` (None when there is none or it cannot be reached)."""
    if not address:
        return None
    import torch.distributed as dist

    host, port = address.rsplit(":", 1)
    try:
        return dist.TCPStore(  # type: ignore[attr-defined]
            host,
            int(port),
            is_master=False,
            timeout=datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
    except Exception as exc:  # a watchdog that cannot share still watches its own rank
        log.warning("heartbeat store %s unreachable (%s); this rank watches only itself", address, exc)
        return None


class Heartbeat:
    """This rank's progress: written by the training thread (attribute stores only), read by the watchdog."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.phase_name = "start-up"
        now = time.time()
        self.phase_since = now
        self.progressed = now
        self.thread_id = threading.get_ident()

    def beat(self, step: int) -> None:
        self.step = step
        self.progressed = time.time()
        if self.phase_name == "start-up":  # a user's loop marks no phases: it is training now
            self.phase_name, self.phase_since = "training", self.progressed

    def enter(self, name: str) -> None:
        now = time.time()
        self.phase_name, self.phase_since, self.progressed = name, now, now

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        previous = self.phase_name
        self.enter(name)
        try:
            yield
        finally:
            self.enter(previous if previous != "start-up" else "step")

    def where(self) -> str | None:
        """``file:line (function)`` of the training thread's innermost frame that is not this module's; when
        that frame is not training code (Python's library, an installed package, this package's loop or
        checkpointer), the innermost training-code frame that led there follows (else the innermost frame
        of this package): ``threading.py:327 (wait) from train.py:40 (train)``."""
        return where(sys._current_frames().get(self.thread_id))

    def snapshot(self, rank: int) -> dict[str, Any]:
        return {
            "rank": rank,
            "step": self.step,
            "phase": self.phase_name,
            "phaseSince": self.phase_since,
            "progressed": self.progressed,
            "where": self.where(),
            "posted": time.time(),
        }


@functools.lru_cache(maxsize=4096)
def _kind(filename: str) -> int:
    """0: training code (the user's, or this package's built-in workloads); 1: the rest of this package (its
    loop, checkpointer, Ray glue); 2: Python's own library and installed packages. Cached per file name:
    every heartbeat (each 0.25 s) walks the training thread's whole stack."""
    path = os.path.abspath(filename)
    if path.startswith(_OWN_DIR + os.sep):
        return 0 if path.startswith(os.path.join(_OWN_DIR, "workloads") + os.sep) else 1
    return 2 if filename.startswith("<") or path.startswith(_LIBRARY_DIRS) else 0


def _frame_name(frame: Any) -> str:
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} ({frame.f_code.co_name})"


def where(frame: Any) -> str | None:
    """See ``Heartbeat.where``; ``frame`` is a thread's innermost frame (None: the thread is gone)."""
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    if frame is None:
        return None
    innermost = _frame_name(frame)
    best: tuple[int, Any] = (_kind(frame.f_code.co_filename), frame)
    caller = frame.f_back
    while caller is not None and best[0] > 0:
        kind = _kind(caller.f_code.co_filename)
        if kind < best[0]:
            best = (kind, caller)
        caller = caller.f_back
    return innermost if best[1] is frame else f"{innermost} from {_frame_name(best[1])}"


def stuck_rank(beats: dict[int, dict[str, Any]], *, me: int, now: float, silent_after_s: float) -> int:
    """The rank to blame for a stall (the module docstring's rule)."""
    silent = [r for r, b in beats.items() if now - float(b["posted"]) > silent_after_s]
    if silent:
        return min(silent, key=lambda r: (float(beats[r]["posted"]), r))
    steps = {r: b["step"] for r, b in beats.items()}
    known = [s for s in steps.values() if s is not None]
    if known and len(set(steps.values())) > 1:
        lowest = min(known)
        behind = [r for r, s in steps.items() if s is None or s == lowest]
        return min(behind)
    outside = [r for r, b in beats.items() if b["phase"] not in COLLECTIVE_PHASES]
    if outside and len(outside) < len(beats):
        return min(outside)
    return me


class Watchdog:
    def __init__(
        self,
        *,
        heartbeat: Heartbeat,
        rank: int,
        world_size: int,
        timeout_s: float,
        attempt: int,
        attempt_try: int,
        stalls_dir: storage.RunDir,
        store: Any = None,
        on_stall: Callable[[failures.Failure], None] | None = None,
    ) -> None:
        self.heartbeat = heartbeat
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.attempt = attempt
        self.attempt_try = attempt_try
        self.stalls_dir = stalls_dir
        self.store = store
        self.on_stall = on_stall or _exit_stalled
        self.interval_s = min(_POST_INTERVAL_S, max(0.05, timeout_s / 20))
        # A peer whose heartbeats stopped for this long cannot speak (frozen, or its process is gone).
        self.silent_after_s = max(8 * self.interval_s, min(5.0, timeout_s / 2))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainop-watchdog", daemon=True)
        self._store_failed = False

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    # ------------------------------------------------------------------------------------------ store
    def _post(self) -> None:
        if self.store is None:
            return
        try:
            key = store_key(self.attempt_try, "heartbeat", self.rank)
            self.store.set(key, json.dumps(self.heartbeat.snapshot(self.rank)))
        except Exception as exc:
            if not self._store_failed:
                log.warning("posting the heartbeat failed (%s); this rank watches only itself", exc)
            self._store_failed = True

    def read_beats(self) -> dict[int, dict[str, Any]]:
        beats = {self.rank: self.heartbeat.snapshot(self.rank)}
        if self.store is None:
            return beats
        for rank in range(self.world_size):
            key = store_key(self.attempt_try, "heartbeat", rank)
            if rank == self.rank:
                continue
            try:
                if self.store.check([key]):
                    beats[rank] = json.loads(self.store.get(key))
            except Exception as exc:
                log.warning("reading rank %d's heartbeat failed (%s)", rank, exc)
        return beats

    # ------------------------------------------------------------------------------------------- loop
    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._post()
            idle = time.time() - self.heartbeat.progressed
            if idle >= self.timeout_s:
                self.on_stall(self.stalled(idle))
                return

    def stalled(self, idle_s: float) -> failures.Failure:
        """Name the stuck rank, dump this rank's stacks, report: the verdict (also posted to the store)."""
        now = time.time()
        beats = self.read_beats()
        culprit = stuck_rank(beats, me=self.rank, now=now, silent_after_s=self.silent_after_s)
        stacks_path = self.dump_stacks()
        mine = beats[self.rank]
        theirs = beats.get(culprit, mine)
        silent = now - float(theirs["posted"])
        if culprit == self.rank:
            what = f"rank {culprit} made no progress for {idle_s:.0f} s"
        elif silent > self.silent_after_s:
            what = f"rank {culprit} made no progress and went silent {silent:.0f} s ago"
        else:
            idle_them = now - float(theirs["progressed"])
            what = f"rank {culprit} made no progress for {idle_them:.0f} s"
        step = theirs.get("step")
        if step is None:
            step = mine.get("step")
        where = f" in {theirs['phase']}" + (f" ({theirs['where']})" if theirs.get("where") else "")
        at = f" at step {theirs['step']}" if theirs.get("step") is not None else " before its first step"
        waited = ""
        if culprit != self.rank:
            waited = f"; rank {self.rank} waited {idle_s:.0f} s in {mine['phase']}"
            if mine.get("where"):
                waited += f" ({mine['where']})"
        failure = failures.Failure(
            reason=failures.STALLED,
            message=f"{what}{where}{at}{waited}; stacks in {stacks_path}",
            rank=culprit,
            step=step,
        )
        log.error("watchdog: %s", failure.message)
        if self.store is not None:
            with contextlib.suppress(Exception):
                key = store_key(self.attempt_try, "failure", self.rank)
                self.store.set(key, json.dumps(failure.to_dict()))
        return failure

    def dump_stacks(self) -> str:
        """Every thread's Python stack into the worker's log (stderr) and the stalls file (its path)."""
        with contextlib.suppress(Exception):
            sys.stderr.write(f"trainop watchdog: rank {self.rank}: stacks of all threads\n")
            sys.stderr.flush()
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        path = self.stalls_dir / f"attempt-{self.attempt}-try-{self.attempt_try}-rank-{self.rank}.txt"
        with tempfile.TemporaryFile("w+") as scratch:
            faulthandler.dump_traceback(file=scratch, all_threads=True)
            scratch.seek(0)
            text = scratch.read()
        snapshot = json.dumps(self.heartbeat.snapshot(self.rank))
        try:
            storage.write_text(path, f"rank {self.rank} heartbeat: {snapshot}\n\n{text}")
        except Exception as exc:
            log.error("writing the stacks to %s failed (%s); they are in this worker's log", path, exc)
        return str(path)


def _exit_stalled(failure: failures.Failure) -> None:
    del failure
    logging.shutdown()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(EXIT_STALLED)
