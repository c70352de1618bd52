"""Worker of ``test_trainer_resharding.py`` (run under torchrun): save FSDP2-sharded state on N ranks, load
it on M ranks through the trainer's ``Checkpointer`` and compare the full state with what was saved.

    torchrun --nproc-per-node N resharding_worker.py save DIR
    torchrun --nproc-per-node M resharding_worker.py load DIR [fsdp|ddp]
"""

from __future__ import annotations

import json
import pathlib
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import state_dict as dcp_state_dict
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from trainop_trainer import config as config_module
from trainop_trainer import distributed, run_record, stateful
from trainop_trainer.checkpointer import Checkpointer


def build(seed: int, layout: str) -> tuple[torch.nn.Module, torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    # Odd sizes: shards of 2 and 3 ranks cut the tensors at different rows (padding included).
    model = torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.ReLU(), torch.nn.Linear(13, 5))
    if layout == "fsdp":
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
        train_model: torch.nn.Module = model
    else:
        train_model = DistributedDataParallel(model)
    return model, train_model, torch.optim.AdamW(model.parameters(), lr=0.01)


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    options = dcp_state_dict.StateDictOptions(full_state_dict=True, cpu_offload=True)
    flat = {f"model.{k}": v for k, v in dcp_state_dict.get_model_state_dict(model, options=options).items()}
    optim = dcp_state_dict.get_optimizer_state_dict(model, optimizer, options=options)
    for name, values in optim.get("state", {}).items():  # full state: on rank 0 only
        for key, value in values.items():
            flat[f"optim.{name}.{key}"] = torch.as_tensor(value)
    return flat


def main() -> None:
    mode, directory = sys.argv[1], pathlib.Path(sys.argv[2])
    layout = sys.argv[3] if len(sys.argv) > 3 else "fsdp"
    ctx = distributed.from_torchrun_env(use_gpu=False)
    model, train_model, optimizer = build(seed=0 if mode == "save" else 123, layout=layout)
    train_state = stateful.TrainState()
    checkpointer = Checkpointer(
        root=directory / "checkpoints",
        ctx=ctx,
        keep_last=3,
        record=run_record.RunRecord(
            paths=config_module.RunPaths(run_dir=directory), launch_id=mode, is_rank0=ctx.is_rank0
        ),
    )
    checkpointer.register("model", stateful.ModelState(model))
    checkpointer.register("optimizer", stateful.OptimizerState(model, optimizer))
    checkpointer.register("train_state", train_state)
    if mode == "save":
        generator = torch.Generator().manual_seed(ctx.rank)
        for _ in range(3):
            train_model(torch.randn(4, 7, generator=generator)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            train_state.step += 1
        checkpointer.save(step=train_state.step, epoch=0, progress={}, metrics={}, wait=True)
        reference = full_state(model, optimizer)
        if ctx.is_rank0:
            torch.save(reference, directory / "reference.pt")
    else:
        restored = checkpointer.load()
        loaded = full_state(model, optimizer)
        if ctx.is_rank0:
            reference = torch.load(directory / "reference.pt", weights_only=True)
            result = {
                "step": None if restored is None else restored.step,
                "train_state_step": train_state.step,
                "saved_world_size": None if restored is None else restored.manifest.world_size,
                "keys_equal": sorted(reference) == sorted(loaded),
                "mismatched": sorted(
                    k for k in reference if k in loaded and not torch.equal(reference[k], loaded[k])
                ),
            }
            (directory / f"load-{ctx.world_size}-{layout}.json").write_text(json.dumps(result))
    checkpointer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
