"""pytest fixtures of the S3 server (registered for every test by the root conftest). One server per
session, on loopback, over a temporary directory, started only when a test asks for it; tests make their
own buckets (``s3_bucket``), so they never see each other's objects. The e2e tier starts its own on the
cluster bed's address (e2e/conftest.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.objectstore.server import S3Server


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server.start(tmp_path_factory.mktemp("s3"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A new, empty bucket on the session's server."""
    return s3_server.create_bucket(f"t-{uuid.uuid4().hex[:12]}")
