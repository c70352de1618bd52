"""versitygw as a test fixture: find (or build) the binary, run it over a directory, make buckets.

``S3Server.start(root, host=...)`` runs ``versitygw --port HOST:PORT --access KEY --secret SECRET posix
ROOT``: every sub-directory of ROOT is a bucket and every object a file below it, so a test can also look
at (or damage) what was written. The credentials are random per server; ``bucket()`` gives the spec's
``S3Bucket`` for a bucket of it and ``env()`` the container variables the operator would set from the
credentials Secret (``trainop.api.trainer_config.s3_env``).

It must not know about checkpoints or jobs.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
import socket
import time
from pathlib import Path

import pyarrow.fs as pafs

from tests.controlplane import assets as controlplane_assets
from tests.controlplane import processes
from trainop.api import trainer_config, trainingjob

COMPONENT = "versitygw"


def binary_path() -> Path:
    versions = controlplane_assets.read_versions()
    root = controlplane_assets.cache_root() / "controlplane"
    return root / f"versitygw-{versions['VERSITYGW_VERSION']}" / "bin" / "versitygw"


def ensure_binary(*, build: bool = True) -> Path:
    """The pinned versitygw, built with build.sh (Go module proxy) when missing and ``build``."""
    found = processes.which_executable(binary_path())
    if found is None and build:
        controlplane_assets.build_missing([COMPONENT])
        found = processes.which_executable(binary_path())
    if found is None:
        raise controlplane_assets.AssetsUnavailable(
            "the object-storage tests need versitygw: run `bash tests/controlplane/build.sh versitygw` "
            "(needs Go >= 1.26 and the Go module proxy)"
        )
    return found


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclasses.dataclass(kw_only=True)
class S3Server:
    root: Path
    host: str
    port: int
    access_key: str
    secret_key: str
    process: processes.ManagedProcess

    @classmethod
    def start(cls, root: Path, *, host: str = "127.0.0.1", log_dir: Path | None = None) -> S3Server:
        binary = ensure_binary()
        data = root / "buckets"
        data.mkdir(parents=True, exist_ok=True)
        access, secret = f"trainop{secrets.token_hex(4)}", secrets.token_hex(16)
        for _ in range(3):  # the port was free a moment ago; another process may take it first
            port = free_port(host)
            process = processes.ManagedProcess.start(
                name="versitygw",
                argv=[
                    str(binary),
                    "--port",
                    f"{host}:{port}",
                    "--access",
                    access,
                    "--secret",
                    secret,
                    "posix",
                    str(data),
                ],
                log_path=(log_dir or root) / "versitygw.log",
            )
            try:
                process.wait_healthy(
                    functools.partial(_listening, host, port), timeout_s=30, what="did not listen"
                )
            except processes.ProcessFailed:
                process.stop()
                if "address already in use" in process.log_tail():
                    continue
                raise
            return cls(root=data, host=host, port=port, access_key=access, secret_key=secret, process=process)
        raise processes.ProcessFailed(f"versitygw found no free port on {host}")

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def filesystem(self) -> pafs.S3FileSystem:
        """pyarrow's client with this server's credentials (buckets may be created and deleted)."""
        return pafs.S3FileSystem(
            access_key=self.access_key,
            secret_key=self.secret_key,
            endpoint_override=f"{self.host}:{self.port}",
            scheme="http",
            region="us-east-1",
            allow_bucket_creation=True,
            allow_bucket_deletion=True,
        )

    def create_bucket(self, name: str) -> str:
        self.filesystem().create_dir(name)
        deadline = time.monotonic() + 10
        while (self.root / name).is_dir() is False and time.monotonic() < deadline:
            time.sleep(0.05)
        return name

    def bucket(
        self, name: str, *, prefix: str | None = None, secret: str | None = "s3-creds"
    ) -> trainingjob.S3Bucket:
        """The spec's S3Bucket for ``name`` on this server (credentials from a Secret named ``secret``)."""
        return trainingjob.S3Bucket(
            bucket=name, prefix=prefix, endpoint=self.endpoint, credentials_secret=secret
        )

    def env(
        self,
        use: trainer_config.S3Use = trainer_config.S3_CHECKPOINT,
        *,
        secret: str = "s3-creds",
        secret_key: str | None = None,
    ) -> dict[str, str]:
        """The container variables the operator sets from the credentials Secret (``secret_key`` overrides
        the secret access key: a wrong one)."""
        return {
            trainer_config.s3_secret_name_env(use): secret,
            trainer_config.s3_env(use, "AWS_ACCESS_KEY_ID"): self.access_key,
            trainer_config.s3_env(use, "AWS_SECRET_ACCESS_KEY"): secret_key or self.secret_key,
        }

    def stop(self) -> None:
        self.process.stop()
