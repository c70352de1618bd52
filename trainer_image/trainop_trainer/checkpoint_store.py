"""Where checkpoints live and which of them count: the layout, the commit marker, validation, retention.

Layout, one directory per optimizer step under the run directory (``<storagePath>/<runName>/``)::

    checkpoints/step_<N>/
        manifest.json        trainop's description: format 2, step, epoch, time, world size, the parts it
                             holds, position in the epoch, metrics (rank 0 writes it first)
        __<rank>_<i>.distcp  torch.distributed.checkpoint data, written by every rank in parallel
        .metadata            DCP's metadata, written by rank 0 once every rank's data is written: the
                             commit marker

A directory is a checkpoint only once ``.metadata`` is there; without it, it is an interrupted write and
is deleted when the next writer or reader looks. Format 1 directories (``manifest.json`` with sha256 of
``model.pt`` etc., written before DCP) are still listed, for one release, and read by ``checkpoint_legacy``.

Validation is cheap on purpose — a stat per file, no hashing: the manifest and DCP's metadata must parse and
every file the metadata points into must exist and be long enough. That catches a missing or truncated file
(a node lost mid-copy, a full disk); a bit flip inside tensor data is not detected (format 1's sha256 was,
at the price of reading every byte again on every resume). A checkpoint that fails validation, or that
validated but failed to load, is moved aside to ``step_<N>.corrupt`` with a warning, and the previous one is
used.

The directory is a ``storage.StoragePath``: on the checkpoint volume (pyarrow's local filesystem) or in an
S3 bucket, with one code path. On S3 the rules hold as they do on the volume: the commit marker is an object
that appears whole once every rank's data objects are complete (DCP writes it last), an upload killed midway
leaves no object, and deleting a checkpoint deletes its ``.metadata`` first, so that a half-deleted one is
never taken for committed. Moving a directory aside is a copy on S3, not atomic; it only ever moves a
checkpoint that is already known to be broken or uncommitted.

Only rank 0 calls the mutating functions. This module must not know about models or ranks.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import re
import uuid
from collections.abc import Collection
from typing import Any

import pyarrow.fs as pafs

from trainop_trainer import storage
from trainop_trainer.storage import StoragePath

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
LEGACY_FORMAT_VERSION = 1
MANIFEST = "manifest.json"
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's metadata file: the commit marker
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(Exception):
    """A checkpoint directory that cannot be used (one sentence saying why)."""


@dataclasses.dataclass(frozen=True)
class Manifest:
    step: int
    epoch: int
    time: str
    world_size: int
    format: int = FORMAT_VERSION
    parts: tuple[str, ...] = ()  # the registered parts this checkpoint holds (format 2)
    # Position inside the epoch and other counters, for people and for status; the loop restores its own
    # position from the checkpoint's parts.
    progress: dict[str, int] = dataclasses.field(default_factory=dict)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    # The evaluation at this step (spec.evaluation), which checkpoint.keepBest ranks by.
    evaluation: dict[str, float] = dataclasses.field(default_factory=dict)
    # Format 1 only: file name -> {"sha256", "bytes"}.
    files: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "format": self.format,
            "step": self.step,
            "epoch": self.epoch,
            "time": self.time,
            "worldSize": self.world_size,
            "parts": list(self.parts),
            "progress": self.progress,
            "metrics": self.metrics,
        }
        if self.evaluation:
            data["evaluation"] = self.evaluation
        if self.files:
            data["files"] = self.files
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        version = data.get("format")
        if version not in (FORMAT_VERSION, LEGACY_FORMAT_VERSION):
            raise CheckpointError(f"unknown manifest format {version!r}")
        return cls(
            format=int(version),
            step=int(data["step"]),
            epoch=int(data["epoch"]),
            time=str(data["time"]),
            world_size=int(data["worldSize"]),
            parts=tuple(str(p) for p in data.get("parts", ())),
            progress={k: int(v) for k, v in data.get("progress", {}).items()},
            metrics={k: float(v) for k, v in data.get("metrics", {}).items()},
            evaluation={k: float(v) for k, v in data.get("evaluation", {}).items()},
            files={k: dict(v) for k, v in data.get("files", {}).items()},
        )

    @property
    def legacy(self) -> bool:
        return self.format == LEGACY_FORMAT_VERSION


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A committed checkpoint: its directory and its manifest."""

    path: StoragePath
    manifest: Manifest

    @property
    def step(self) -> int:
        return self.manifest.step


def step_dir_name(step: int) -> str:
    return f"step_{step}"


def step_of_dir_name(name: str) -> int | None:
    """The step of a ``step_<N>`` directory name (None for any other name)."""
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


