"""The one local Ray cluster behind every RayJob, and cleaning up every process the stand-in started.

``ray start --head --block`` runs in its own session. Ray's workers leave that session (and the process
group), so shutdown finds the stand-in's processes by a marker in their environment instead
(``MARKER_ENV=<random id>``, inherited by everything the stand-in starts, Ray's workers included): exactly
ours, never another user's Ray on the same machine.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MARKER_ENV = "TRAINOP_E2E_STANDIN_ID"
RAY_READY_LINE = "Ray runtime started"
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded in the parent: a forked child must not import

log = logging.getLogger("kuberay-standin")


def die_with_parent() -> None:
    """``preexec_fn``, run between fork and exec (no imports, no locks): SIGKILL us when the stand-in dies."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RayRuntime:
    def __init__(self, *, num_cpus: int, marker: str) -> None:
        self.num_cpus = num_cpus
        self.marker = marker
        # Short and under /tmp: Ray's unix sockets live below it (108-byte limit on socket paths).
        self.temp_dir = Path(tempfile.mkdtemp(prefix="trainop-e2e-ray-", dir="/tmp"))
        self.port = free_port()
        self.auth_token = secrets.token_hex(32)
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.temp_dir / "ray-start.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """How an entrypoint joins this cluster. Token auth with our own token: hermetic, whatever
        ``~/.ray/auth_token`` holds on this machine."""
        return {"RAY_ADDRESS": self.address, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.auth_token}

    def start(self, *, base_env: dict[str, str], timeout_s: float = 180) -> None:
        argv = [
            str(Path(sys.executable).parent / "ray"),
            "start",
            "--head",
            "--block",
            f"--num-cpus={self.num_cpus}",
            "--num-gpus=0",
            f"--port={self.port}",
            f"--dashboard-agent-listen-port={free_port()}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={self.temp_dir}",
        ]
        env = {**base_env, **self.env()}
        del env["RAY_ADDRESS"]  # the head starts the cluster; it must not look for one
        started = time.monotonic()
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        while RAY_READY_LINE not in self.log_path.read_text(errors="replace"):
            if self.process.poll() is not None:
                raise RuntimeError(f"ray start exited {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"ray start not ready after {timeout_s:.0f}s:\n{self.log_tail()}")
            time.sleep(0.2)
        log.info(
            "Ray head at %s ready in %.1fs (%s)", self.address, time.monotonic() - started, self.temp_dir
        )

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, num_lines: int = 30) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
        return "\n".join(lines[-num_lines:])

    def stop(self) -> None:
        """SIGKILL (the cluster is throwaway, and Ray's SIGTERM drain takes 30 s), then every marked
        process, then the temp dir."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        kill_marked_processes(self.marker)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def kill_marked_processes(marker: str) -> int:
    """SIGKILL every process whose environment holds ``MARKER_ENV=marker``; returns how many."""
    needle = f"{MARKER_ENV}={marker}".encode()
    killed = 0
    for _ in range(5):  # a dying raylet may still spawn a worker or two
        found = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if needle in environ.split(b"\0"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry.name), signal.SIGKILL)
                    found += 1
        killed += found
        if not found:
            break
        time.sleep(0.5)
    return killed
