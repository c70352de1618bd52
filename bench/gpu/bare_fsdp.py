"""The hand-written FSDP2 reference, the way PyTorch's FSDP2 tutorial writes it, and nothing else.

    torchrun --standalone --nproc-per-node N bench/gpu/bare_fsdp.py --model gpt-xl --batch 8 --sequence 2048 \
        [--compile] --warmup 20 --steps 50 --out results.jsonl

The model is the trainer's own ``GPT`` class (``trainop_trainer.workloads.models``: the model is identical),
built on the CPU from a fixed seed and moved to the GPU. Then, as in the tutorial ("Getting Started with
Fully Sharded Data Parallel (FSDP2)"): ``fully_shard`` on every transformer block and on the root with
``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``, PyTorch's defaults otherwise; with
``--compile`` each block is compiled in place first (``block.compile()``, torchtitan's order: compile, then
shard). AdamW (lr 6e-4, weight decay 0.1, fused), cross-entropy on the logits,
``zero_grad(set_to_none=True)``. Synthetic tokens already on the GPU (two batches, alternated). No data
loader, no LR schedule, no clipping, no metrics, no checkpoints.

Throughput: ``--steps`` steps timed between two device synchronisations after ``--warmup`` steps (they absorb
compilation). Peak memory: ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` over the run.
Rank 0 prints one ``BARE {json}`` line and appends it to ``--out``. NVLink multicast stays off.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def gpt_flops_per_token(model: torch.nn.Module, sequence_length: int) -> tuple[int, float]:
    """(N, FLOPs per token) of one training step: 6 N + 12 L H Q T (PaLM appendix B; N without the
    position embedding; H Q = embedding width; T = sequence length; causal masking not discounted)."""
    cfg = model.config  # type: ignore[attr-defined]
    n = sum(p.numel() for p in model.parameters()) - model.position_embedding.weight.numel()  # type: ignore[union-attr]
    return int(n), 6.0 * n + 12.0 * cfg.num_layers * cfg.embed_dim * sequence_length


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-xl")
    parser.add_argument("--batch", type=int, default=8, help="sequences per GPU per step")
    parser.add_argument("--sequence", type=int, default=2048)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--cpu", action="store_true", help="smoke test on CPU with gloo and fp32")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")

    from trainop_trainer.workloads import models

    use_gpu = not args.cpu
    dist.init_process_group("nccl" if use_gpu else "gloo", timeout=datetime.timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if use_gpu else torch.device("cpu")
    if use_gpu:
        torch.cuda.set_device(device)

    torch.manual_seed(0)
    model = models.gpt(args.model, block_size=args.sequence, config={}).to(device)
    flops_n, flops_per_token = gpt_flops_per_token(model, args.sequence)
    mp_policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if use_gpu else None
    )
    fsdp_kwargs = {"mp_policy": mp_policy} if mp_policy is not None else {}
    for block in model.blocks:
        if args.compile:
            block.compile()
        fully_shard(block, **fsdp_kwargs)
    fully_shard(model, **fsdp_kwargs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=use_gpu or None)

    vocab = model.config.vocab_size
    generator = torch.Generator(device=device).manual_seed(rank)
    windows = [
        torch.randint(0, vocab, (args.batch, args.sequence + 1), device=device, generator=generator)
        for _ in range(2)
    ]
    batches = [(w[:, :-1], w[:, 1:]) for w in windows]

    def sync() -> None:
        if use_gpu:
            torch.cuda.synchronize(device)

    if use_gpu:
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    first_step_s = 0.0
    timed_from = 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            sync()
            timed_from = time.perf_counter()
        inputs, targets = batches[step % 2]
        logits = model(inputs)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step == 0:
            sync()
            first_step_s = time.perf_counter() - started
    sync()
    seconds = time.perf_counter() - timed_from
    tokens_per_second = args.steps * args.batch * args.sequence * world / seconds
    result = {
        "impl": "bare-fsdp",
        "workload": f"{args.model}{'-compile' if args.compile else ''}",
        "model": args.model,
        "compiled": args.compile,
        "world_size": world,
        "batch_per_gpu": args.batch,
        "sequence_length": args.sequence,
        "steps": args.steps,
        "step_ms": 1e3 * seconds / args.steps,
        "first_step_s": first_step_s,
        "samples_per_second": args.steps * args.batch * world / seconds,
        "tokens_per_second": tokens_per_second,
        "params": flops_n,
        "flops_per_token": flops_per_token,
        "loss": float(loss.item()),
        "max_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30 if use_gpu else None,
        "max_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30 if use_gpu else None,
    }
    if rank == 0:
        print("BARE " + json.dumps(result), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(result) + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
