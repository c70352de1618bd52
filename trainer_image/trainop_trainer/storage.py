"""Where a run keeps its files: a directory on the checkpoint volume, or a prefix of an S3-compatible bucket.

``StoragePath`` is a path on a ``pyarrow.fs`` filesystem with the small part of ``pathlib.Path``'s interface
the trainer uses (``/``, ``name``, ``parent``, ``exists``, ``read_text``, ``write_text``, ``unlink``,
``mkdir``), so that a run directory on S3 (``s3://bucket/prefix/<run>``) is used like one on the volume
(``/checkpoints/<run>``, a plain ``pathlib.Path``). ``at(path)`` turns either kind into a ``StoragePath``
for code that needs listings, sizes, deletions and streams (the checkpoint store); ``for_uri`` connects to
the bucket a storage path names.

Why pyarrow: Ray Train reads and writes its own storage path through ``pyarrow.fs`` (``RunConfig``'s
``storage_filesystem``), pyarrow ships in the trainer image with Ray, its S3 client (the AWS C++ SDK)
uploads large objects as multipart uploads on background threads, and the same interface serves the
volume (``LocalFileSystem``), so the checkpoint store has one code path for both.

What the checkpoint store relies on, true on a POSIX volume and on S3 alike:
- a file written by ``write_bytes``/``write_text`` is there whole or not at all (volume: a temp file
  fsynced and renamed, then the directory fsynced, so a node's crash cannot undo it either; S3: an
  object exists only once its upload completed, so a writer killed mid-upload leaves nothing behind but an
  incomplete multipart upload the bucket's lifecycle rule should abort);
- a listing shows every completed write (S3 is strongly consistent, as are MinIO, Ceph and versitygw).
Not atomic on S3: moving a directory (each object copied, then deleted), which only moves a broken
checkpoint aside; deleting a directory (the store deletes the commit marker first).

Credentials never come from the config: a bucket's keys are in the environment, under the names
``trainop.api.trainer_config.s3_env`` gives the operator's secretKeyRefs; without them the AWS SDK's own
chain (pod identity, instance profile, ``AWS_*`` variables) is used.

It must not know what a checkpoint holds, nor about ranks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pathlib
import posixpath
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow.fs as pafs

from trainop.api import trainer_config, trainingjob

log = logging.getLogger(__name__)

S3_SCHEME = "s3://"
# Seconds before a connection attempt or a silent request gives up (then the SDK's retries apply). The SDK's
# defaults (1 s to connect, 3 s per request) fail large part uploads on a busy node.
CONNECT_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 60.0
RETRY_ATTEMPTS = 5


class StorageError(Exception):
    """A bucket that cannot be used, in one sentence; ``reason`` is the StorageStatus reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclasses.dataclass(frozen=True)
