"""torch.distributed.checkpoint's storage writer and reader over a ``pyarrow.fs`` filesystem (S3).

DCP's own ``FileSystemWriter``/``FileSystemReader`` do all the work — planning, one file per rank (or per
thread), ``.metadata`` written last by the coordinator — through a small ``FileSystemBase`` interface
(open a stream, join paths, rename, exists, delete). This module gives them that interface on a pyarrow
filesystem, so checkpoints on S3 have exactly the layout and the commit rule they have on the volume.
(DCP's fsspec writer would do the same through s3fs, which the image does not have; pyarrow it has, and
Ray Train uses it for the same bucket.)

On S3 a data file is one object, uploaded in parts on pyarrow's background threads while DCP serialises
the next tensors, and completed when DCP closes the stream; ``.metadata`` is written to ``.metadata.tmp``
and renamed (an S3 copy: the new object appears whole) after every rank's data is complete. No ``fsync``:
an S3 object is durable once its upload completes. A local path keeps using DCP's plain writer and reader
(``checkpointer``), with their fsync.

It must not decide where checkpoints go (``checkpoint_store``) or what they hold.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from collections.abc import Generator
from typing import Any

import pyarrow.fs as pafs
from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemReader, FileSystemWriter

from trainop_trainer.storage import StoragePath


class ArrowFileSystem(FileSystemBase):
    """DCP's file-system interface on a pyarrow filesystem; paths are that filesystem's (``bucket/key``)."""

    def __init__(self, fs: pafs.FileSystem) -> None:
        self.fs = fs

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[Any, None, None]:
        target = StoragePath(self.fs, os.fspath(path))
        if "w" in mode:
            with target.open_output() as stream:
                yield stream
            return
        with self.fs.open_input_file(target.path) as stream:
            yield stream

    def concat_path(self, path: str | os.PathLike[str], suffix: str) -> str:
        return posixpath.join(os.fspath(path), suffix)

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        self.fs.move(os.fspath(path), os.fspath(new_path))

    def init_path(self, path: str | os.PathLike[str]) -> str:
        return os.fspath(path)

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        return None  # S3 keys need no parent directories (pyarrow would write an empty marker object)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False  # never chosen by DCP on its own: the checkpointer hands the writer and reader over

    def exists(self, path: str | os.PathLike[str]) -> bool:
        return bool(self.fs.get_file_info(os.fspath(path)).type != pafs.FileType.NotFound)

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        self.fs.delete_file(os.fspath(path))


class ArrowWriter(FileSystemWriter):
    """DCP's ``FileSystemWriter`` writing to ``directory`` on its pyarrow filesystem."""

    def __init__(self, directory: StoragePath, *, thread_count: int = 1) -> None:
        super().__init__(directory.path, sync_files=False, thread_count=thread_count)
        self.fs = ArrowFileSystem(directory.fs)  # type: ignore[assignment]  # (as DCP's fsspec writer)
        self.path = directory.path


class ArrowReader(FileSystemReader):
    """DCP's ``FileSystemReader`` reading from ``directory`` on its pyarrow filesystem."""

    def __init__(self, directory: StoragePath) -> None:
        super().__init__(directory.path)
        self.fs = ArrowFileSystem(directory.fs)  # type: ignore[assignment]  # (as DCP's fsspec writer)
        self.path = directory.path
