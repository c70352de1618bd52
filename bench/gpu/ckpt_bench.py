"""Checkpoint cost on GPUs: the trainer's own save path, background write against a synchronous one.

    torchrun --standalone --nproc-per-node N bench/gpu/ckpt_bench.py --config job.json --out results.jsonl

Builds the real ``Runtime`` and ``Trainer`` from a TrainerConfig (set its checkpoint interval out of
reach: this script decides when to save) and drives ``Trainer.train_step`` itself:

1. ``--warmup`` steps (compilation), then ``--base`` steps timed between device synchronisations: the
   step time without checkpoints.
2. For each mode, ``--repeats`` times: synchronise, ``save_checkpoint`` (``background``: DCP async save,
   staged into pinned memory on a side stream while the next step runs, written by every rank's
   background thread; ``sync``: the same with ``wait=True``), then ``--after`` training steps, then wait
   for the commit and synchronise. The cost of one checkpoint = that wall time - ``after`` x the base step
   time; the stall = the time until ``save_checkpoint`` returned plus the wait for the staging before the
   next optimizer step (the checkpointer's own ``on the training thread`` figure).

The overhead of checkpointing every ``I`` seconds is cost / I. Rank 0 prints ``CKPT {json}`` lines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from typing import Any

import torch
import torch.distributed as dist

from trainop.api import trainer_config
from trainop_trainer import config as config_module
from trainop_trainer import distributed, workloads
from trainop_trainer.logs import configure_logging
from trainop_trainer.runtime import Runtime
from trainop_trainer.trainer import Trainer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--base", type=int, default=60)
    parser.add_argument("--after", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--modes", default="background,sync")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    # NVLink multicast off, whoever started this (the device machines' GPUs are shared).
    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")

    config = trainer_config.load(args.config)
    use_gpu = torch.cuda.is_available() and config.spec.workers.gpus_per_worker > 0
    ctx = distributed.from_torchrun_env(use_gpu=use_gpu)
    configure_logging(rank=ctx.rank)
    launch = config_module.LaunchSettings(config_json=config_module.dumps(config), launch_id=uuid.uuid4().hex)
    runtime = Runtime.start(config=config, ctx=ctx, launch=launch, report_fn=None)
    trainer = Trainer(runtime=runtime, workload=workloads.build(config.spec))
    trainer.train_model.train()
    groups = trainer._epoch_batches()

    def sync() -> None:
        if use_gpu:
            torch.cuda.synchronize(ctx.device)
        dist.barrier()

    def steps(n: int) -> None:
        for _ in range(n):
            trainer.train_step(next(groups))
            trainer.step += 1
            trainer.batches_in_epoch += trainer.accum

    steps(args.warmup)
    sync()
    t0 = time.perf_counter()
    steps(args.base)
    sync()
    base_step = (time.perf_counter() - t0) / args.base
    checkpointer = runtime.checkpointer
    results: list[dict[str, Any]] = []
    for mode in args.modes.split(","):
        costs, stalls = [], []
        for _ in range(args.repeats):
            sync()
            t0 = time.perf_counter()
            trainer.save_checkpoint(wait=mode == "sync")
            issued = time.perf_counter() - t0
            t1 = time.perf_counter()
            steps(1)  # the first step waits for the staging before its optimizer step
            first_step = time.perf_counter() - t1
            stalls.append(issued + max(0.0, first_step - base_step))
            steps(args.after - 1)
            checkpointer.wait()
            sync()
            costs.append(time.perf_counter() - t0 - args.after * base_step)
        cost = statistics.median(costs)
        results.append(
            {
                "impl": "checkpoint",
                "mode": mode,
                "workload": config.spec.workload.model.value if config.spec.workload.model else "?",
                "compile": config.spec.compile,
                "world_size": ctx.world_size,
                "base_step_ms": base_step * 1e3,
                "stall_s": statistics.median(stalls),
                "cost_s": cost,
                "costs_s": costs,
                "stalls_s": stalls,
                "overhead_at_60s_pct": 100 * cost / 60.0,
                "overhead_at_600s_pct": 100 * cost / 600.0,
            }
        )
    runtime.close()
    if ctx.is_rank0:
        for result in results:
            print("CKPT " + json.dumps(result), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(result) + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
