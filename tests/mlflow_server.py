"""A real MLflow tracking server for the tracking tests: ``mlflow server`` on loopback, SQLite backend.

Started once per test session by the ``mlflow_server`` fixtures of tests/trainer and tests/sweep, its
database and artifacts in a temporary directory; tests assert on what the server stores, through MLflow's
own client. Start-up runs MLflow's database migrations and takes up to a minute on the 2-core box.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

STARTUP_TIMEOUT_S = 240.0


@dataclasses.dataclass(frozen=True)
class MlflowServer:
    uri: str
    root: pathlib.Path

    def client(self):  # type: ignore[no-untyped-def]
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.uri)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running(root: pathlib.Path) -> Iterator[MlflowServer]:
    port = _free_port()
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
    )
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
        yield MlflowServer(uri=uri, root=root)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
