"""The sampler position across a change of ``batchSizePerWorker`` between attempts.

The position is saved in micro-batches; a resume with another batch size must start after the same number
of samples, as a resume on another world size does. Real DCP saves and loads through the Checkpointer (a
gloo world of one in this process), and the real trainer under ``python -m trainop_trainer.launch``;
nothing is mocked.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import trainer_support

from trainop_trainer import config as config_module
from trainop_trainer import run_record, stateful
from trainop_trainer.checkpointer import Checkpointer


@pytest.fixture
def ctx() -> Iterator[Any]:
    with trainer_support.world_of_one() as world:
        yield world


@dataclasses.dataclass
class PositionBeforeBatchSize:
    """``DataPosition`` as checkpoints saved it before the batch size was part of it."""

    world_size: int
    epoch: int = 0
    batches_in_epoch: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batches_in_epoch": self.batches_in_epoch, "world_size": self.world_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise AssertionError("only saved")


def save_and_load(root: pathlib.Path, ctx: Any, saved: Any, loaded: stateful.DataPosition) -> None:
    """Save ``saved`` as the ``sampler`` part (with a train state beside it, as the Trainer registers them),
    then load that checkpoint into ``loaded`` with a new Checkpointer, as the next attempt does."""
    for part in (saved, loaded):
        checkpointer = Checkpointer(
            root=root,
            ctx=ctx,
            keep_last=3,
            record=run_record.RunRecord(
                paths=config_module.RunPaths(run_dir=root.parent), launch_id="t", is_rank0=True
            ),
        )
        checkpointer.register(stateful.TRAIN_STATE, stateful.TrainState(step=7))
        checkpointer.register(stateful.SAMPLER, part)
        try:
            if part is saved:
                checkpointer.save(step=7, epoch=part.epoch, progress={}, metrics={}, wait=True)
            else:
                assert checkpointer.load() is not None
        finally:
            checkpointer.close()


def test_a_larger_batch_size_resumes_after_the_same_samples_with_a_warning(
    tmp_path: pathlib.Path, ctx: Any, caplog: pytest.LogCaptureFixture
) -> None:
    saved = stateful.DataPosition(world_size=1, epoch=2, batches_in_epoch=6, batch_size=32)
    loaded = stateful.DataPosition(world_size=1, batch_size=64)

    with caplog.at_level(logging.WARNING, logger=stateful.__name__):
        save_and_load(tmp_path / "checkpoints", ctx, saved, loaded)

    assert (loaded.epoch, loaded.batches_in_epoch) == (2, 3)  # 6 x 32 = 3 x 64 samples
    assert "batchSizePerWorker changed 32 -> 64" in caplog.text


def test_a_batch_size_that_does_not_divide_rounds_down_and_world_size_changes_convert_too(
    tmp_path: pathlib.Path, ctx: Any
) -> None:
    saved = stateful.DataPosition(world_size=1, batches_in_epoch=10, batch_size=16)
    loaded = stateful.DataPosition(world_size=1, batch_size=24)

    save_and_load(tmp_path / "checkpoints", ctx, saved, loaded)

    assert loaded.batches_in_epoch == 6  # 160 samples: 6 whole batches of 24 (144), rounded down
    # Pure conversion of a saved state: 4 ranks x 10 batches x 16 = 640 samples = 2 ranks x 10 x 32.
    position = stateful.DataPosition(world_size=2, batch_size=32)
    position.load_state_dict({"epoch": 0, "batches_in_epoch": 10, "world_size": 4, "batch_size": 16})
    assert position.batches_in_epoch == 10


def test_a_checkpoint_saved_without_the_batch_size_still_loads_as_an_unchanged_batch_size(
    tmp_path: pathlib.Path, ctx: Any, caplog: pytest.LogCaptureFixture
) -> None:
    saved = PositionBeforeBatchSize(world_size=1, epoch=1, batches_in_epoch=9)
    loaded = stateful.DataPosition(world_size=1, batch_size=64)

    with caplog.at_level(logging.WARNING, logger=stateful.__name__):
        save_and_load(tmp_path / "checkpoints", ctx, saved, loaded)

    assert (loaded.epoch, loaded.batches_in_epoch) == (1, 9)
    assert "batchSizePerWorker changed" not in caplog.text


def test_the_trainer_resumes_after_the_same_samples_when_batch_size_per_worker_changes(
    tmp_path: pathlib.Path,
) -> None:
    """An attempt with ``batchSizePerWorker: 8`` checkpoints at step 10 (80 samples into the epoch); the
    next attempt, with 16, must go on from sample 80 (batch 5 of 16), so that its step 20 is 80 + 10 x 16
    = 240 samples into the epoch (2048 samples: no new epoch yet)."""
    first = trainer_support.mlp_config(tmp_path, "batch", workers=1, max_steps=10, batch_size=8)
    run = trainer_support.launch_one(first, tmp_path / "first.json")
    assert run.returncode == 0, run.stdout + run.stderr
    spec = first.spec.model_copy(deep=True)
    spec.hyperparameters.max_steps = 20
    spec.hyperparameters.batch_size_per_worker = 16
    second = first.model_copy(update={"spec": spec, "attempt": 2})
    run = trainer_support.launch_one(second, tmp_path / "second.json")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "batchSizePerWorker changed 8 -> 16" in run.stdout + run.stderr

    step_20 = trainer_support.run_dir(second) / "checkpoints" / "step_20"
    manifest = json.loads((step_20 / "manifest.json").read_text())
    assert (manifest["epoch"], manifest["progress"]["samplesInEpoch"]) == (0, 240)
    sampler = trainer_support.checkpoint_part(second, 20, stateful.SAMPLER)
    assert (sampler["batches_in_epoch"], sampler["batch_size"]) == (15, 16)
