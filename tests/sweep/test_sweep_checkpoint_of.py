"""The sweep's bestTrial.checkpoint when a trial was stopped between committing a checkpoint and recording
it (ASHA stops a trial at maxT, its last step: seen in a CI rehearsal, 2026-11-27). Files only, no Ray."""

from __future__ import annotations

import json
import pathlib

from trainop_trainer import checkpoint_store
from trainop_trainer.sweep import layout, monitor


def _trial(
    tmp_path: pathlib.Path, *, committed: list[int], written: list[int], recorded: int
) -> monitor.StatusPublisher:
    paths = layout.SweepPaths(storage_path=tmp_path, experiment_name="exp")
    run_dir = paths.run_dir("lr", "t1")
    checkpoints = run_dir / "checkpoints"
    for step in committed + written:
        step_dir = checkpoints / checkpoint_store.step_dir_name(step)
        step_dir.mkdir(parents=True)
        if step in committed:
            (step_dir / checkpoint_store.DCP_METADATA).write_bytes(b"x")
    record = {"checkpoint": {"path": str(checkpoints / checkpoint_store.step_dir_name(recorded))}}
    (run_dir / "status.json").write_text(json.dumps(record))
    return monitor.StatusPublisher(paths=paths, sweep_name="lr", target=None)


def test_a_newer_committed_checkpoint_than_the_recorded_one_is_the_trials_checkpoint(
    tmp_path: pathlib.Path,
) -> None:
    publisher = _trial(tmp_path, committed=[300, 400], written=[], recorded=300)
    assert publisher.checkpoint_of("t1") == str(
        publisher.paths.run_dir("lr", "t1") / "checkpoints" / "step_400"
    )


def test_an_uncommitted_newer_directory_does_not_replace_the_record(tmp_path: pathlib.Path) -> None:
    publisher = _trial(tmp_path, committed=[300], written=[400], recorded=300)
    assert publisher.checkpoint_of("t1") == str(
        publisher.paths.run_dir("lr", "t1") / "checkpoints" / "step_300"
    )


def test_without_a_record_there_is_no_checkpoint(tmp_path: pathlib.Path) -> None:
    paths = layout.SweepPaths(storage_path=tmp_path, experiment_name="exp")
    assert monitor.StatusPublisher(paths=paths, sweep_name="lr", target=None).checkpoint_of("t1") is None
