"""The claim scripts of `kubectl trainop checkpoints` and `restart --from-step` on checkpoints the trainer
itself wrote (``trainop_trainer.checkpointer.Checkpointer`` over torch.distributed.checkpoint, in this
process as a world of one): the listing reads their manifests, an interrupted write is shown as such and is
never a resume point, and what the set-aside leaves is what the trainer's own lookup resumes from and its
pruning never touches. Nothing is mocked."""

from __future__ import annotations

import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
import trainer_support

from trainop.plugin import checkpoints
from trainop_trainer import config, distributed, run_record, stateful
from trainop_trainer.checkpoint_store import CheckpointStore
from trainop_trainer.checkpointer import Checkpointer


@pytest.fixture(scope="module")
def ctx() -> Iterator[distributed.WorkerContext]:
    with trainer_support.world_of_one() as rank0:
        yield rank0


def write_three(root: pathlib.Path, ctx: distributed.WorkerContext) -> None:
    model = torch.nn.Linear(64, 32)
    checkpointer = Checkpointer(
        root=root,
        ctx=ctx,
        keep_last=10,
        record=run_record.RunRecord(paths=config.RunPaths(run_dir=root.parent), launch_id="t", is_rank0=True),
    )
    checkpointer.register("model", stateful.ModelState(model))
    for step, loss in ((100, 0.9), (200, 0.5), (300, 0.4)):
        checkpointer.save(step=step, epoch=step // 100, progress={}, metrics={"loss": loss}, wait=True)
    checkpointer.close()


def run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60)


def test_the_listing_reads_step_epoch_time_size_and_loss_from_the_trainers_manifests(
    tmp_path: pathlib.Path, ctx: distributed.WorkerContext
) -> None:
    root = tmp_path / "checkpoints"
    write_three(root, ctx)
    rows = checkpoints.parse(run(checkpoints.LIST_SCRIPT, str(root)).stdout)
    assert [(r.step, r.epoch, r.loss, r.state) for r in rows] == [
        (100, 1, 0.9, "ok"),
        (200, 2, 0.5, "ok"),
        (300, 3, 0.4, "ok"),
    ]
    step_200 = root / "step_200"
    on_disk = sum(f.stat().st_size for f in step_200.iterdir() if f.name != "manifest.json")
    assert on_disk > 64 * 32 * 4  # the weights are in there
    assert rows[1].bytes == on_disk
    assert rows[1].time == CheckpointStore(root).validate(step_200).time


def test_an_interrupted_write_is_listed_as_incomplete_and_never_chosen_to_resume_from(
    tmp_path: pathlib.Path, ctx: distributed.WorkerContext
) -> None:
    root = tmp_path / "checkpoints"
    write_three(root, ctx)
    (root / "step_200" / ".metadata").unlink()  # as if the writer died before DCP committed
    rows = checkpoints.parse(run(checkpoints.LIST_SCRIPT, str(root)).stdout)
    assert [(r.step, r.state) for r in rows] == [(100, "ok"), (200, "incomplete"), (300, "ok")]
    assert "incomplete" in checkpoints.table(rows)
    done = run(checkpoints.SET_ASIDE_SCRIPT, str(root), "250", "20260301T120000Z")
    assert done.returncode == 0, done.stderr
    assert checkpoints.parse_set_aside(done.stdout) == {"resume": 100, "setAside": [300]}
    refused = run(checkpoints.SET_ASIDE_SCRIPT, str(root), "99", "20260301T120001Z")
    assert refused.returncode == 3
    assert "no complete checkpoint at or before step 99" in refused.stdout


def test_after_set_aside_the_trainer_resumes_from_the_chosen_step_and_keeps_the_others(
    tmp_path: pathlib.Path, ctx: distributed.WorkerContext
) -> None:
    root = tmp_path / "checkpoints"
    write_three(root, ctx)
    done = run(checkpoints.SET_ASIDE_SCRIPT, str(root), "250", "20260301T120000Z")
    assert checkpoints.parse_set_aside(done.stdout) == {"resume": 200, "setAside": [300]}
    saved = CheckpointStore(root).newest_valid()
    assert saved is not None and saved.step == 200  # what the next attempt resumes from
    # Training on writes step 300 again; keep-last pruning only ever sees step_<N> directories.
    write_three(root, ctx)
    CheckpointStore(root).prune(keep_last=1)
    names = sorted(p.name for p in root.iterdir())
    assert names == ["step_300", "step_300.set-aside-20260301T120000Z"]
    listed = checkpoints.parse(run(checkpoints.LIST_SCRIPT, str(root)).stdout)
    assert [(r.dir, r.state) for r in listed] == [
        ("step_300", "ok"),
        ("step_300.set-aside-20260301T120000Z", "set"),
    ]
