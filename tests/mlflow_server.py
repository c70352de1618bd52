"""A real MLflow tracking server for the tracking tests: ``mlflow server`` on loopback, SQLite backend.

One server per pytest process (the ``mlflow_server`` fixture, registered for every test by the root
conftest and shared by tests/trainer and tests/sweep), its database and artifacts in a temporary directory,
started only when a test asks for it and stopped before the e2e tier (tests/session_beds.py); tests
assert on what the server stores, through MLflow's own client, each in an experiment of its own name.

MLflow's job execution (``MLFLOW_SERVER_ENABLE_JOB_EXECUTION``, on by default since MLflow 3) is off: it
starts a job runner and six huey consumer processes beside the server, for server-side jobs (trace
roll-ups, GenAI evaluations) that no trainop test or feature uses. On the 2-core dev box a server start
took 36.6 s of CPU with them and 11.5 s without (2026-11-28, ``cpuacct`` of the process tree).
Start-up runs MLflow's database migrations and takes up to a minute on the 2-core box.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from tests import session_beds
from tests.controlplane import processes

STARTUP_TIMEOUT_S = 240.0


@dataclasses.dataclass(frozen=True)
class MlflowServer:
    uri: str
    root: pathlib.Path

    def client(self):  # type: ignore[no-untyped-def]
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.uri)


def start(root: pathlib.Path) -> tuple[MlflowServer, Callable[[], None]]:
    """Start a server over ``root`` and wait until it answers; returns it and its (idempotent) stop."""
    port = processes.free_loopback_port()
    uri = f"http://127.0.0.1:{port}"
    log = (root / "server.log").open("w")
    process = subprocess.Popen(
        [
            str(pathlib.Path(sys.executable).parent / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=root,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )

    def stop() -> None:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()

    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited ({process.returncode}): {(root / 'server.log').read_text()}"
                )
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"mlflow server not up in {STARTUP_TIMEOUT_S:.0f}s: {(root / 'server.log').read_text()}"
                )
            time.sleep(1.0)
    except BaseException:
        stop()
        raise
    return MlflowServer(uri=uri, root=root), stop


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """A real MLflow tracking server (``mlflow server``, SQLite backend) shared by the tracking tests."""
    server, stop = start(tmp_path_factory.mktemp("mlflow"))
    session_beds.register("MLflow server", stop)
    try:
        yield server
    finally:
        session_beds.unregister("MLflow server")
        stop()
