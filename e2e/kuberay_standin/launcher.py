"""Running the stand-in (``python -m e2e.kuberay_standin``) for a test session, and reading what it keeps."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.controlplane import processes

REPO_ROOT = Path(__file__).resolve().parents[2]


class StandInProcess:
    def __init__(self, *, kubeconfig: Path, state_dir: Path, num_cpus: int = 16) -> None:
        self.kubeconfig = kubeconfig
        self.state_dir = state_dir
        self.num_cpus = num_cpus
        self.process: processes.ManagedProcess | None = None

    @property
    def log_path(self) -> Path:
        return self.state_dir / "kuberay-standin.log"

    def launch(self) -> None:
        """Start the process; Ray comes up in the background (``wait_ready``)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "ready").unlink(missing_ok=True)
        pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
        self.process = processes.ManagedProcess.start(
            name="kuberay-standin",
            argv=[
                sys.executable,
                "-m",
                "e2e.kuberay_standin",
                f"--kubeconfig={self.kubeconfig}",
                f"--state-dir={self.state_dir}",
                f"--num-cpus={self.num_cpus}",
            ],
            log_path=self.log_path,
            env={**os.environ, "PYTHONPATH": pythonpath},
        )

    def wait_ready(self, timeout_s: float = 240) -> None:
        """Until Ray runs and the RayJobs are listed."""
        assert self.process is not None, "launch() first"
        ready = self.state_dir / "ready"
        self.process.wait_healthy(ready.exists, timeout_s=timeout_s, what="was not ready", interval_s=0.2)

    def claim_dir(self, namespace: str, claim: str) -> Path:
        """The local directory standing in for a PersistentVolumeClaim's volume."""
        return self.state_dir / "pvs" / namespace / claim

    def driver_logs(self, namespace: str) -> dict[str, Path]:
        """Entrypoint logs of the RayJobs of ``namespace``, by RayJob directory name."""
        root = self.state_dir / "pods" / namespace
        return {path.parent.name: path for path in sorted(root.glob("*/driver.log"))} if root.is_dir() else {}

    def log_tail(self, num_lines: int = 60) -> str:
        return self.process.log_tail(num_lines=num_lines) if self.process else "(not started)"

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace_s=30)
