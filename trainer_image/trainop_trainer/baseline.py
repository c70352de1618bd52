"""``python -m trainop_trainer.baseline``: a bare DDP loop of a config's workload, for speed comparisons.

    torchrun --standalone --nproc-per-node 8 -m trainop_trainer.baseline --config job.json --steps 200

The same model, data pipeline (loader + device prefetch), optimizer, precision and channels_last as the
Trainer, and nothing else: no control exchange, no metrics, no reports, no checkpoints. Prints one JSON line
on rank 0 with the steady-state throughput (steps after ``--warmup``, timed between two device
synchronisations). Compare with ``python -m trainop_trainer.launch`` on the same config, whose status
records carry ``samplesPerSecond`` per report window.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from trainop.api import trainer_config, trainingjob
from trainop_trainer import data, distributed, parallelize, trainer, workloads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainop_trainer.baseline", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--config", help="TrainerConfig JSON (default: $TRAINOP_CONFIG)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=30)
    args = parser.parse_args(argv)

    config = trainer_config.load(args.config)
    spec = config.spec
    hp = spec.hyperparameters
    if hp.batch_size_per_worker == "auto":
        parser.error("hyperparameters.batchSizePerWorker: the baseline needs an integer batch, not auto")
    batch_size = int(hp.batch_size_per_worker)
    use_gpu = spec.workers.gpus_per_worker > 0 and torch.cuda.is_available()
    ctx = distributed.from_torchrun_env(use_gpu=use_gpu)
    torch.manual_seed(hp.seed)
    workload = workloads.build(spec)
    model = workload.model.to(ctx.device)
    if workload.channels_last:
        model = model.to(memory_format=torch.channels_last)
    ddp = DistributedDataParallel(
        model, device_ids=[ctx.device.index] if use_gpu else None, gradient_as_bucket_view=True
    )
    parallelize.use_compile_wrapper(spec)
    train_model: Any = torch.compile(ddp) if spec.compile else ddp
    optimizer = trainer.build_optimizer(model, hp, ctx.device)
    sampler = data.ResumableDistributedSampler(
        workload.dataset, num_replicas=ctx.world_size, rank=ctx.rank, seed=hp.seed
    )
    loader = data.make_loader(
        workload.dataset,
        sampler,
        batch_size=batch_size,
        num_workers=spec.workload.dataset.num_workers,
        pin_memory=use_gpu,
    )
    batches = data.DeviceBatches(loader, device=ctx.device, to_device=workload.to_device)
    dtype = {trainingjob.Precision.BF16: torch.bfloat16, trainingjob.Precision.FP16: torch.float16}.get(
        spec.precision
    )
    scaler = torch.amp.GradScaler(ctx.device.type, enabled=spec.precision == trainingjob.Precision.FP16)

    def autocast() -> contextlib.AbstractContextManager[Any]:
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=ctx.device.type, dtype=dtype)

    def sync() -> None:
        if use_gpu:
            torch.cuda.synchronize(ctx.device)

    done, epoch, start = 0, 0, 0.0
    total = args.warmup + args.steps
    while done < total:
        sampler.set_epoch(epoch)
        for inputs, targets in batches:
            if done == args.warmup:
                sync()
                start = time.perf_counter()
            with autocast():
                loss = workload.loss_fn(train_model(inputs), targets)
            scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            done += 1
            if done == total:
                break
        epoch += 1
    sync()
    seconds = time.perf_counter() - start
    samples = args.steps * batch_size * ctx.world_size
    if ctx.rank == 0:
        result = {
            "workload": workload.name,
            "world_size": ctx.world_size,
            "steps": args.steps,
            "step_ms": 1e3 * seconds / args.steps,
            "samples_per_second": samples / seconds,
            "loss": float(loss.item()),
        }
        print("BASELINE " + json.dumps(result), flush=True)
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
