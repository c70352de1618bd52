"""Checkpoint files on disk: manifest and checksums, atomic writes, keep-last, corruption fallback, writer."""

from __future__ import annotations

import json
import logging
import pathlib
import threading

import pytest
import torch

from trainop_trainer import checkpoint


def payload(step: int) -> dict[str, object]:
    return {"model.pt": {"w": torch.full((4, 4), float(step))}, "train_state.pt": {"step": step}}


def save(root: pathlib.Path, step: int) -> checkpoint.SavedCheckpoint:
    return checkpoint.write(
        root,
        step=step,
        epoch=step // 10,
        world_size=2,
        payload=payload(step),
        progress={"batchesInEpoch": step},
    )


def test_manifest_records_step_epoch_position_and_a_sha256_of_every_file(tmp_path: pathlib.Path) -> None:
    saved = save(tmp_path, 30)
    manifest = json.loads((saved.path / "manifest.json").read_text())
    assert saved.path == tmp_path / "step_30"
    assert (manifest["step"], manifest["epoch"], manifest["worldSize"]) == (30, 3, 2)
    assert manifest["progress"] == {"batchesInEpoch": 30}
    assert set(manifest["files"]) == {"model.pt", "train_state.pt"}
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == checkpoint.sha256_file(saved.path / name)
        assert entry["bytes"] == (saved.path / name).stat().st_size
    assert torch.equal(saved.load("model.pt")["w"], torch.full((4, 4), 30.0))


def test_a_write_that_fails_midway_leaves_neither_a_step_directory_nor_a_temporary(
    tmp_path: pathlib.Path,
) -> None:
    class Unpicklable:
        def __reduce__(self) -> tuple[object, ...]:
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        checkpoint.write(
            tmp_path,
            step=5,
            epoch=0,
            world_size=1,
            payload={"a.pt": {"x": torch.ones(3)}, "b.pt": Unpicklable()},
        )
    assert list(tmp_path.iterdir()) == []


def test_keep_last_deletes_all_but_the_newest_checkpoints(tmp_path: pathlib.Path) -> None:
    for step in (10, 20, 30, 40, 50):
        save(tmp_path, step)
    removed = checkpoint.prune(tmp_path, keep_last=2)
    assert sorted(p.name for p in removed) == ["step_10", "step_20", "step_30"]
    assert [s for s, _ in checkpoint.list_step_dirs(tmp_path)] == [50, 40]


