"""Preemption: SIGTERM -> checkpoint at the next step -> clean exit, and the pod's preStop helper.

In a worker process, ``install()`` registers a SIGTERM handler that only records the signal; the train loop
sees ``requested()`` at its next step, every rank agrees through the control channel, a checkpoint is
written synchronously, and the process that received the signal exits 0. Python only lets the main thread
install handlers, and Ray Train runs the training function on a separate thread of its worker actor, so
under Ray the handler is installed by running ``_install_handler`` as a task of the worker actor itself
(its main thread executes actor tasks).

A Kubernetes pod's SIGTERM goes to the container's PID 1 (Ray's ``ray start``), not to the training
processes, so each worker also writes its PID into ``$TRAINOP_PID_DIR`` (default /tmp/trainop/pids), and
the worker pods get a preStop hook::

    python -m trainop_trainer.preempt --timeout 60

which sends SIGTERM to every registered training process of the pod and waits for them to exit (the
kubelet runs preStop before it signals the containers, within terminationGracePeriodSeconds).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import pathlib
import signal
import sys
import threading
import time
from types import FrameType

from trainop_trainer import config as config_module
from trainop_trainer import storage

log = logging.getLogger(__name__)

_requested = threading.Event()
_signals: list[int] = []  # the signal that asked first
_driver_handler = threading.Event()
_run_ended = threading.Event()  # the driver's run returned: a signal no longer interrupts what follows
_exit_timers: list[threading.Timer] = []  # the first signal's "exit if the workers have not stopped" timer


def _handler(signum: int, frame: FrameType | None) -> None:
    del frame
    if not _requested.is_set():
        _signals.append(signum)
    _requested.set()
    # Logging from a signal handler can deadlock on the logging lock; a raw write cannot.
    os.write(2, f"trainop: received signal {signum}; checkpointing at the next step\n".encode())


def _install_handler() -> str:
    signal.signal(signal.SIGTERM, _handler)
    return threading.current_thread().name


def install() -> None:
    """Route SIGTERM of this process to ``requested()``, from whichever thread we run on."""
    if threading.current_thread() is threading.main_thread():
        _install_handler()
        return
    import ray

    actor = ray.get_runtime_context().current_actor
    ray.get(actor.execute.remote(_install_handler))


def requested() -> bool:
    """True once this process received SIGTERM (or ``request()`` was called)."""
    return _requested.is_set()


def request() -> None:
    _requested.set()


def reset() -> None:
    _requested.clear()
    _signals.clear()
    _run_ended.clear()


def install_driver_handler(
    stop_file: storage.RunDir, *, grace_s: float, sigterm_is_clean: bool = True
) -> None:
    """On SIGTERM/SIGINT in a driver: ask the workers to checkpoint and stop (``stop_file``), and exit (0
    for SIGTERM, 130 for SIGINT) after ``grace_s`` seconds if they have not finished by then; with
    ``sigterm_is_clean=False`` (local mode: ``trainop run x.yaml && next-step`` must not go on after a
    forced stop) that exit is 128 + the signal's number for SIGTERM too. A second
    SIGINT (Ctrl+C again) raises KeyboardInterrupt in the main thread: stop now, without that checkpoint.
    Once the run has returned, ``run_ended()`` turns the handler into a note on stderr.
    Call from the main thread, after ``ray.init`` (which installs its own SIGTERM handler);
    ``ray_train.run`` then keeps Ray Train's fit() from replacing the SIGINT one."""

    def handler(signum: int, frame: FrameType | None) -> None:
        del frame
        if _run_ended.is_set():  # what is left is printing the outcome: a Ctrl+C then must not cut it short
            os.write(2, b"trainop: the run has already ended; finishing\n")
            return
        if _requested.is_set():
            if signum == signal.SIGINT:  # the caller stops Ray (ray.shutdown at exit) and exits 130
                os.write(2, b"trainop: Ctrl+C again: stopping now, without waiting for the checkpoint\n")
                raise KeyboardInterrupt
            return
        _requested.set()
        _signals.append(signum)
        storage.write_text(stop_file, f"signal {signum} at {time.time()}\n")
        if signum == signal.SIGINT:
            what = (
                "Ctrl+C (SIGINT): asking the workers to checkpoint and stop; Ctrl+C again stops now, "
                "without it"
            )
        else:
            what = f"received signal {signum}; asking workers to checkpoint and stop"
        os.write(2, f"trainop: {what}\n".encode())

        def force_exit() -> None:
            os.write(2, f"trainop: workers did not stop within {grace_s:.0f}s; exiting\n".encode())
            # A pod driver's SIGTERM is its pod's end, not an error; anything else ends as the signal's code.
            os._exit(0 if signum == signal.SIGTERM and sigterm_is_clean else 128 + signum)

        timer = threading.Timer(grace_s, force_exit)
        timer.daemon = True
        _exit_timers.append(timer)
        timer.start()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    _driver_handler.set()


def run_ended() -> None:
    """The driver's run has returned (its workers stopped): from now on SIGTERM/SIGINT neither raise
    KeyboardInterrupt nor end the process after the grace period; the handler only says so. What
    is left (the outcome and the status printed) takes milliseconds, and a Ctrl+C landing in it showed a
    traceback instead of the status."""
    _run_ended.set()
    while _exit_timers:
        _exit_timers.pop().cancel()


def driver_handler_installed() -> bool:
    """Whether SIGTERM/SIGINT make this driver stop its workers at a checkpoint (install_driver_handler)."""
    return _driver_handler.is_set()


def signalled_with() -> int | None:
    """The signal that first asked this driver to stop (None: none did)."""
    return _signals[0] if _signals else None


def pid_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get(config_module.PID_DIR_ENV, config_module.DEFAULT_PID_DIR))


def register_pid(*, run_name: str, rank: int) -> pathlib.Path:
    directory = pid_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{run_name}-rank{rank}.pid"
    path.write_text(str(os.getpid()))
    return path


def unregister_pid(path: pathlib.Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _alive(pid: int) -> bool:
    """True while ``pid`` runs; an exited process its parent has not reaped yet (a zombie) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def signal_registered(*, timeout_s: float, directory: pathlib.Path | None = None) -> int:
    """SIGTERM every registered training process and wait up to ``timeout_s`` for them to exit; returns
    how many are still running."""
    directory = directory or pid_dir()
    pids: list[int] = []
    for path in sorted(directory.glob("*.pid")) if directory.is_dir() else []:
        try:
            pid = int(path.read_text().strip())
        except (OSError, ValueError):
            continue
        if pid != os.getpid() and _alive(pid):
            os.kill(pid, signal.SIGTERM)
            pids.append(pid)
    deadline = time.monotonic() + timeout_s
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if _alive(pid)]
        time.sleep(0.2)
    return len(pids)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainop_trainer.preempt",
        description="preStop hook: SIGTERM this pod's training processes and wait for their checkpoint.",
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for them to exit")
    args = parser.parse_args(argv)
    left = signal_registered(timeout_s=args.timeout)
    if left:
        print(
            f"trainop: {left} training process(es) still running after {args.timeout:.0f}s", file=sys.stderr
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