class StoragePath:
    """A path on a pyarrow filesystem: ``bucket/key`` on S3, an absolute path on the local filesystem."""

    fs: pafs.FileSystem
    path: str

    # ------------------------------------------------------------------------------- pathlib's subset
    def __truediv__(self, name: str) -> StoragePath:
        return StoragePath(self.fs, posixpath.join(self.path, name))

    def __str__(self) -> str:
        return self.path if self.is_local else S3_SCHEME + self.path

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    @property
    def parent(self) -> StoragePath:
        return StoragePath(self.fs, posixpath.dirname(self.path))

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def exists(self) -> bool:
        return bool(self.fs.get_file_info(self.path).type != pafs.FileType.NotFound)

    def is_file(self) -> bool:
        return bool(self.fs.get_file_info(self.path).type == pafs.FileType.File)

    def is_dir(self) -> bool:
        return bool(self.fs.get_file_info(self.path).type == pafs.FileType.Directory)

    def read_bytes(self) -> bytes:
        try:
            with self.fs.open_input_stream(self.path) as stream:
                return bytes(stream.read())
        except FileNotFoundError:
            raise
        except OSError as exc:
            if self.fs.get_file_info(self.path).type == pafs.FileType.NotFound:
                raise FileNotFoundError(str(self)) from exc
            raise

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def write_bytes(self, data: bytes) -> None:
        """Whole or not at all: a temp file renamed on the volume, one PUT on S3. On the volume the data is
        on disk before the rename and the rename before this returns (both fsynced), so that a crash of the
        node never leaves the name pointing at a file whose data was not written (the manifest)."""
        if self.is_local:
            directory = posixpath.dirname(self.path)
            self.fs.create_dir(directory, recursive=True)
            tmp = f"{self.path}.tmp-{uuid.uuid4().hex[:12]}"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            _fsync_dir(directory)
            return
        with self.fs.open_output_stream(self.path) as stream:
            stream.write(data)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.delete_file(self.path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """On the volume a directory; on S3 nothing (keys need no parents, and pyarrow would write an empty
        marker object)."""
        del exist_ok
        if self.is_local:
            self.fs.create_dir(self.path, recursive=parents)

    # ---------------------------------------------------------------------------------- the rest
    def iterdir(self) -> list[pafs.FileInfo]:
        """The entries directly below, with their type and size (one LIST on S3); none if absent."""
        selector = pafs.FileSelector(self.path, allow_not_found=True, recursive=False)
        return list(self.fs.get_file_info(selector))

    def files(self) -> list[pafs.FileInfo]:
        """Every file below, recursively, with sizes."""
        selector = pafs.FileSelector(self.path, allow_not_found=True, recursive=True)
        return [info for info in self.fs.get_file_info(selector) if info.type == pafs.FileType.File]

    def delete_tree(self) -> None:
        """Delete the directory and everything below (missing is fine)."""
        if self.is_local:
            with contextlib.suppress(FileNotFoundError):
                self.fs.delete_dir(self.path)
            return
        for info in self.files():
            with contextlib.suppress(FileNotFoundError):
                self.fs.delete_file(info.path)
        with contextlib.suppress(FileNotFoundError, OSError):
            self.fs.delete_dir(self.path)  # a directory marker pyarrow may have left

    def move_tree(self, target: StoragePath) -> None:
        """Rename on the volume (atomic); on S3 copy every object, then delete the originals."""
        if self.is_local:
            self.fs.move(self.path, target.path)
            return
        for info in self.files():
            relative = posixpath.relpath(info.path, self.path)
            self.fs.copy_file(info.path, posixpath.join(target.path, relative))
        self.delete_tree()

    @contextlib.contextmanager
    def open_output(self) -> Iterator[Any]:
        """A write stream; the file exists once it is closed without error (an error deletes it)."""
        stream = self.fs.open_output_stream(self.path)
        try:
            yield stream
        except BaseException:
            # pyarrow cannot abort an S3 upload from Python: closing completes it, so delete what it wrote.
            with contextlib.suppress(Exception):
                stream.close()
                self.fs.delete_file(self.path)
            raise
        stream.close()


RunDir = pathlib.Path | StoragePath


def _fsync_dir(directory: str) -> None:
    """Make a rename in ``directory`` durable (POSIX: fsync the directory itself)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def at(path: str | os.PathLike[str] | StoragePath) -> StoragePath:
    """Any local path or ``StoragePath`` as a ``StoragePath`` (local paths made absolute)."""
    if isinstance(path, StoragePath):
        return path
    return StoragePath(pafs.LocalFileSystem(), os.path.abspath(os.fspath(path)))


def is_object_uri(storage_path: str) -> bool:
    return storage_path.startswith(S3_SCHEME)


def credentials_from_env(use: trainer_config.S3Use) -> dict[str, str]:
    """The access key, secret key and session token the operator put into this container for ``use``, as
    ``S3FileSystem`` arguments; ``{}`` when the job names no Secret (the SDK's own chain applies).
    ``StorageError`` when it names one whose keys did not arrive (the Secret or a key is missing)."""
    secret = os.environ.get(trainer_config.s3_secret_name_env(use))
    values = {
        key: os.environ.get(trainer_config.s3_env(use, key), "") for key in trainer_config.S3_SECRET_KEYS
    }
    if not secret:
        return {}
    missing = [key for key in trainer_config.S3_REQUIRED_SECRET_KEYS if not values[key]]
    if missing:
        raise StorageError(
            "CredentialsMissing",
            f"the credentials Secret {secret!r} (spec.{_field(use)}.s3.credentialsSecret) does not exist in "
            f"the job's namespace or has no {' and no '.join(missing)}: create it with kubectl create secret "
            f"generic {secret} --from-literal=AWS_ACCESS_KEY_ID=... --from-literal=AWS_SECRET_ACCESS_KEY=...",
        )
    arguments = {"access_key": values["AWS_ACCESS_KEY_ID"], "secret_key": values["AWS_SECRET_ACCESS_KEY"]}
    if values["AWS_SESSION_TOKEN"]:
        arguments["session_token"] = values["AWS_SESSION_TOKEN"]
    return arguments


def _field(use: trainer_config.S3Use) -> str:
    return "checkpoint.storage" if use == trainer_config.S3_CHECKPOINT else "data"


def s3_filesystem(bucket: trainingjob.S3Bucket, *, use: trainer_config.S3Use) -> pafs.S3FileSystem:
    """pyarrow's S3 client for one S3Bucket of the spec, with the credentials of its ``use``."""
    options: dict[str, Any] = {
        "region": bucket.region,
        "connect_timeout": CONNECT_TIMEOUT_S,
        "request_timeout": REQUEST_TIMEOUT_S,
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=RETRY_ATTEMPTS),
        **credentials_from_env(use),
    }
    if bucket.endpoint:
        url = urllib.parse.urlsplit(bucket.endpoint)
        options["scheme"] = url.scheme
        options["endpoint_override"] = url.netloc
    return pafs.S3FileSystem(**options)


def for_uri(storage_path: str, *, bucket: trainingjob.S3Bucket | None, use: trainer_config.S3Use) -> RunDir:
    """The directory a storage path names: ``pathlib.Path`` for a local path, a ``StoragePath`` on S3 for
    ``s3://bucket/prefix`` (connected with ``bucket``'s endpoint, region and credentials)."""
    if not is_object_uri(storage_path):
        return pathlib.Path(storage_path)
    if bucket is None:
        raise StorageError(
            "StorageError",
            f"storage path {storage_path} is on S3, but spec.{_field(use)}.s3 does not say how to reach it",
        )
    return StoragePath(s3_filesystem(bucket, use=use), storage_path.removeprefix(S3_SCHEME).rstrip("/"))


def write_text(path: RunDir, text: str) -> None:
    """Whole or not at all, on either kind of path (a temp file renamed on the volume, one PUT on S3)."""
    if isinstance(path, StoragePath):
        path.write_text(text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


def append_line(path: RunDir, line: str) -> None:
    """Append one line. On S3, which has no append, the object is rewritten: for small records of one
    writer (rank 0's events) only."""
    if isinstance(path, StoragePath):
        try:
            before = path.read_text()
        except FileNotFoundError:
            before = ""
        path.write_text(before + line + "\n")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(line + "\n")


# -------------------------------------------------------------------------------- the start-up check
def check_writable(directory: RunDir) -> None:
    """Write, read back and delete a small object under ``directory``; ``StorageError`` saying why not.

    Run by the driver before any worker starts, so that a wrong Secret or a missing bucket is one sentence
    on the job's status instead of a failure deep inside the first checkpoint."""
    target = at(directory) if isinstance(directory, pathlib.Path) else directory
    probe = target / f".trainop-write-check-{uuid.uuid4().hex[:12]}"
    where = str(target)
    try:
        if not target.is_local:
            bucket = target.path.split("/", 1)[0]
            if target.fs.get_file_info(bucket).type == pafs.FileType.NotFound:
                raise StorageError(
                    "BucketNotFound",
                    f"bucket {bucket!r} does not exist (or these credentials may not see it): create it, or "
                    "correct spec.checkpoint.storage.s3.bucket",
                )
        else:
            target.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"trainop\n")
        if probe.read_bytes() != b"trainop\n":
            raise StorageError("StorageError", f"{where}: a test object read back differently than written")
        probe.unlink(missing_ok=True)
    except StorageError:
        raise
    except OSError as exc:
        raise classify(exc, where=where) from None


# Error texts of the AWS SDK (pyarrow raises OSError with the SDK's code in the message) and of curl.
_DENIED = (
    "ACCESS_DENIED",
    "SIGNATURE_DOES_NOT_MATCH",
    "INVALID_ACCESS_KEY_ID",
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
)
_NO_BUCKET = ("NO_SUCH_BUCKET", "NoSuchBucket")
_UNREACHABLE = (
    "curlCode",
    "NETWORK_CONNECTION",
    "Couldn't connect",
    "Could not resolve",
    "Connection refused",
    "Timeout was reached",
)


def classify(exc: BaseException, *, where: str) -> StorageError:
    """An S3 (or volume) error as a StorageError with a reason and one sentence saying what to do."""
    text = str(exc)
    first = text.splitlines()[0] if text else type(exc).__name__
    if any(code in text for code in _DENIED):
        return StorageError(
            "AccessDenied",
            f"{where} refused the credentials ({first}): check the keys in the credentials Secret "
            "(spec.checkpoint.storage.s3.credentialsSecret) and that they may read, write and delete objects "
            "under the prefix",
        )
    if any(code in text for code in _NO_BUCKET):
        return StorageError(
            "BucketNotFound", f"{where}: the bucket does not exist ({first}): create it or correct the bucket"
        )
    if any(code in text for code in _UNREACHABLE):
        return StorageError(
            "EndpointUnreachable",
            f"{where} cannot be reached ({first}): check spec.checkpoint.storage.s3.endpoint and that the "
            "pods' network may reach it",
        )
    if isinstance(exc, PermissionError):
        return StorageError("AccessDenied", f"{where} is not writable ({first}): check the volume's owner")
    return StorageError("StorageError", f"{where} cannot be used ({first})")
