"""The Checkpointer over torch.distributed.checkpoint: commit marker, keep-last, fallback, parts, format 1.

Real DCP writes and reads, in this process as a world of one (gloo), each test twice: on a directory (the
checkpoint volume) and in a bucket of a real S3 server (versitygw, tests/objectstore), whose objects are
files in a directory of this machine, so that a test can damage them the same way in both places. The
multi-rank behaviour (resharding, every rank writing its share) is tested under torchrun in
``test_trainer_resharding.py`` and through the trainer in ``test_trainer_launch.py`` / ``test_trainer_ray.py``
(on S3 too). Nothing is mocked.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import trainer_support

from tests.objectstore.server import S3Server
from trainop.api import experiment, trainer_config
from trainop_trainer import checkpoint_store, distributed, run_record, stateful, storage
from trainop_trainer.checkpointer import Checkpointer

LEGACY = trainer_support.REPO / "tests" / "trainer" / "data" / "legacy_v1" / "checkpoints"


@pytest.fixture(scope="module", autouse=True)
def world_of_one() -> Iterator[None]:
    with trainer_support.world_of_one():
        yield


CTX = distributed.WorkerContext(
    rank=0,
    world_size=1,
    local_rank=0,
    local_world_size=1,
    node_rank=0,
    device=torch.device("cpu"),
    backend="gloo",
)


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a test's checkpoints go (``root``, as the Checkpointer is given it) and where their files are on
    this machine (``disk``: the same directory, or the S3 server's directory behind the bucket's keys).
    Tests look at ``disk`` and damage files through ``root`` (S3's API: the server checks what it serves
    against the checksums it stored, so bytes changed behind its back are a read error, not a damage)."""

    root: storage.RunDir
    disk: pathlib.Path

    def file(self, relative: pathlib.Path) -> storage.RunDir:
        """A file under ``disk`` as the checkpointer sees it (``relative`` to ``disk``)."""
        target = self.root
        for part in relative.relative_to(self.disk).parts:
            target = target / part
        return target


@pytest.fixture(params=["volume", "s3"])
def place(request: pytest.FixtureRequest, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Place:
    if request.param == "volume":
        return Place(root=tmp_path / "checkpoints", disk=tmp_path / "checkpoints")
    server: S3Server = request.getfixturevalue("s3_server")
    bucket = server.create_bucket(f"ckpt-{uuid.uuid4().hex[:12]}")
    for key, value in server.env(trainer_config.S3_CHECKPOINT).items():
        monkeypatch.setenv(key, value)
    # As the trainer connects: storage path, the spec's S3Bucket, the Secret's keys from the environment.
    run = storage.for_uri(
        f"s3://{bucket}/run", bucket=server.bucket(bucket), use=trainer_config.S3_CHECKPOINT
    )
    return Place(root=run / "checkpoints", disk=server.root / bucket / "run" / "checkpoints")


class Loop:
    """A small model, its optimizer and counters, registered as the built-in Trainer registers them."""

    def __init__(
        self,
        root: storage.RunDir,
        *,
        seed: int = 0,
        keep_last: int = 10,
        keep_best: experiment.KeepBest | None = None,
    ) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.01)
        self.train_state = stateful.TrainState()
        self.position = stateful.DataPosition(world_size=1)
        self.committed: list[int] = []
        self.checkpointer = Checkpointer(
            root=root,
            ctx=CTX,
            keep_last=keep_last,
            record=run_record.RunRecord(paths=_paths(root), launch_id="test", is_rank0=True),
            on_committed=lambda saved, seconds: self.committed.append(saved.step),
            keep_best=keep_best,
        )
        for name, part in (
            ("model", stateful.ModelState(self.model)),
            ("optimizer", stateful.OptimizerState(self.model, self.optimizer)),
            ("train_state", self.train_state),
            ("sampler", self.position),
            ("rng", stateful.RNGState(torch.device("cpu"))),
        ):
            self.checkpointer.register(name, part)

    def train(self, steps: int) -> None:
        for _ in range(steps):
            loss = self.model(torch.randn(5, 4)).square().mean()
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.train_state.step += 1
            self.position.batches_in_epoch += 1

    def save(self, *, wait: bool = True, evaluation: dict[str, float] | None = None) -> None:
        self.checkpointer.save(
            step=self.train_state.step,
            epoch=self.position.epoch,
            progress={"batchesInEpoch": self.position.batches_in_epoch},
            metrics={"loss": 0.5},
            wait=wait,
            evaluation=evaluation,
        )

    def params(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}


