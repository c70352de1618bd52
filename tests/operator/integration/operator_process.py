"""The operator as the tests run it: a real ``python -m trainop.controller`` process, killable with SIGKILL.

A subprocess (not kopf's in-process KopfRunner) because the crash-recovery tests must kill the operator
the way a node failure would, mid-reconcile, with no cleanup. Logs go to a file whose tail is attached
to failing tests. Uses the control plane's ``processes.ManagedProcess`` (the child dies with pytest).
"""

from __future__ import annotations

import os
import signal
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from tests.controlplane import processes


class OperatorProcess:
    def __init__(self, *, kubeconfig: Path, log_dir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        self.process: processes.ManagedProcess | None = None
        self.liveness_port = 0
        self.metrics_port = 0
        self.starts = 0
        self._log_offset = 0

    def start(
        self,
        *,
        namespaces: Sequence[str] = (),
        failpoints: str = "",
        kubeconfig: Path | None = None,
        wait: bool = True,
        extra_args: Sequence[str] = (),
    ) -> None:
        """Start a fresh process (cluster-wide unless ``namespaces``; as the admin unless ``kubeconfig``);
        with ``wait``, until it is live."""
        assert not self.running, "already running"
        self.starts += 1
        self.liveness_port, self.metrics_port = processes.free_loopback_ports(2)
        argv = [
            sys.executable,
            "-m",
            "trainop.controller",
            f"--kubeconfig={kubeconfig or self.kubeconfig}",
            f"--liveness-port={self.liveness_port}",
            f"--metrics-port={self.metrics_port}",
            "--log-format=full",
            *(f"--namespace={n}" for n in namespaces),
            *extra_args,
        ]
        env = {**os.environ, "TRAINOP_FAILPOINTS": failpoints, "PYTHONUNBUFFERED": "1"}
        log_path = self.log_dir / "operator.log"
        self._log_offset = log_path.stat().st_size if log_path.exists() else 0
        self.process = processes.ManagedProcess.start(
            name=f"operator-{self.starts}", argv=argv, log_path=self.log_dir / "operator.log", env=env
        )
        if wait:
            self.process.wait_healthy(
                lambda: self.get("/healthz", self.liveness_port)[0] == 200, timeout_s=30
            )

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.is_running()

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, no cleanup, like a lost node."""
        assert self.process is not None
        self.process.popen.send_signal(signal.SIGKILL)
        self.process.popen.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def wait_exit(self, timeout_s: float) -> int:
        """Wait for the process to end by itself (a failpoint); returns its exit code."""
        assert self.process is not None
        return self.process.popen.wait(timeout=timeout_s)

    def log_of_this_start(self) -> str:
        """What the current process logged (the file also holds earlier starts', other tests')."""
        with (self.log_dir / "operator.log").open(errors="replace") as log:
            log.seek(self._log_offset)
            return log.read()

    def log_tail(self, num_lines: int = 60) -> str:
        return self.process.log_tail(num_lines=num_lines) if self.process else "(never started)"

    def metrics(self) -> str:
        status, body = self.get("/metrics", self.metrics_port)
        assert status == 200, body
        return body

    @staticmethod
    def get(path: str, port: int) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
                return int(response.status), response.read().decode()
        except OSError as error:  # refused while starting, HTTPError for 5xx
            return int(getattr(error, "code", 0)), str(error)


def wait_until_dead(process: OperatorProcess, timeout_s: float = 30) -> int:
    deadline = time.monotonic() + timeout_s
    while process.running and time.monotonic() < deadline:
        time.sleep(0.05)
    return process.wait_exit(1)
