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

Reading, DCP seeks to every item of a file and ``torch.load``s it, which reads a few small pieces (the zip
records) before the tensor's bytes: against an object store each piece would be one ranged GET, hundreds
per checkpoint (GPT-small: 44 s instead of 4 s from the volume, measured). ``ReadAhead`` serves them from a
window of ``READ_WINDOW`` bytes fetched with one ranged GET; DCP reads a file's items in order, so a file
costs about its size / the window in requests. A tensor larger than the window is read on its own.

It must not decide where checkpoints go (``checkpoint_store``) or what they hold.
"""

from __future__ import annotations

import contextlib
import io
import os
import posixpath
from collections.abc import Generator
from typing import Any

import pyarrow.fs as pafs
from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemReader, FileSystemWriter

from trainop_trainer.storage import StoragePath

READ_WINDOW = 32 << 20


class ReadAhead(io.RawIOBase):
    """A seekable, read-only view of an object that fetches ``READ_WINDOW`` bytes per request."""

    def __init__(self, raw: Any, *, window: int = READ_WINDOW) -> None:
        super().__init__()
        self._raw = raw  # a pyarrow RandomAccessFile: read_at(nbytes, offset) is one ranged GET
        self._size = int(raw.size())
        self._window = window
        self._pos = 0
        self._start = 0
        self._buffer = memoryview(b"")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, target: Any) -> int:
        out = memoryview(target).cast("B")
        wanted = min(len(out), self._size - self._pos)
        if wanted <= 0:
            return 0
        if wanted > self._window:  # a large tensor: one request of its own, no copy through the window
            out[:wanted] = memoryview(self._raw.read_at(wanted, self._pos))
        else:
            if not (self._start <= self._pos and self._pos + wanted <= self._start + len(self._buffer)):
                self._start = self._pos
                self._buffer = memoryview(
                    self._raw.read_at(min(self._window, self._size - self._pos), self._pos)
                )
            begin = self._pos - self._start
            out[:wanted] = self._buffer[begin : begin + wanted]
        self._pos += wanted
        return wanted

    def close(self) -> None:
        self._buffer = memoryview(b"")
        self._raw.close()
        super().close()


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
        with ReadAhead(self.fs.open_input_file(target.path)) as stream:
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
