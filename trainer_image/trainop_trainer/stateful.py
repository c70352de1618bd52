"""The parts a checkpoint is made of: each one a ``Stateful`` (``state_dict`` / ``load_state_dict``).

The ``Checkpointer`` holds a registry of named parts and hands them to torch.distributed.checkpoint, which
calls ``state_dict()`` when saving and loads into the same structure when resuming. A part's state is
saved under its name; what a part contains is the part's business:

- ``model`` (``ModelState``): ``get_model_state_dict`` — canonical parameter names whatever wraps the model
  (DDP, FSDP2, torch.compile); FSDP2 shards stay sharded (DTensor), so each rank writes its own shard and a
  load reshards to any world size.
- ``optimizer`` (``OptimizerState``): ``get_optimizer_state_dict`` — keyed by parameter name, sharded like
  the parameters.
- ``lr_schedule`` (``LRSchedulerState``): the scheduler's counters; the schedule itself is rebuilt from the
  spec (``maxSteps`` may change between attempts).
- ``grad_scaler`` (``GradScalerState``): fp16 loss scale and growth tracker (empty when disabled).
- ``train_state`` (``TrainState``): the optimizer step.
- ``sampler`` (``DataPosition``): the epoch, the batches consumed in it and their size — where the sampler
  resumes (the sampler itself is a pure function of seed, epoch and position), converted when the world
  size or ``batchSizePerWorker`` changed between attempts.
- ``rng`` (``RNGState``): per rank, saved as ``rng_rank<r>``: torch, CUDA, numpy, python.
- ``user`` (``UserState``): a user entrypoint's state, as rank 0 passed it.

Two flags tell the ``Checkpointer`` how to treat a part: ``per_rank`` (each rank saves and loads its own copy;
a rank beyond the saved world size keeps its fresh state) and ``template_free`` (the part cannot say what
it will receive, so it is loaded from the checkpoint's own metadata).

Parts never touch files: ``checkpointer`` and ``checkpoint_legacy`` do.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import random
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn
from torch.distributed.checkpoint import state_dict as dcp_state_dict

log = logging.getLogger(__name__)

MODEL = "model"
OPTIMIZER = "optimizer"
LR_SCHEDULE = "lr_schedule"
GRAD_SCALER = "grad_scaler"
TRAIN_STATE = "train_state"
SAMPLER = "sampler"
RNG = "rng"
USER = "user"


class Part(Protocol):
    """torch.distributed.checkpoint's ``Stateful``."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class ModelState:
    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return dcp_state_dict.get_model_state_dict(self.model)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        dcp_state_dict.set_model_state_dict(self.model, state_dict)

    def load_full_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A full (unsharded) state dict held by every rank; sharded models take their own shards."""
        options = dcp_state_dict.StateDictOptions(full_state_dict=True)
        dcp_state_dict.set_model_state_dict(self.model, state_dict, options=options)


class OptimizerState:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        return dcp_state_dict.get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        dcp_state_dict.set_optimizer_state_dict(self.model, self.optimizer, state_dict)

    def load_numbered_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """``optimizer.state_dict()`` of an unsharded run, its parameters numbered in
        ``model.parameters()`` order (one parameter group): renamed to parameter names, then loaded as a
        full state dict (sharded optimizers take their own shards)."""
        names = [name for name, param in self.model.named_parameters() if param.requires_grad]
        groups = []
        for group in state_dict["param_groups"]:
            groups.append({**group, "params": [names[index] for index in group["params"]]})
        full: dict[str, Any] = {
            "state": {names[int(k)]: v for k, v in state_dict["state"].items()},
            "param_groups": groups,
        }
        options = dcp_state_dict.StateDictOptions(full_state_dict=True)
        dcp_state_dict.set_optimizer_state_dict(self.model, self.optimizer, full, options=options)


class LRSchedulerState:
    """A ``LambdaLR``'s counters, without its lambdas (rebuilt from the spec)."""

    def __init__(self, scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
        self.scheduler = scheduler

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.scheduler.state_dict().items() if k != "lr_lambdas"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        lambdas = [None] * len(self.scheduler.lr_lambdas)
        self.scheduler.load_state_dict({**state_dict, "lr_lambdas": lambdas})


class GradScalerState:
    def __init__(self, scaler: torch.amp.GradScaler) -> None:
        self.scaler = scaler

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict and self.scaler.is_enabled():
            self.scaler.load_state_dict(state_dict)


@dataclasses.dataclass
class TrainState:
    step: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step = int(state_dict["step"])


@dataclasses.dataclass
class DataPosition:
    """Where the loop is in the data: the epoch and the micro-batches this rank consumed in it, of
    ``batch_size`` samples each (0: not known, the caller's own batches).

    Loaded from the checkpoint's own metadata (``template_free``): checkpoints saved before ``batch_size``
    was saved have no such key, and a template naming it would refuse them."""

    template_free = True

    world_size: int
    epoch: int = 0
    batches_in_epoch: int = 0
    batch_size: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "batches_in_epoch": self.batches_in_epoch,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch = int(state_dict["epoch"])
        batches = int(state_dict["batches_in_epoch"])
        saved_world = int(state_dict.get("world_size", self.world_size))
        # Not known (0, or a checkpoint saved before the batch size was): taken to be unchanged.
        batch = self.batch_size or int(state_dict.get("batch_size") or 0) or 1
        saved_batch = int(state_dict.get("batch_size") or 0) or batch
        if saved_world != self.world_size:
            log.warning(
                "world size changed %d -> %d: the data order resumes at the same global position, "
                "re-split over the new ranks (not the exact order of an uninterrupted run)",
                saved_world,
                self.world_size,
            )
        if saved_batch != batch:
            log.warning(
                "batchSizePerWorker changed %d -> %d: the data resumes after the same samples, in batches "
                "of the new size (rounded down to a whole batch)",
                saved_batch,
                batch,
            )
        # The same global position (samples consumed by all ranks), in batches of this run's size and
        # split over this run's ranks.
        self.batches_in_epoch = batches * saved_batch * saved_world // (batch * self.world_size)


def rng_state(device: torch.device) -> dict[str, Any]:
    np_state: tuple[Any, ...] = tuple(np.random.get_state(legacy=True))
    py_state = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "numpy": {
            "keys": torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "python": {"version": py_state[0], "state": list(py_state[1]), "gauss_next": py_state[2]},
    }


def set_rng_state(state: Mapping[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)
    n = state["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))


class RNGState:
    """This rank's random generators (torch, CUDA, numpy, python)."""

    per_rank = True

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def state_dict(self) -> dict[str, Any]:
        return rng_state(self.device)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_rng_state(state_dict, self.device)


_TENSOR_REF = "__trainop_tensor__"


class UserState:
    """What a user entrypoint passes to ``save_checkpoint``, as rank 0 passed it (the other ranks' copies of
    a DDP model are the same). Tensors go through DCP (staged off the device, written in the background);
    the structure around them — any nesting, integer keys of ``optimizer.state_dict()``, plain values — is
    pickled beside them, because DCP's own flattening turns every key into a string."""

    template_free = True

    def __init__(self, *, is_rank0: bool) -> None:
        self.is_rank0 = is_rank0
        self.pending: Mapping[str, Any] | None = None  # set before a save
        self.restored: dict[str, Any] | None = None  # set by a load

    def state_dict(self) -> dict[str, Any]:
        if not self.is_rank0 or self.pending is None:
            return {}
        tensors: dict[str, torch.Tensor] = {}
        tree = _strip_tensors(dict(self.pending), tensors)
        buffer = io.BytesIO()
        torch.save(tree, buffer)
        buffer.seek(0)
        return {"tree": buffer, "tensors": tensors}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        buffer = state_dict["tree"]
        buffer.seek(0)
        tree = torch.load(buffer, map_location="cpu", weights_only=True)
        restored = _put_tensors(tree, state_dict.get("tensors", {}))
        self.restored = dict(restored)


def _strip_tensors(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        key = str(len(tensors))
        tensors[key] = obj.detach()
        return {_TENSOR_REF: key}
    if isinstance(obj, dict):
        return {k: _strip_tensors(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_strip_tensors(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_strip_tensors(v, tensors) for v in obj)
    return obj


def _put_tensors(obj: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {_TENSOR_REF}:
            return tensors[obj[_TENSOR_REF]]
        return {k: _put_tensors(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_put_tensors(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_put_tensors(v, tensors) for v in obj)
    return obj
