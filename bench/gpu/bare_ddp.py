"""The hand-written DDP reference: what a careful engineer writes in 40 lines, and nothing else.

    torchrun --standalone --nproc-per-node N bench/gpu/bare_ddp.py --workloads resnet50,gpt-compile \
        --warmup 30 --steps 100 --out results.jsonl

Per workload, one after the other in the same processes: the model (torchvision ResNet-50, or the trainer's
own ``GPT`` class from ``trainop_trainer.workloads.models`` so the model is identical), synthetic data already
on the GPU (ResNet-50: two batches, alternated; GPT: a distinct batch of uniformly random tokens every step,
each rank its own, see ``BARE_GPT_TOKENS``), bf16 autocast, channels_last for the CNN, DDP with PyTorch's
defaults, ``torch.compile`` of the DDP module for ``-compile`` workloads, SGD (momentum 0.9, fused) or AdamW
(fused), ``zero_grad(set_to_none=True)``. No data loader, no metrics, no checkpoints, no LR schedule.

Throughput is ``steps`` steps timed between two device synchronisations after ``warmup`` steps (which
absorb compilation). Peak memory is ``torch.cuda.max_memory_allocated`` over the workload. Rank 0 prints
one ``BARE {json}`` line per workload and appends it to ``--out``.

``--data loader`` (ResNet-50 workloads): the images come as they do in a real script instead: a
``DataLoader`` (4 worker processes, pinned memory, whole uint8 batches built in the workers from a seeded
pool, as the trainer's synthetic images are), ``.to(device, non_blocking=True)`` and the normalisation to
bf16 channels_last on the training stream; no side-stream prefetch. The trainer's own input path (prefetch on
a copy stream, one fused normalisation kernel) is then measured against a loop that loads its data too.

Each timed step ends with a CUDA event on the training stream (no synchronisation; read after the timed
steps): ``window_rates`` gives the samples per second of each 10 timed steps, as the trainer's report windows
do, and ``step_device_ms`` the device's time for each timed step, so that a dip inside the run shows.
``BARE_DDP_STATS=start`` (issue #21): DDP times only its first 10 iterations for its runtime statistics, as
the trainer's DDP does (switch ``ddp_stats``); by default DDP's own sampling, which also times every 100th
and waits for the device in the forward after it.
``BARE_GPT_TOKENS`` (issue #21, 2026-11-30): ``stream`` (default) gives GPT a new batch every step (up to
1,024 distinct batches, made before the timed steps), as the trainer's synthetic token stream does, so the
loss stays at ln(vocabulary) ~ 10.8; ``repeat``: the two batches alternated, as before that date, which
GPT-small memorises (loss 2.6 after 320 steps) while its throughput falls ~2 % over a run (round 20 in
docs/benchmarks-gpu.md; under the power cap bare's matrix kernels, not its memory-bound ones, took longer
than the trainer's).
``BARE_DDP_BUCKET_VIEW=1``: DDP's ``gradient_as_bucket_view`` (the gradients are views into the all-reduce
buckets, no copy into them after the backward), as the trainer's DDP has by default (switch ``bucket_view``);
by default PyTorch's ``False``. With both variables bare DDP has the trainer's DDP settings.

``--no-compile`` runs ``-compile`` workloads eagerly under their own names (the suite's CPU smoke test).
NVLink multicast stays off (``NCCL_NVLS_ENABLE=0`` and its PyTorch/NVSHMEM counterparts are set here too).

``--no-ddp-at-1`` skips the DDP wrapper when the world size is 1 (what a single-GPU script would do), to
see what DDP's reducer and graph splitting cost on one GPU.

``--trace-steps N --trace-dir DIR`` (issue #21): after the timed steps of ``--trace-workload`` (default
``resnet50``), N more steps under ``torch.profiler`` (CPU and CUDA), each inside a ``bare.step#k`` range,
written like the trainer's window (``trainop_trainer.bench_hooks``): ``DIR/rank<r>.trace.json.gz`` and
``DIR/rank<r>.env.json``, for ``trace_summary.py``. ``--device-index I`` runs on ``cuda:I`` whatever the
local rank (the suite's compile warmer fills the Inductor cache for the second GPU that way).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import pathlib
import shutil
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

RESNET_BATCH = 256
IMAGE_SIZE = 224
GPT_BATCH = 16
GPT_SEQUENCE = 1024
GPT_SIZE = "gpt-small"
GPT_STREAM_BATCHES = 1024  # at most this many distinct GPT batches on the device (~270 MB), then they repeat


def make_tiny() -> None:
    """CPU smoke-test sizes (``--tiny``): the same code path on a laptop."""
    global RESNET_BATCH, IMAGE_SIZE, GPT_BATCH, GPT_SEQUENCE, GPT_SIZE
    RESNET_BATCH, IMAGE_SIZE, GPT_BATCH, GPT_SEQUENCE, GPT_SIZE = 2, 64, 2, 64, "gpt-tiny"


def build(
    name: str, device: torch.device, *, gpt_batches: int = 2, rank: int = 0
) -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]], Any, Any]:
    """The model, its batches (already on the device), loss and optimizer factory. ``gpt_batches``: how many
    distinct GPT batches (``rank`` seeds them, so that each rank has its own)."""
    torch.manual_seed(0)
    if name.startswith("resnet50"):
        import torchvision

        model = torchvision.models.resnet50(weights=None, num_classes=1000)
        model = model.to(device, memory_format=torch.channels_last)
        batches = [
            (
                torch.randn(RESNET_BATCH, 3, IMAGE_SIZE, IMAGE_SIZE, device=device).contiguous(
                    memory_format=torch.channels_last
                ),
                torch.randint(0, 1000, (RESNET_BATCH,), device=device),
            )
            for _ in range(2)
        ]

        def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(out, y)

        def make_optimizer(params: Any) -> torch.optim.Optimizer:
            return torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=device.type == "cuda" or None)

        return model, batches, loss_fn, make_optimizer
    from trainop_trainer.workloads import models

    gpt = models.gpt(GPT_SIZE, block_size=GPT_SEQUENCE, config={}).to(device)
    vocab = gpt.config.vocab_size
    generator = torch.Generator(device=device)
    generator.manual_seed(1 + rank)
    batches = []
    for _ in range(gpt_batches):
        window = torch.randint(0, vocab, (GPT_BATCH, GPT_SEQUENCE + 1), device=device, generator=generator)
        batches.append((window[:, :-1].contiguous(), window[:, 1:].contiguous()))

    def lm_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.view(-1, out.shape[-1]), y.reshape(-1))

    def make_adamw(params: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=6e-4, weight_decay=0.1, fused=device.type == "cuda" or None)

    return gpt, batches, lm_loss, make_adamw


class _ImageBatches(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Whole uint8 batches from a seeded pool (built in the loader's workers), like the trainer's synthetic
    images: the loader's work is the copy into shared memory, not image decoding."""

    def __init__(self, batch: int, size: int, pool: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.batch = batch
        self.pool = torch.randint(0, 256, (pool, 3, size, size), generator=g, dtype=torch.uint8)
        self.labels = torch.randint(0, 1000, (pool,), generator=g)

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.arange(index * self.batch, (index + 1) * self.batch) % len(self.pool)
        return self.pool[rows], self.labels[rows]


def loader_batches(device: torch.device) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    """``--data loader``: batch ``i`` from a DataLoader, copied and normalised on the training stream."""
    cuda = device.type == "cuda"
    loader = torch.utils.data.DataLoader(
        _ImageBatches(RESNET_BATCH, IMAGE_SIZE),
        batch_size=None,
        shuffle=False,
        num_workers=4,
        pin_memory=cuda,
        persistent_workers=True,
        prefetch_factor=4,
    )
    source = iter(loader)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = next(source)
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        x = ((images.float() - mean) / std).contiguous(memory_format=torch.channels_last)
        return x, labels

    return batch


def gpt_flops_per_token(model: nn.Module, sequence_length: int) -> tuple[int, float]:
    """(N, FLOPs per token) of one training step: 6 N + 12 L H Q T (PaLM appendix B; N without the
    position embedding; H Q = embedding width; T = sequence length; causal masking not discounted)."""
    cfg = model.config  # type: ignore[attr-defined]
    n = sum(p.numel() for p in model.parameters()) - model.position_embedding.weight.numel()  # type: ignore[union-attr]
    return int(n), 6.0 * n + 12.0 * cfg.num_layers * cfg.embed_dim * sequence_length


def run_one(
    name: str,
    *,
    device: torch.device,
    world_size: int,
    warmup: int,
    steps: int,
    no_ddp_at_1: bool,
    compile_: bool = True,
    trace_steps: int = 0,
    trace_dir: pathlib.Path | None = None,
    data: str = "device",
) -> dict[str, Any]:
    tokens = os.environ.get("BARE_GPT_TOKENS", "stream")
    if tokens not in ("stream", "repeat"):
        raise SystemExit(f"bare_ddp: BARE_GPT_TOKENS={tokens!r}: use stream or repeat")
    gpt_batches = min(warmup + steps, GPT_STREAM_BATCHES) if tokens == "stream" else 2
    rank = dist.get_rank() if dist.is_initialized() else 0
    model, batches, loss_fn, make_optimizer = build(name, device, gpt_batches=gpt_batches, rank=rank)
    from_loader = data == "loader" and name.startswith("resnet50")
    next_batch = loader_batches(device) if from_loader else (lambda i: batches[i % len(batches)])
    use_ddp = not (no_ddp_at_1 and world_size == 1)
    wrapped: nn.Module = (
        DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            gradient_as_bucket_view=os.environ.get("BARE_DDP_BUCKET_VIEW", "0") == "1",
        )
        if use_ddp
        else model
    )
    ddp_stats = os.environ.get("BARE_DDP_STATS", "sampled")
    if use_ddp and ddp_stats == "start":
        wrapped._set_ddp_runtime_logging_sample_rate(2**31 - 1)  # type: ignore[operator]
    train_model: Callable[[torch.Tensor], torch.Tensor] = (
        torch.compile(wrapped) if compile_ and name.endswith("-compile") else wrapped  # type: ignore[assignment]
    )
    optimizer = make_optimizer(model.parameters())
    cuda = device.type == "cuda"
    dtype = torch.bfloat16

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    compile_start = time.perf_counter()
    loss = torch.zeros((), device=device)
    start = 0.0
    first_step_s = 0.0

    def step(i: int) -> torch.Tensor:
        inputs, targets = next_batch(i)
        with torch.profiler.record_function("bare.forward_backward"):
            with torch.autocast(device_type=device.type, dtype=dtype):
                loss = loss_fn(train_model(inputs), targets)
            loss.backward()
        with torch.profiler.record_function("bare.optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss

    events: list[Any] = []  # the timed steps' ends on the training stream (CUDA), read after them

    def mark() -> None:
        if cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            events.append(event)

    for i in range(warmup + steps):
        if i == 1:
            sync()
            first_step_s = time.perf_counter() - compile_start
        if i == warmup:
            sync()
            start = time.perf_counter()
            mark()
        loss = step(i)
        if i >= warmup:
            mark()
    sync()
    seconds = time.perf_counter() - start
    step_ms = [a.elapsed_time(b) for a, b in itertools.pairwise(events)]
    if trace_steps and trace_dir is not None:
        try:
            trace(step, first=warmup + steps, count=trace_steps, device=device, directory=trace_dir)
        except Exception as exc:  # the timed result stands; the next workloads still run
            print(f"bare_ddp: trace of {name} not written: {exc}", flush=True)
    batch = int(batches[0][0].shape[0])
    samples_per_second = steps * batch * world_size / seconds
    result: dict[str, Any] = {
        "impl": "bare",
        "data": "loader" if from_loader else "device",
        "workload": name,
        "world_size": world_size,
        "ddp": use_ddp,
        "compiled": compile_ and name.endswith("-compile"),
        "warmup": warmup,
        "steps": steps,
        "step_ms": 1e3 * seconds / steps,
        "samples_per_second": samples_per_second,
        "first_step_s": first_step_s,
        "ddp_stats": ddp_stats if use_ddp else None,
        "gpt_tokens": tokens if name.startswith("gpt") else None,
        "loss": float(loss.item()),
        "peak_allocated_gib": (torch.cuda.max_memory_allocated(device) / 2**30) if cuda else None,
    }
    if step_ms:
        per_window = [sum(step_ms[k : k + 10]) for k in range(0, len(step_ms) - 9, 10)]
        result["window_rates"] = [round(10 * batch * world_size / (ms / 1e3), 1) for ms in per_window]
        result["step_device_ms"] = [round(ms, 2) for ms in step_ms]
    if name.startswith("gpt"):
        result["tokens_per_second"] = samples_per_second * GPT_SEQUENCE
        result["sequence_length"] = GPT_SEQUENCE
        result["params"], result["flops_per_token"] = gpt_flops_per_token(model, GPT_SEQUENCE)
    return result  # the caller frees the model (release_memory) once this frame is gone


def release_memory(device: torch.device) -> None:
    """After a workload: compiled graphs and cached device memory go before the next one is built."""
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def trace(
    step: Callable[[int], torch.Tensor],
    *,
    first: int,
    count: int,
    device: torch.device,
    directory: pathlib.Path,
) -> None:
    """``count`` more steps under torch.profiler, written as the trainer's bench_hooks write theirs."""
    from trainop_trainer.bench_hooks import process_facts

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for i in range(first, first + count):
            with torch.profiler.record_function(f"bare.step#{i + 1}"):
                step(i)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    rank = dist.get_rank()
    directory.mkdir(parents=True, exist_ok=True)
    raw = directory / f"rank{rank}.trace.json"
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as src, gzip.open(f"{raw}.gz", "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    facts = process_facts(device)
    facts.update(rank=rank, world_size=dist.get_world_size(), traced_steps=count)
    (directory / f"rank{rank}.env.json").write_text(json.dumps(facts, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="resnet50,resnet50-compile,gpt-compile")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", default=None)
    parser.add_argument("--no-ddp-at-1", action="store_true")
    parser.add_argument("--cpu", action="store_true", help="gloo on CPU (a smoke test of this script)")
    parser.add_argument("--tiny", action="store_true", help="tiny batches and models (CPU smoke test)")
    parser.add_argument("--no-compile", action="store_true", help="run -compile workloads eagerly")
    parser.add_argument(
        "--trace-steps", type=int, default=0, help="profile this many steps after the timed ones"
    )
    parser.add_argument("--trace-dir", default=None, help="where the traces go (with --trace-steps)")
    parser.add_argument("--trace-workload", default="resnet50", help="the workload to profile")
    parser.add_argument("--device-index", type=int, default=None, help="use cuda:I, not cuda:LOCAL_RANK")
    parser.add_argument(
        "--data", choices=("device", "loader"), default="device", help="ResNet-50's images: see the docstring"
    )
    args = parser.parse_args()
    # NVLink multicast off, whoever started this (the device machines' GPUs are shared).
    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    if args.tiny:
        make_tiny()

    local_rank = int(os.environ.get("LOCAL_RANK", "0")) if args.device_index is None else args.device_index
    use_gpu = torch.cuda.is_available() and not args.cpu
    if use_gpu:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend="nccl" if use_gpu else "gloo", device_id=device if use_gpu else None)
    world_size = dist.get_world_size()
    rank = dist.get_rank()
    for name in args.workloads.split(","):
        result = run_one(
            name,
            device=device,
            world_size=world_size,
            warmup=args.warmup,
            steps=args.steps,
            no_ddp_at_1=args.no_ddp_at_1,
            compile_=not args.no_compile,
            trace_steps=args.trace_steps if name == args.trace_workload else 0,
            trace_dir=pathlib.Path(args.trace_dir) if args.trace_dir else None,
            data=args.data,
        )
        release_memory(device)
        if rank == 0:
            result["gpu"] = torch.cuda.get_device_name(device) if use_gpu else "cpu"
            line = json.dumps(result)
            print("BARE " + line, flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(line + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
