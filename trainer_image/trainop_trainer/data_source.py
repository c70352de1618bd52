"""The job's dataset directory (``spec.data``): where it is, and filling it from a bucket.

In a cluster the operator mounts the data at ``/data`` in every worker pod and says so in
``TRAINOP_DATA_DIR``: an existing claim, read-only; or, for an S3 prefix, an empty pod-local directory
that ``prepare`` fills before training. Every rank of a pod calls ``prepare``; they take turns on an
exclusive lock in that directory, so the first copies the objects under the prefix (each to a temporary
name, then renamed) and the others find them there. A file already present with the object's size is
kept, so a worker group restarted in the same pod copies nothing again. The data is then the same bytes
on every pod, which is what keeps per-rank sharding and the resumable sample order exact: they are a
function of the dataset's length, the seed and the position, never of where the files came from.

``with_data_dir`` makes a relative ``workload.dataset.path`` absolute inside the data directory, so that
the built-in datasets and the ``Context`` of user entrypoints (``ctx.data_dir``) see one path.

Outside a cluster (local mode, torchrun, the tests) ``TRAINOP_DATA_DIR`` names the directory; an S3
source is copied there the same way. It must not read the data itself: that is ``workloads``.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import pathlib
import posixpath
import time
import uuid
from collections.abc import Iterator

import pyarrow.fs as pafs

from trainop.api import trainer_config, trainingjob
from trainop_trainer import storage

log = logging.getLogger(__name__)

LOCK_FILE = ".trainop-sync.lock"


class DataSourceError(RuntimeError):
    """spec.data cannot be used, in one sentence naming the field."""


def data_dir(spec: trainingjob.TrainingJobSpec) -> pathlib.Path | None:
    """Where this worker sees ``spec.data``: ``TRAINOP_DATA_DIR``; None when the spec has no data."""
    if spec.data is None:
        return None
    configured = os.environ.get(trainer_config.DATA_DIR_ENV)
    if configured:
        return pathlib.Path(configured)
    if spec.data.existing_claim is not None:
        raise DataSourceError(
            f"spec.data.existingClaim {spec.data.existing_claim!r} is a volume of the cluster: outside a "
            f"cluster set {trainer_config.DATA_DIR_ENV} to a directory holding the same data"
        )
    raise DataSourceError(
        f"spec.data.s3 is copied into {trainer_config.DATA_DIR_ENV} before training, which is not set: set "
        "it to a directory with room for the data"
    )


def prepare(spec: trainingjob.TrainingJobSpec) -> pathlib.Path | None:
    """The data directory, filled from ``spec.data.s3`` when that is the source (see the module docstring)."""
    directory = data_dir(spec)
    if directory is None or spec.data is None or spec.data.s3 is None:
        return directory
    bucket = spec.data.s3
    source = storage.StoragePath(
        storage.s3_filesystem(bucket, use=trainer_config.S3_DATA),
        trainer_config.s3_uri(bucket)[len("s3://") :],
    )
    directory.mkdir(parents=True, exist_ok=True)
    with _exclusive(directory / LOCK_FILE):
        started = time.monotonic()
        try:
            copied, kept, size = sync(source, directory)
        except storage.StorageError:
            raise
        except OSError as exc:
            problem = storage.classify(exc, where=str(source))
            raise DataSourceError(f"spec.data.s3: {problem.message}") from None
    if copied:
        log.info(
            "data: copied %d object(s), %.1f MB, from %s to %s in %.1fs (%d already there)",
            copied,
            size / 1e6,
            source,
            directory,
            time.monotonic() - started,
            kept,
        )
    return directory


def sync(source: storage.StoragePath, directory: pathlib.Path) -> tuple[int, int, int]:
    """Copy every object under ``source`` that ``directory`` lacks (or holds with another size); returns
    (copied, kept, bytes copied). An empty prefix is an error: a typo would otherwise train on nothing."""
    objects = source.files()
    if not objects:
        raise DataSourceError(
            f"spec.data.s3: no objects under {source}: check the bucket and prefix (and that the credentials "
            "may list them)"
        )
    local = pafs.LocalFileSystem()
    copied = kept = size = 0
    for info in objects:
        relative = posixpath.relpath(info.path, source.path)
        target = directory / relative
        if target.is_file() and target.stat().st_size == info.size:
            kept += 1
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.part-{uuid.uuid4().hex[:8]}")
        try:
            pafs.copy_files(
                info.path, str(partial), source_filesystem=source.fs, destination_filesystem=local
            )
            partial.replace(target)
        finally:
            partial.unlink(missing_ok=True)
        copied += 1
        size += int(info.size or 0)
    return copied, kept, size


@contextlib.contextmanager
def _exclusive(path: pathlib.Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def with_data_dir(
    spec: trainingjob.TrainingJobSpec, directory: pathlib.Path | None
) -> trainingjob.TrainingJobSpec:
    """``spec`` with a relative ``workload.dataset.path`` made absolute inside ``directory``."""
    dataset = spec.workload.dataset
    if directory is None or dataset.path is None or os.path.isabs(dataset.path):
        return spec
    resolved = dataset.model_copy(update={"path": str(directory / dataset.path)})
    workload = spec.workload.model_copy(update={"dataset": resolved})
    return spec.model_copy(update={"workload": workload})
