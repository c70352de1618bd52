"""Read compatibility with format 1, the checkpoints trainop wrote before torch.distributed.checkpoint.

Kept for one release so that a job started on the previous trainer image resumes on this one; nothing
writes this format any more. A format-1 directory holds ``manifest.json`` (sha256 and size of every file)
and ``torch.save`` files written by rank 0 alone::

    model.pt        the unwrapped model's full state dict
    optimizer.pt    optimizer.state_dict() (parameters numbered in model.parameters() order)
    train_state.pt  {"scheduler", "scaler", "step", "epoch", "batches_in_epoch", "world_size"}
    rng.pt          [RNG state of rank 0, rank 1, ...]
    user_state.pt   (user entrypoints) what the function saved

``load_into`` hands each file to the registered part of the same meaning, in the shape the part's
``load_state_dict`` takes (model and optimizer as full state dicts, which the parts shard as their
parallelism needs). Delete this module, and the format-1 branch of ``checkpoint_store``, one release on.
"""

from __future__ import annotations

import hashlib
import logging
import pathlib
from collections.abc import Mapping
from typing import Any

import torch

from trainop_trainer import stateful
from trainop_trainer.checkpoint_store import CheckpointError, Manifest

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"
TRAIN_STATE_FILE = "train_state.pt"
RNG_FILE = "rng.pt"
USER_STATE_FILE = "user_state.pt"


def sha256_file(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify(path: pathlib.Path, manifest: Manifest) -> None:
    """Every file of the manifest is there with its size and sha256; ``CheckpointError`` otherwise."""
    for name, entry in manifest.files.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{name} is missing")
        size = file.stat().st_size
        if size != int(entry["bytes"]):
            raise CheckpointError(f"{name} has {size} bytes, the manifest says {entry['bytes']}")
        if sha256_file(file) != entry["sha256"]:
            raise CheckpointError(f"{name} does not match its sha256 checksum")


def _load(path: pathlib.Path, name: str) -> Any:
    return torch.load(path / name, map_location="cpu", weights_only=True)


def load_into(
    parts: Mapping[str, stateful.Part], path: pathlib.Path, manifest: Manifest, *, rank: int
) -> None:
    """Restore the registered parts from a format-1 directory (every rank reads the files itself)."""
    files = manifest.files
    train_state = _load(path, TRAIN_STATE_FILE) if TRAIN_STATE_FILE in files else {}
    for name, part in parts.items():
        if isinstance(part, stateful.ModelState) and MODEL_FILE in files:
            part.load_full_state_dict(_load(path, MODEL_FILE))
        elif isinstance(part, stateful.OptimizerState) and OPTIMIZER_FILE in files:
            part.load_numbered_state_dict(_load(path, OPTIMIZER_FILE))
        elif isinstance(part, stateful.LRSchedulerState) and "scheduler" in train_state:
            part.load_state_dict(train_state["scheduler"])
        elif isinstance(part, stateful.GradScalerState) and "scaler" in train_state:
            part.load_state_dict(train_state["scaler"])
        elif isinstance(part, stateful.TrainState) and "step" in train_state:
            part.load_state_dict({"step": train_state["step"]})
        elif isinstance(part, stateful.DataPosition) and "epoch" in train_state:
            part.load_state_dict(
                {
                    "epoch": train_state["epoch"],
                    "batches_in_epoch": train_state["batches_in_epoch"],
                    "world_size": train_state.get("world_size", manifest.world_size),
                }
            )
        elif isinstance(part, stateful.RNGState) and RNG_FILE in files:
            states = _load(path, RNG_FILE)
            if rank < len(states):
                part.load_state_dict(states[rank])
            else:
                log.warning("checkpoint has RNG states of %d ranks; rank %d is reseeded", len(states), rank)
        elif isinstance(part, stateful.UserState):
            part.restored = _load(path, USER_STATE_FILE) if USER_STATE_FILE in files else {}
        else:
            log.warning(
                "format-1 checkpoint %s has nothing for part %r; it keeps its current state", path, name
            )