class CheckpointStore:
    """The ``checkpoints/`` directory of one run, on the volume or in a bucket."""

    def __init__(self, root: str | os.PathLike[str] | StoragePath) -> None:
        self.root = storage.at(root)

    def step_path(self, step: int) -> StoragePath:
        return self.root / step_dir_name(step)

    def _listing(self) -> dict[str, pafs.FileInfo]:
        return {info.base_name: info for info in self.root.iterdir()}

    def step_dirs(self) -> list[tuple[int, StoragePath]]:
        """``(step, path)`` of every ``step_<N>`` directory, committed or not, newest first."""
        found = []
        for name, info in self._listing().items():
            step = step_of_dir_name(name)
            if step is not None and info.type == pafs.FileType.Directory:
                found.append((step, self.root / name))
        return sorted(found, key=lambda entry: entry[0], reverse=True)

    @staticmethod
    def is_committed(path: StoragePath) -> bool:
        """Format 2: DCP's metadata is there. Format 1: its manifest is there (written last, then renamed)."""
        if (path / DCP_METADATA).is_file():
            return True
        try:
            manifest = (path / MANIFEST).read_text()
        except FileNotFoundError:
            return False
        try:
            return bool(json.loads(manifest).get("format") == LEGACY_FORMAT_VERSION)
        except ValueError:
            return False

    def committed_steps(self) -> list[int]:
        return [step for step, path in self.step_dirs() if self.is_committed(path)]

    # ----------------------------------------------------------------------------------------- writing
    def prepare(self, manifest: Manifest) -> StoragePath:
        """Rank 0, before a save: an empty ``step_<N>`` holding only the manifest. A directory left there
        (an interrupted write, or the same step written before a resume from an older checkpoint) is deleted
        first, its commit marker before anything else, so that a stale ``.metadata`` can never commit new
        data (on the volume it is moved aside in one rename, then deleted)."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.step_path(manifest.step)
        if path.exists():
            if path.is_local:
                old = self.root / f".old-{path.name}-{uuid.uuid4().hex[:12]}"
                path.move_tree(old)
                old.delete_tree()
            else:
                self.delete(path)
        # Other ranks' DCP writers may create the directory too (before any of them writes data).
        path.mkdir(exist_ok=True)
        (path / MANIFEST).write_text(manifest.to_json())
        return path

    def delete(self, path: StoragePath) -> None:
        """Delete a checkpoint directory, its commit marker first."""
        (path / DCP_METADATA).unlink(missing_ok=True)
        path.delete_tree()

    def prune(self, *, keep_last: int, keep: Collection[StoragePath] = ()) -> list[StoragePath]:
        """Delete all but the ``keep_last`` newest committed checkpoints, and never those in ``keep`` (the
        Checkpointer's retention decides which, e.g. the best one); returns what was deleted."""
        spared = {str(path) for path in keep}  # by location: same path string on the same store
        committed = [path for _, path in self.step_dirs() if self.is_committed(path)]
        removed = []
        for path in committed[keep_last:]:
            if str(path) in spared:
                continue
            self.delete(path)
            removed.append(path)
        return removed

    def remove_stale(self) -> None:
        """Leftovers of a writer that died: ``.old-*``/``.tmp-*`` directories and uncommitted step dirs.
        Call only when no save is in flight (a new worker group, before its first save)."""
        for name, info in self._listing().items():
            if name.startswith((".tmp-", ".old-")) and info.type == pafs.FileType.Directory:
                (self.root / name).delete_tree()
        for _, path in self.step_dirs():
            if not self.is_committed(path):
                log.warning("removing %s: an interrupted checkpoint write (no %s)", path, DCP_METADATA)
                path.delete_tree()

    def quarantine(self, path: StoragePath) -> StoragePath:
        """Move a broken checkpoint aside (kept for a look, never picked again)."""
        target = path.parent / f"{path.name}.corrupt"
        if target.exists():
            target = path.parent / f"{path.name}.corrupt-{uuid.uuid4().hex[:8]}"
        if not path.is_local:
            (path / DCP_METADATA).unlink(missing_ok=True)  # not committed any more, even if the copy stops
        path.move_tree(target)
        log.warning("moved %s aside to %s", path.name, target.name)
        return target

    # ----------------------------------------------------------------------------------------- reading
    def validate(self, path: str | os.PathLike[str] | StoragePath) -> Manifest:
        """The manifest of a complete checkpoint directory; ``CheckpointError`` (saying why) otherwise."""
        path = storage.at(path)
        try:
            text = (path / MANIFEST).read_text()
        except FileNotFoundError:
            raise CheckpointError("no manifest.json (an interrupted or foreign write)") from None
        except OSError as exc:  # e.g. S3: the object's checksum no longer matches its bytes
            raise CheckpointError(f"unreadable manifest.json ({exc})") from None
        try:
            manifest = Manifest.from_json(text)
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"unreadable manifest.json ({exc})") from None
        if manifest.legacy:
            from trainop_trainer import checkpoint_legacy

            checkpoint_legacy.verify(pathlib.Path(path.path), manifest)
            return manifest
        _validate_dcp(path)
        return manifest

    def newest_valid(self) -> Checkpoint | None:
        """The newest checkpoint that validates; broken newer ones are logged and moved aside."""
        for _, path in self.step_dirs():
            if not self.is_committed(path):
                continue
            try:
                return Checkpoint(path=path, manifest=self.validate(path))
            except CheckpointError as exc:
                log.warning(
                    "checkpoint %s is unusable: %s; falling back to the previous checkpoint", path, exc
                )
                self.quarantine(path)
        return None


def _validate_dcp(path: StoragePath) -> None:
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    from trainop_trainer import dcp_storage

    try:
        reader = FileSystemReader(path.path) if path.is_local else dcp_storage.ArrowReader(path)
        metadata = reader.read_metadata()
    except Exception as exc:
        raise CheckpointError(f"unreadable {DCP_METADATA} ({type(exc).__name__}: {exc})") from None
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        end = int(info.offset) + int(info.length)
        needed[info.relative_path] = max(end, needed.get(info.relative_path, 0))
    sizes = {info.base_name: info.size for info in path.iterdir() if info.type == pafs.FileType.File}
    for name, end in sorted(needed.items()):
        if name not in sizes:
            raise CheckpointError(f"{name} is missing")
        size = int(sizes[name])
        if size < end:
            raise CheckpointError(f"{name} has {size} bytes, the metadata needs {end}")