def _paths(root: storage.RunDir) -> Any:
    from trainop_trainer import config as config_module

    return config_module.RunPaths(run_dir=root.parent)


def test_a_saved_checkpoint_restores_every_part_exactly_and_continues_the_same_way(place: Place) -> None:
    root = place.root
    first = Loop(root)
    first.train(7)
    first.save(wait=False)
    first.checkpointer.wait()
    expected = first.params()
    first.train(3)  # what an uninterrupted run does next (RNG included)
    continued = first.params()
    first.checkpointer.close()

    second = Loop(root, seed=99)
    restored = second.checkpointer.load()
    second.checkpointer.close()

    assert restored is not None and restored.step == 7
    assert (second.train_state.step, second.position.batches_in_epoch) == (7, 7)
    assert all(torch.equal(second.params()[k], v) for k, v in expected.items())
    second.train(3)
    assert all(torch.equal(second.params()[k], v) for k, v in continued.items())


def test_the_manifest_is_written_first_and_dcp_metadata_last_commits_the_directory(place: Place) -> None:
    loop = Loop(place.root)
    loop.train(3)
    loop.save()
    loop.checkpointer.close()
    step_dir = place.disk / "step_3"
    manifest = json.loads((step_dir / "manifest.json").read_text())
    assert (manifest["format"], manifest["step"], manifest["worldSize"]) == (2, 3, 1)
    assert manifest["parts"] == ["model", "optimizer", "rng", "sampler", "train_state"]
    assert manifest["progress"] == {"batchesInEpoch": 3} and manifest["metrics"] == {"loss": 0.5}
    assert (step_dir / ".metadata").is_file() and list(step_dir.glob("*.distcp"))
    assert loop.committed == [3]


def test_keep_last_deletes_all_but_the_newest_committed_checkpoints(place: Place) -> None:
    loop = Loop(place.root, keep_last=2)
    for _ in range(5):
        loop.train(1)
        loop.save(wait=False)
    loop.checkpointer.close()
    assert checkpoint_store.CheckpointStore(place.root).committed_steps() == [5, 4]
    assert loop.committed == [1, 2, 3, 4, 5]


