"""``StoragePath.write_bytes`` on the volume: whole, no temp file left, and durable before it returns.

Real files in a temporary directory. Durability cannot be observed without crashing a machine, so the
fsync calls are recorded: ``os.fsync`` is wrapped with pytest's ``monkeypatch`` (the real fsync still runs)
and the test asserts what was synced, the file before its rename and its directory after. The manifest of
a checkpoint goes through the same call (``checkpoint_store.CheckpointStore.prepare``).
"""

from __future__ import annotations

import json
import os
import pathlib
import stat

import pytest

from trainop_trainer import checkpoint_store, storage


def record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every ``os.fsync`` from now on, in order, as (``dir`` or ``file``, the path it synced then)."""
    calls: list[tuple[str, str]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        calls.append((kind, os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def test_write_bytes_on_the_volume_fsyncs_the_file_then_its_directory_and_leaves_no_temp_file(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(``os.fsync`` is wrapped with monkeypatch to record its calls; the real fsync runs.)"""
    target = storage.at(tmp_path / "run" / "checkpoints" / "step_10" / "manifest.json")
    target.write_bytes(b"old")
    calls = record_fsyncs(monkeypatch)

    target.write_bytes(b'{"step": 10}')

    assert (tmp_path / "run" / "checkpoints" / "step_10" / "manifest.json").read_bytes() == b'{"step": 10}'
    assert os.listdir(tmp_path / "run" / "checkpoints" / "step_10") == ["manifest.json"]
    directory = str(tmp_path / "run" / "checkpoints" / "step_10")
    assert [kind for kind, _ in calls] == ["file", "dir"], calls
    synced_file, synced_dir = calls[0][1], calls[1][1]
    assert os.path.dirname(synced_file) == directory and ".tmp-" in os.path.basename(synced_file)
    assert synced_dir == directory


def test_a_checkpoints_manifest_on_the_volume_is_fsynced(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(``os.fsync`` is wrapped with monkeypatch to record its calls; the real fsync runs.)"""
    store = checkpoint_store.CheckpointStore(storage.at(tmp_path / "checkpoints"))
    calls = record_fsyncs(monkeypatch)

    path = store.prepare(checkpoint_store.Manifest(step=5, epoch=0, time="now", world_size=1))

    manifest = tmp_path / "checkpoints" / "step_5" / checkpoint_store.MANIFEST
    assert json.loads(manifest.read_text())["step"] == 5
    assert os.listdir(tmp_path / "checkpoints" / "step_5") == [checkpoint_store.MANIFEST]
    assert ("dir", path.path) in calls
    assert any(kind == "file" and os.path.dirname(p) == path.path for kind, p in calls), calls