def test_steps_are_ordered_numerically_not_lexically(tmp_path: pathlib.Path) -> None:
    for step in (9, 100, 20):
        save(tmp_path, step)
    assert [s for s, _ in checkpoint.list_step_dirs(tmp_path)] == [100, 20, 9]
    latest = checkpoint.find_latest_valid(tmp_path)
    assert latest is not None and latest.step == 100


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("truncate", "bytes"),
        ("flip", "sha256"),
        ("delete_file", "missing"),
        ("delete_manifest", "no manifest"),
        ("garble_manifest", "unreadable manifest"),
    ],
)
def test_a_damaged_latest_checkpoint_is_skipped_with_a_warning_and_the_previous_one_used(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture, damage: str, reason: str
) -> None:
    save(tmp_path, 10)
    latest = save(tmp_path, 20)
    model = latest.path / "model.pt"
    if damage == "truncate":
        model.write_bytes(model.read_bytes()[:-17])
    elif damage == "flip":
        data = bytearray(model.read_bytes())
        data[len(data) // 2] ^= 0xFF
        model.write_bytes(bytes(data))
    elif damage == "delete_file":
        model.unlink()
    elif damage == "delete_manifest":
        (latest.path / "manifest.json").unlink()
    else:
        (latest.path / "manifest.json").write_text("{not json")

    with caplog.at_level(logging.WARNING, logger="trainop_trainer.checkpoint"):
        found = checkpoint.find_latest_valid(tmp_path)

    assert found is not None and found.step == 10
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("step_20" in w and reason in w and "falling back" in w for w in warnings), warnings
    # Moved aside, so that the step can be written again and is never picked up later.
    assert not (tmp_path / "step_20").exists()
    assert (tmp_path / "step_20.corrupt").is_dir()


def test_no_valid_checkpoint_at_all_means_a_fresh_start(tmp_path: pathlib.Path) -> None:
    broken = save(tmp_path, 10)
    (broken.path / "manifest.json").unlink()
    assert checkpoint.find_latest_valid(tmp_path) is None
    assert checkpoint.find_latest_valid(tmp_path / "does-not-exist") is None


def test_writing_a_step_again_replaces_the_old_directory(tmp_path: pathlib.Path) -> None:
    save(tmp_path, 10)
    again = checkpoint.write(
        tmp_path, step=10, epoch=9, world_size=1, payload={"model.pt": {"w": torch.zeros(1)}}
    )
    assert checkpoint.verify(again.path).epoch == 9
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_10"]


def test_leftover_temporaries_of_a_crashed_writer_are_removed_when_a_writer_starts(
    tmp_path: pathlib.Path,
) -> None:
    (tmp_path / ".tmp-step_30-abc").mkdir()
    (tmp_path / ".tmp-step_30-abc" / "model.pt").write_bytes(b"partial")
    save(tmp_path, 20)
    writer = checkpoint.CheckpointWriter(tmp_path, keep_last=3)
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_20"]


def test_to_cpu_snapshots_are_not_changed_by_later_in_place_updates() -> None:
    weight = torch.ones(3)
    snapshot = checkpoint.to_cpu({"w": weight, "nested": [weight, (weight,)]})
    weight.add_(5)
    assert torch.equal(snapshot["w"], torch.ones(3))
    assert torch.equal(snapshot["nested"][1][0], torch.ones(3))


def test_background_writer_writes_prunes_and_reports_each_checkpoint(tmp_path: pathlib.Path) -> None:
    reported: list[tuple[int, float]] = []
    writer = checkpoint.CheckpointWriter(
        tmp_path, keep_last=2, on_saved=lambda saved, seconds: reported.append((saved.step, seconds))
    )
    for step in (1, 2, 3):
        writer.submit(
            step=step, epoch=0, world_size=1, payload=payload(step), progress={}, metrics={"loss": 0.5}
        )
    last = writer.wait()
    writer.close()
    assert last is not None and last.step == 3
    assert [s for s, _ in reported] == [1, 2, 3]
    assert all(seconds >= 0 for _, seconds in reported)
    assert [s for s, _ in checkpoint.list_step_dirs(tmp_path)] == [3, 2]
    assert checkpoint.verify(tmp_path / "step_3").metrics == {"loss": 0.5}


def test_submit_returns_while_the_write_is_still_running(tmp_path: pathlib.Path) -> None:
    release = threading.Event()
    started = threading.Event()

    class SlowToPickle:
        def __reduce__(self) -> tuple[object, ...]:
            started.set()
            release.wait(10)
            return (dict, ())

    writer = checkpoint.CheckpointWriter(tmp_path, keep_last=3)
    writer.submit(step=7, epoch=0, world_size=1, payload={"slow.pt": SlowToPickle()}, progress={}, metrics={})
    assert started.wait(10)
    assert writer.busy and not (tmp_path / "step_7").exists()
    release.set()
    assert writer.wait() is not None
    writer.close()
    assert (tmp_path / "step_7" / "manifest.json").is_file()


def test_a_failed_background_write_is_raised_by_wait(tmp_path: pathlib.Path) -> None:
    class Broken:
        def __reduce__(self) -> tuple[object, ...]:
            raise OSError("no space left on device")

    writer = checkpoint.CheckpointWriter(tmp_path, keep_last=3)
    writer.submit(step=1, epoch=0, world_size=1, payload={"x.pt": Broken()}, progress={}, metrics={})
    with pytest.raises(OSError, match="no space left"):
        writer.wait()
    writer.close()
    assert checkpoint.list_step_dirs(tmp_path) == []
