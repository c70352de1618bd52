"""The operator as a real process (``python -m trainop.controller``) that tests kill, restart and read.

Like ``tests/operator/integration/operator_process.py``, with what the reliability and security tests
add: extra command-line flags and environment (a silent-watch timeout, secrets planted in the operator's
environment), its metrics parsed, and its whole log kept across restarts (one file, appended to).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.controlplane import processes
from tests.reliability import pod_identity

# Processes the control plane's helpers start die with the *thread* that started them (PR_SET_PDEATHSIG).
# An operator started from asyncio's default executor would be killed when the test's event loop closes its
# threads; this one thread lives as long as the process.
_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="operator-spawner")


class Operator:
    def __init__(
        self,
        *,
        kubeconfig: Path | None,
        log_path: Path,
        namespaces: Sequence[str],
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        pod: pod_identity.PodIdentity | None = None,
    ) -> None:
        """``kubeconfig`` None with ``pod``: in-cluster credentials only, as in the chart's Deployment."""
        assert (kubeconfig is None) == (pod is not None), "a kubeconfig, or a pod identity"
        self.pod = pod
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.namespaces = list(namespaces)
        self.args = list(args)
        self.env = dict(env or {})
        self.process: processes.ManagedProcess | None = None
        self.liveness_port = 0
        self.metrics_port = 0
        self.starts = 0
        self.kills = 0

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.is_running()

    def start(self, *, wait: bool = True, timeout_s: float = 60) -> None:
        assert not self.running, "already running"
        self.starts += 1
        self.liveness_port, self.metrics_port = processes.free_loopback_ports(2)
        argv = [
            sys.executable,
            "-m",
            "trainop.controller",
            *([f"--kubeconfig={self.kubeconfig}"] if self.kubeconfig else []),
            f"--liveness-port={self.liveness_port}",
            f"--metrics-port={self.metrics_port}",
            "--log-format=full",
            *(f"--namespace={n}" for n in self.namespaces),
            *self.args,
        ]
        env = {**os.environ, "TRAINOP_FAILPOINTS": "", "PYTHONUNBUFFERED": "1", **self.env}
        if self.pod is not None:
            argv, env = self.pod.wrap(argv, env, self.log_path.parent / f"pod-{self.starts}")
        self.process = processes.ManagedProcess.start(
            name=f"operator-{self.starts}", argv=argv, log_path=self.log_path, env=env
        )
        if wait:
            self.process.wait_healthy(self.live, timeout_s=timeout_s, interval_s=0.1)

    async def start_async(self) -> None:
        """:meth:`start` without blocking the event loop (the harness keeps playing KubeRay meanwhile)."""
        await asyncio.get_running_loop().run_in_executor(_SPAWNER, self.start)

    def live(self) -> bool:
        return self.get("/healthz", self.liveness_port)[0] == 200

    def kill(self) -> None:
        """SIGKILL, like a lost node: no shutdown, no cleanup."""
        assert self.process is not None
        self.process.popen.send_signal(signal.SIGKILL)
        self.process.popen.wait(timeout=10)
        self.kills += 1

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def metrics(self) -> dict[str, float]:
        """Every sample of the operator's /metrics: 'name{labels}' -> value."""
        status, text = self.get("/metrics", self.metrics_port)
        assert status == 200, text
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                samples[key] = float(value)
        return samples

    def reconciles(self, result: str = "success") -> float:
        """Reconciles of TrainingJobs since this process started (``result``: success or error)."""
        key = f'trainop_operator_reconcile_total{{kind="TrainingJob",result="{result}"}}'
        return self.metrics().get(key, 0.0)

    @staticmethod
    def get(path: str, port: int) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                return int(response.status), response.read().decode()
        except OSError as error:
            return int(getattr(error, "code", 0)), str(error)