def test_a_directory_without_dcp_metadata_is_never_loaded_and_is_removed(
    place: Place, caplog: pytest.LogCaptureFixture
) -> None:
    loop = Loop(place.root)
    loop.train(2)
    loop.save()
    loop.train(2)
    loop.save()
    loop.checkpointer.close()
    place.file(place.disk / "step_4" / ".metadata").unlink()  # as if the write was interrupted

    with caplog.at_level(logging.WARNING, logger="trainop_trainer.checkpoint_store"):
        again = Loop(place.root, seed=5)
        restored = again.checkpointer.load()
        again.checkpointer.close()

    assert restored is not None and restored.step == 2
    assert not (place.disk / "step_4").exists()
    assert any("interrupted checkpoint write" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("truncate", "bytes, the metadata needs"),
        ("delete_data", "is missing"),
        ("garble_metadata", "unreadable .metadata"),
        ("garble_manifest", "unreadable manifest.json"),
    ],
)
def test_a_damaged_newest_checkpoint_is_moved_aside_with_a_warning_and_the_previous_one_used(
    place: Place, caplog: pytest.LogCaptureFixture, damage: str, reason: str
) -> None:
    loop = Loop(place.root)
    loop.train(2)
    loop.save()
    at_two = loop.params()
    loop.train(2)
    loop.save()
    loop.checkpointer.close()
    newest = place.disk / "step_4"
    data = place.file(sorted(newest.glob("*.distcp"))[0])
    if damage == "truncate":
        data.write_bytes(data.read_bytes()[:-17])
    elif damage == "delete_data":
        data.unlink()
    elif damage == "garble_metadata":
        place.file(newest / ".metadata").write_bytes(b"not a pickle")
    else:
        place.file(newest / "manifest.json").write_text("{not json")

    with caplog.at_level(logging.WARNING, logger="trainop_trainer.checkpoint_store"):
        again = Loop(place.root, seed=5)
        restored = again.checkpointer.load()
        again.checkpointer.close()

    assert restored is not None and restored.step == 2
    assert all(torch.equal(again.params()[k], v) for k, v in at_two.items())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("step_4" in w and reason in w and "falling back" in w for w in warnings), warnings
    assert not newest.exists() and (place.disk / "step_4.corrupt").is_dir()


def test_a_checkpoint_that_validates_but_cannot_be_read_falls_back_too(
    place: Place, caplog: pytest.LogCaptureFixture
) -> None:
    loop = Loop(place.root)
    loop.train(2)
    loop.save()
    loop.train(2)
    loop.save()
    loop.checkpointer.close()
    for data in map(place.file, (place.disk / "step_4").glob("*.distcp")):
        data.write_bytes(bytes(len(data.read_bytes())))  # right sizes, nothing readable

    with caplog.at_level(logging.WARNING, logger="trainop_trainer.checkpointer"):
        again = Loop(place.root, seed=5)
        restored = again.checkpointer.load()
        again.checkpointer.close()

    assert restored is not None and restored.step == 2 and again.train_state.step == 2
    assert any("step_4 failed to load" in r.getMessage() for r in caplog.records)
    assert (place.disk / "step_4.corrupt").is_dir()


def test_when_the_only_checkpoint_cannot_be_read_the_start_fails_instead_of_training_on_half_loaded_state(
    place: Place,
) -> None:
    loop = Loop(place.root)
    loop.train(2)
    loop.save()
    loop.checkpointer.close()
    for data in map(place.file, (place.disk / "step_2").glob("*.distcp")):
        data.write_bytes(bytes(len(data.read_bytes())))
    again = Loop(place.root, seed=5)
    with pytest.raises(
        checkpoint_store.CheckpointError, match="next start of the worker group begins at step 0"
    ):
        again.checkpointer.load()
    again.checkpointer.close()
    assert checkpoint_store.CheckpointStore(place.root).committed_steps() == []


def test_no_checkpoint_at_all_means_a_fresh_start(place: Place) -> None:
    loop = Loop(place.root)
    assert loop.checkpointer.load() is None
    loop.checkpointer.close()


def test_writing_a_step_again_replaces_the_old_directory(place: Place) -> None:
    loop = Loop(place.root)
    loop.train(3)
    loop.save()
    loop.train_state.step = 3  # a resume from an older checkpoint reaches step 3 again
    loop.position.epoch = 9
    loop.save()
    loop.checkpointer.close()
    manifest = checkpoint_store.CheckpointStore(place.root).validate(place.root / "step_3")
    assert manifest.epoch == 9
    assert sorted(p.name for p in place.disk.iterdir()) == ["step_3"]


