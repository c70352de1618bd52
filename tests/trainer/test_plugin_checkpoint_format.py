"""The claim scripts of `kubectl trainop checkpoints` and `restart --from-step` on checkpoints the trainer
itself wrote (``trainop_trainer.checkpoint.write``): the listing reads its manifests, and what the
set-aside leaves is what the trainer's own lookup resumes from and its pruning never touches."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import torch

from trainop.plugin import checkpoints
from trainop_trainer import checkpoint


def write_three(root: pathlib.Path) -> None:
    for step, loss in ((100, 0.9), (200, 0.5), (300, 0.4)):
        checkpoint.write(
            root,
            step=step,
            epoch=step // 100,
            world_size=2,
            payload={"model.pt": {"w": torch.ones(256)}, "optimizer.pt": {"m": torch.zeros(128)}},
            metrics={"loss": loss},
        )


def run(script: str, *args: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def test_the_listing_reads_step_epoch_time_size_and_loss_from_the_trainers_manifests(
    tmp_path: pathlib.Path,
) -> None:
    write_three(tmp_path)
    rows = checkpoints.parse(run(checkpoints.LIST_SCRIPT, str(tmp_path)))
    assert [(r.step, r.epoch, r.loss, r.state) for r in rows] == [
        (100, 1, 0.9, "ok"),
        (200, 2, 0.5, "ok"),
        (300, 3, 0.4, "ok"),
    ]
    on_disk = sum(f.stat().st_size for f in (tmp_path / "step_200").iterdir() if f.name != "manifest.json")
    assert rows[1].bytes == on_disk
    assert rows[1].time == checkpoint.verify(tmp_path / "step_200").time


def test_after_set_aside_the_trainer_resumes_from_the_chosen_step_and_keeps_the_others(
    tmp_path: pathlib.Path,
) -> None:
    write_three(tmp_path)
    out = run(checkpoints.SET_ASIDE_SCRIPT, str(tmp_path), "250", "20260301T120000Z")
    assert checkpoints.parse_set_aside(out) == {"resume": 200, "setAside": [300]}
    saved = checkpoint.find_latest_valid(tmp_path)
    assert saved is not None and saved.step == 200  # what the next attempt resumes from
    # Training on writes step 300 again; keep-last pruning only ever sees step_<N> directories.
    write_three(tmp_path)
    checkpoint.prune(tmp_path, keep_last=1)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["step_300", "step_300.set-aside-20260301T120000Z"]
    listed = checkpoints.parse(run(checkpoints.LIST_SCRIPT, str(tmp_path)))
    assert [(r.dir, r.state) for r in listed] == [
        ("step_300", "ok"),
        ("step_300.set-aside-20260301T120000Z", "set"),
    ]
