"""Child processes of the test control plane: start with a log file, probe, stop, measure.

Owns the mechanics every control-plane component shares: picking a free loopback port, starting a binary
with stdout+stderr going to a log file in the data dir, polling an HTTP(S) health endpoint, stopping with
SIGTERM then SIGKILL, and reading a process's resident memory. It knows nothing about Kubernetes flags;
``cluster.py`` decides what to run.

Leak protection: on Linux every child gets ``PR_SET_PDEATHSIG=SIGKILL``, so if the Python process that
started it dies without running teardown (SIGKILL, OOM, a crashed xdist worker) the kernel kills the
child too. Children also run in their own session so a Ctrl-C in the terminal reaches only Python, which
then stops them in order (controller-manager, apiserver, etcd) instead of all at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1
# Loaded once in the parent: the child between fork and exec should do as little as possible.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


class ProcessFailed(RuntimeError):
    """A control-plane process exited or never became healthy; the message carries its log tail."""


def free_loopback_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago.

    There is an unavoidable window between closing this socket and the child binding the port; the
    caller retries a start that fails with "address already in use" (see ``ControlPlane``).
    """
    [port] = free_loopback_ports(1)
    return port


def free_loopback_ports(count: int) -> list[int]:
    """``count`` different TCP ports on 127.0.0.1 that were free a moment ago: every socket stays bound until
    all are picked (one at a time, the kernel may hand the port it just freed out again: a process then
    got the same port for two listeners)."""
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


def _die_with_parent() -> None:
    """Runs in the child between fork and exec: ask the kernel to SIGKILL us when our parent dies."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclasses.dataclass(kw_only=True)
class ManagedProcess:
    """One running binary with its log file. Create with :meth:`start`."""

    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes]

    @classmethod
    def start(
        cls, *, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None
    ) -> ManagedProcess:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        return cls(name=name, argv=list(argv), log_path=log_path, popen=popen)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def is_running(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, *, num_lines: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return f"(no log file at {self.log_path})"
        return "\n".join(lines[-num_lines:])

    def failure(self, what: str) -> ProcessFailed:
        """Build the error raised when this process misbehaves: what went wrong plus its log tail."""
        state = "running" if self.is_running() else f"exited with code {self.popen.returncode}"
        return ProcessFailed(
            f"{self.name} {what} ({state}); log {self.log_path}, last lines:\n{self.log_tail()}"
        )

    def wait_healthy(
        self,
        probe: Callable[[], bool],
        *,
        timeout_s: float,
        what: str = "did not become healthy",
        interval_s: float = 0.05,
    ) -> float:
        """Poll ``probe`` until it returns True; return the seconds it took. Fails fast if we exit."""
        start = time.monotonic()
        deadline = start + timeout_s
        while time.monotonic() < deadline:
            if not self.is_running():
                raise self.failure(what)
            if probe():
                return time.monotonic() - start
            time.sleep(interval_s)
        raise self.failure(f"{what} within {timeout_s:.0f}s")

    def stop(self, *, grace_s: float = 10.0) -> None:
        """SIGTERM, wait up to ``grace_s``, then SIGKILL. Idempotent."""
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
            self.popen.wait(timeout=10)

    def rss_bytes(self) -> int | None:
        """Resident set size now, from /proc (Linux only); None once the process has gone."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            return None
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return None


def https_status(
    url: str,
    *,
    ssl_context: ssl.SSLContext,
    timeout_s: float = 2.0,
) -> tuple[int, str]:
    """GET ``url`` and return (status, body); (0, reason) when nothing answered."""
    try:
        with urllib.request.urlopen(url, context=ssl_context, timeout=timeout_s) as response:
            return int(response.status), response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode(errors="replace")
    except (urllib.error.URLError, ConnectionError, TimeoutError, ssl.SSLError, OSError) as error:
        return 0, str(error)


def http_ok(url: str, *, timeout_s: float = 2.0) -> bool:
    """True when a plain-HTTP GET of ``url`` answers 200 (etcd's /health on loopback)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def which_executable(path: Path | None) -> Path | None:
    """``path`` if it names an executable file, else None."""
    if path is not None and path.is_file() and os.access(path, os.X_OK):
        return path
    return None