def test_a_failed_background_write_is_raised_by_wait_and_leaves_no_committed_checkpoint(place: Place) -> None:
    class Unpicklable:
        """Staged (copied) fine on the training thread; fails when the background thread writes it."""

        def __deepcopy__(self, memo: dict[int, object]) -> Unpicklable:
            return self

        def __reduce__(self) -> tuple[object, ...]:
            raise OSError("no space left on device")

    class Broken:
        def state_dict(self) -> dict[str, Any]:
            return {"x": Unpicklable()}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            del state_dict

    loop = Loop(place.root)
    loop.checkpointer.register("broken", Broken())
    loop.train(1)
    loop.save(wait=False)
    with pytest.raises(BaseException, match="no space left"):  # DCP's CheckpointException
        loop.checkpointer.wait()
    loop.checkpointer.close()
    assert checkpoint_store.CheckpointStore(place.root).committed_steps() == []


def test_a_user_state_comes_back_with_its_structure_integer_keys_and_tensors(place: Place) -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "extra": (1, "two", [3.0])}
    user = stateful.UserState(is_rank0=True)
    checkpointer = Checkpointer(
        root=place.root,
        ctx=CTX,
        keep_last=3,
        record=run_record.RunRecord(paths=_paths(place.root), launch_id="t", is_rank0=True),
    )
    checkpointer.register("user", user)
    user.pending = state
    checkpointer.save(step=1, epoch=0, progress={}, metrics={}, wait=True)
    checkpointer.close()

    reader = stateful.UserState(is_rank0=True)
    again = Checkpointer(
        root=place.root,
        ctx=CTX,
        keep_last=3,
        record=run_record.RunRecord(paths=_paths(place.root), launch_id="t", is_rank0=True),
    )
    again.register("user", reader)
    assert again.load() is not None
    again.close()
    restored = reader.restored
    assert restored is not None and restored["extra"] == (1, "two", [3.0])
    assert set(restored["optimizer"]["state"]) == {0, 1}
    fresh = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    fresh.load_state_dict(restored["optimizer"])
    assert torch.equal(
        fresh.state[model.weight]["momentum_buffer"], optimizer.state[model.weight]["momentum_buffer"]
    )
    assert torch.equal(restored["model"]["weight"], model.weight.detach())


# -------------------------------------------------------------------------------------------- format 1
def _legacy_run(tmp_path: pathlib.Path) -> pathlib.Path:
    root = tmp_path / "checkpoints"
    shutil.copytree(LEGACY, root)
    return root


def test_a_format_1_checkpoint_written_by_the_previous_trainer_loads_into_the_parts(
    tmp_path: pathlib.Path,
) -> None:
    root = _legacy_run(tmp_path)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )
    holder = torch.nn.Module()
    holder.net = model  # the MLP workload's parameter names: net.0.weight, ...
    optimizer = torch.optim.SGD(holder.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    train_state, position = stateful.TrainState(), stateful.DataPosition(world_size=2)
    checkpointer = Checkpointer(
        root=root,
        ctx=CTX,
        keep_last=3,
        record=run_record.RunRecord(paths=_paths(root), launch_id="t", is_rank0=True),
    )
    for name, part in (
        ("model", stateful.ModelState(holder)),
        ("optimizer", stateful.OptimizerState(holder, optimizer)),
        ("lr_schedule", stateful.LRSchedulerState(scheduler)),
        ("train_state", train_state),
        ("sampler", position),
    ):
        checkpointer.register(name, part)

    restored = checkpointer.load()
    checkpointer.close()

    assert restored is not None and restored.step == 30 and restored.manifest.legacy
    saved_model = torch.load(root / "step_30" / "model.pt", weights_only=True)
    assert all(torch.equal(holder.state_dict()[k], v) for k, v in saved_model.items())
    saved_optimizer = torch.load(root / "step_30" / "optimizer.pt", weights_only=True)
    for index, param in enumerate(holder.parameters()):
        assert torch.equal(
            optimizer.state[param]["momentum_buffer"], saved_optimizer["state"][index]["momentum_buffer"]
        )
    assert (train_state.step, position.epoch, position.batches_in_epoch) == (30, 0, 30)
    assert scheduler.last_epoch == 30


def test_a_corrupt_format_1_checkpoint_falls_back_by_its_sha256(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = _legacy_run(tmp_path)
    model_file = root / "step_30" / "model.pt"
    data = bytearray(model_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model_file.write_bytes(bytes(data))
    store = checkpoint_store.CheckpointStore(root)
    with caplog.at_level(logging.WARNING, logger="trainop_trainer.checkpoint_store"):
        found = store.newest_valid()
    assert found is not None and found.step == 20 and found.manifest.legacy
    assert any("sha256" in r.getMessage() and "step_30" in r.getMessage() for r in caplog.records)


def test_a_stager_that_closed_itself_after_a_save_is_replaced_for_the_next_one(
    tmp_path: pathlib.Path,
) -> None:
    """PyTorch 2.11's DefaultStager closes its StateDictStager at the end of every stage
    (pytorch/pytorch#183413), and the next save with the same stager failed with ``KeyError: <class 'type'>``
    (the FSDP benchmark on an H200). The torch installed here is fixed, so the test closes the stager's
    StateDictStager itself after the first save, exactly as 2.11 does; the second save must still commit."""
    loop = Loop(tmp_path / "checkpoints")
    loop.train(2)
    loop.save()
    (stager,) = loop.checkpointer._stagers.values()
    stager._state_dict_stager.close()  # what torch 2.11's DefaultStager._stage ends with
    loop.train(2)
    loop.save()
    loop.checkpointer.close()
    assert loop.committed == [2, 4]
    assert checkpoint_store.CheckpointStore(tmp_path / "checkpoints").committed_steps() == [4, 2]


@pytest.mark.parametrize(
    ("mode", "best_step"), [("max", 20), ("min", 10)], ids=["max-accuracy", "min-accuracy"]
)
def test_the_best_checkpoint_by_its_evaluation_outlives_keep_last_and_is_found_again_after_a_restart(
    place: Place, mode: str, best_step: int
) -> None:
    root = place.root
    keep_best = experiment.KeepBest(metric="accuracy", mode=experiment.BestMode(mode))
    accuracy = {10: 0.5, 20: 0.9, 30: 0.7, 40: 0.8, 50: 0.6}
    loop = Loop(root, keep_last=2, keep_best=keep_best)
    for step, value in accuracy.items():
        loop.train(step - loop.train_state.step)
        loop.save(evaluation={"accuracy": value, "loss": 1.0 - value})
    best = loop.checkpointer.best_status()
    loop.checkpointer.close()

    kept = checkpoint_store.CheckpointStore(root).committed_steps()
    assert kept == sorted({40, 50, best_step}, reverse=True)
    assert best is not None
    assert (best.step, best.metric, best.value) == (best_step, "accuracy", accuracy[best_step])
    assert best.path == str(root / f"step_{best_step}")
    manifest = json.loads((place.disk / f"step_{best_step}" / "manifest.json").read_text())
    assert manifest["evaluation"] == {"accuracy": accuracy[best_step], "loss": 1.0 - accuracy[best_step]}

    # A new worker group finds the same best in storage and keeps sparing it.
    again = Loop(root, keep_last=2, keep_best=keep_best)
    again.checkpointer.load()
    again.train(10)
    again.save(evaluation={"accuracy": 0.75, "loss": 0.25})
    again.checkpointer.close()
    assert best_step in checkpoint_store.CheckpointStore(root).committed_steps()
    assert again.checkpointer.best_status() == best


def test_without_keep_best_retention_is_keep_last_alone(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "checkpoints"
    loop = Loop(root, keep_last=2)
    for step in (10, 20, 30):
        loop.train(step - loop.train_state.step)
        loop.save(evaluation={"accuracy": 1.0 if step == 10 else 0.0})
    loop.checkpointer.close()
    assert checkpoint_store.CheckpointStore(root).committed_steps() == [30, 20]
    assert loop.checkpointer.best_status() is None
