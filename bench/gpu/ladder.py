"""From bare DDP to the trainer's hot loop, one ingredient at a time: where the trainer's cost comes in (#21).

    torchrun --standalone --nproc-per-node N bench/gpu/ladder.py
        [--rungs bare,ddp,input,loader,control,report] [--warmup 15 --steps 40] [--cpu --tiny]

ResNet-50 eager (batch 256 at 224 px, bf16 autocast, channels_last, fused SGD with momentum, DDP), built
afresh for every rung in this one process group. Each rung adds one part of the trainer, made of the
trainer's own components, to the one before:

- ``bare``: ``bare_ddp.py``'s loop: two float32 batches already on the GPU, DDP with PyTorch's defaults.
- ``ddp``: DDP as ``parallelize.apply`` builds it (``gradient_as_bucket_view=True``).
- ``input``: uint8 batches in pinned host memory through the trainer's device path (``data.DeviceBatches``:
  the copy and ``workloads.ImageToDevice`` on a side stream, one batch ahead); no DataLoader.
- ``loader``: the trainer's DataLoader instead (``SyntheticImages``, ``ResumableDistributedSampler``,
  ``data.make_loader``: 4 worker processes, pinned memory).
- ``control``: + the control exchange after every step (``distributed.ControlChannel``, gloo).
- ``report``: + what the trainer does around it: the loss added on the device every step, the step-time
  histogram and the LR schedule's step every step, and every 10 steps a report (``ReportWindow.close``:
  a device sync; the loss averaged over ranks over gloo). This is the trainer's loop without Ray,
  checkpoints, status and the step schedule's clocks.

Variants that are not cumulative: ``loader-fresh`` (``loader`` with ``switches`` ``batch_memory=fresh``, a
new shared-memory segment per batch, the DataLoader's own way), ``input-lean`` (``input`` with
``switches`` ``input=lean``, the two-kernel normalisation that was the default before the one-kernel
``fused``), ``report-f32`` (``report`` with ``switches`` ``input=f32``, the image path before issue #21),
``report-ctl8`` (``control_every=8``), ``loader-w2`` and ``loader-w8`` (``loader`` with 2 or 8 workers),
``input-copy`` and ``loader-copy`` (``input`` and ``loader`` with ``switches`` ``normalise=copy``: the
normalisation on the copy stream behind the copy, the trainer before 2026-11-30; the default ``step`` runs it
on the training stream). Two diagnostic rungs split ``input``
in its halves, each on the copy stream beside the step, while the step trains on ``ddp``'s device batches:
``input-h2d`` (the uint8 batch's copy from pinned memory alone) and ``input-norm`` (the normalisation
kernel alone, of a uint8 batch already on the device). Two more train on ``ddp``'s device batches and only
set something up first: ``ddp-pinned`` pins a ring of uint8 batches in host memory (never copied),
``ddp-stream`` runs one small kernel on a second stream before the first step. A
rung may be named twice (``loader,loader-w8,loader``: an order effect shows as two ``loader`` lines). The
NCCL variables are the trainer's (``distributed.apply_network``, profile ``auto``), the process group is
set up as the trainer's launcher does it (``distributed.from_torchrun_env``): ``bare`` here against
``bare_ddp.py`` in the same call shows what those two change. ``--probe-first MB`` runs the trainer's start-up
all-reduce probe (``distributed.probe_allreduce``) before the first rung, as the trainer does before it builds
its model; ``--gc`` collects Python's garbage (an earlier rung's model in a cycle) before every rung.
Rank 0 prints one ``LADDER {json}`` line per
rung (ms per step, samples/s, the difference to the rung before, and every rank's host timing: its wait in
``next()`` for each batch and its lead over the GPU at each step's start, as quantiles in ms). Throughput:
``--steps`` steps between two device synchronisations after ``--warmup`` steps. ``--cpu --tiny`` runs the
same code with gloo on tiny images (a test of the script). ``--compile`` compiles every rung as the
trainer compiles a ``compile: true`` DDP job (``torch.compile`` of the DDP module, ``parallelize.apply``)
and as ``bare_ddp.py``'s ``-compile`` workloads do; each rung compiles afresh (Dynamo is reset between
rungs; Inductor's cache makes the later ones quicker)."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from trainop.api import trainingjob
from trainop_trainer import data, distributed, metrics, reporting, schedule, switches, workloads
from trainop_trainer.workloads import datasets, models

RUNGS = (
    "bare",
    "ddp",
    "input",
    "input-lean",
    "input-copy",
    "input-h2d",
    "input-norm",
    "ddp-pinned",
    "ddp-stream",
    "loader",
    "loader-copy",
    "loader-fresh",
    "loader-w2",
    "loader-w8",
    "control",
    "report",
    "report-f32",
    "report-ctl8",
)
FEATURES = {
    "bare": set(),
    "ddp": {"ddp"},
    "input": {"ddp", "input"},
    "input-lean": {"ddp", "input"},
    "input-copy": {"ddp", "input"},
    "input-h2d": {"ddp", "h2d"},
    "input-norm": {"ddp", "norm"},
    "ddp-pinned": {"ddp", "pinned"},
    "ddp-stream": {"ddp", "stream"},
    "loader": {"ddp", "loader"},
    "loader-copy": {"ddp", "loader"},
    "loader-fresh": {"ddp", "loader"},
    "loader-w2": {"ddp", "loader"},
    "loader-w8": {"ddp", "loader"},
    "control": {"ddp", "loader", "control"},
    "report": {"ddp", "loader", "control", "report"},
    "report-f32": {"ddp", "loader", "control", "report"},
    "report-ctl8": {"ddp", "loader", "control", "report"},
}
SWITCHES: dict[str, dict[str, str | int]] = {
    "input-lean": {"input": "lean"},
    "input-copy": {"normalise": "copy"},
    "loader-copy": {"normalise": "copy"},
    "loader-fresh": {"batch_memory": "fresh"},
    "report-f32": {"input": "f32"},
    "report-ctl8": {"control_every": 8},
}
# What each rung adds to: its "added_ms" is the difference to this one.
PARENT = {
    "ddp": "bare",
    "input": "ddp",
    "input-lean": "input",
    "input-copy": "input",
    "input-h2d": "ddp",
    "input-norm": "ddp",
    "ddp-pinned": "ddp",
    "ddp-stream": "ddp",
    "loader-copy": "loader",
    "loader": "ddp",
    "loader-fresh": "loader",
    "loader-w2": "loader",
    "loader-w8": "loader",
    "control": "loader",
    "report": "control",
    "report-f32": "report",
    "report-ctl8": "report",
}
BATCH, IMAGE, WORKERS, REPORT_EVERY = 256, 224, 4, 10
# Rungs with another number of loader workers than WORKERS (the trainer's default for image jobs).
WORKERS_OF = {"loader-w2": 2, "loader-w8": 8}


def batches_on_device(device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``bare_ddp.py``'s data: two float32 channels_last batches already on the device, alternated."""
    pair = [
        (
            torch.randn(BATCH, 3, IMAGE, IMAGE, device=device).contiguous(memory_format=torch.channels_last),
            torch.randint(0, 1000, (BATCH,), device=device),
        )
        for _ in range(2)
    ]
    i = 0
    while True:
        yield pair[i % 2]
        i += 1


def beside_the_step(
    device: torch.device, to_device: workloads.ImageToDevice, half: str
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``batches_on_device``, and with each batch one half of the input path on a copy stream, its result
    unused: ``h2d`` the copy of a pinned uint8 batch, ``norm`` the normalisation of a uint8 batch on the
    device (the diagnostic rungs ``input-h2d`` and ``input-norm``)."""
    stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
    host = torch.randint(0, 256, (BATCH, 3, IMAGE, IMAGE), dtype=torch.uint8).pin_memory()
    labels = torch.randint(0, 1000, (BATCH,)).pin_memory()
    on_device = to_device.transfer((host, labels), device)
    torch.cuda.synchronize(device)
    for batch in batches_on_device(device):
        with torch.cuda.stream(stream):
            if half == "h2d":
                to_device.transfer((host, labels), device)
            else:
                to_device.finish(on_device, device)
        yield batch


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}

    def at(q: float) -> float:
        return round(1e3 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"min": at(0.0), "p10": at(0.1), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": at(1.0)}


def host_timing(waits: list[float], marks: list[tuple[float, Any]]) -> dict[str, Any]:
    """This rank's host side of the timed steps, in ms: the wait in ``next()`` for each batch, and the host's
    lead at each step's start — how long after the host recorded an event at the step's start the GPU
    reached it (the first timed step starts after a synchronisation, lead 0 by construction). A lead near 0
    means the GPU was waiting for the host there."""
    result: dict[str, Any] = {"data_wait_ms": _quantiles(waits)}
    if marks:
        host0, event0 = marks[0]
        leads = [event0.elapsed_time(event) / 1e3 - (host - host0) for host, event in marks[1:]]
        result["lead_ms"] = _quantiles(leads)
        result["steps_lead_under_1ms"] = sum(1 for lead in leads if lead < 1e-3)
    return result


def run_rung(
    name: str, *, ctx: distributed.WorkerContext, warmup: int, steps: int, compile_: bool = False
) -> dict[str, Any]:
    features = FEATURES[name]
    device, cuda = ctx.device, ctx.device.type == "cuda"
    switches.reset()
    switches.apply(dict(SWITCHES.get(name, {})))
    torch.manual_seed(0)
    model = models.resnet("resnet50", num_classes=1000).to(device)
    model.to(memory_format=torch.channels_last)
    ddp_kwargs: dict[str, Any] = {"device_ids": [device.index]} if cuda else {}
    if "ddp" in features:
        ddp_kwargs["gradient_as_bucket_view"] = True
    train_model: Any = DistributedDataParallel(model, **ddp_kwargs)
    if compile_:
        train_model = torch.compile(train_model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=cuda or None)
    total = warmup + steps
    to_device = workloads.ImageToDevice(channels_last=True, dtype=torch.bfloat16)
    loader: Any = None
    held: list[torch.Tensor] = []  # ddp-pinned's ring, kept for the rung
    source: Iterator[tuple[torch.Tensor, torch.Tensor]]
    if "loader" in features:
        dataset = datasets.SyntheticImages(
            num_samples=BATCH * ctx.world_size * (total + 4), image_size=IMAGE, num_classes=1000, seed=0
        )
        sampler = data.ResumableDistributedSampler(
            dataset, num_replicas=ctx.world_size, rank=ctx.rank, seed=0
        )
        loader = data.make_loader(
            dataset,
            sampler,
            batch_size=BATCH,
            num_workers=WORKERS_OF.get(name, WORKERS) if cuda and WORKERS else 0,
            pin_memory=cuda,
        )
        source = iter(data.DeviceBatches(loader, device=device, to_device=to_device))
    elif "input" in features:
        ring = [
            (
                torch.randint(0, 256, (BATCH, 3, IMAGE, IMAGE), dtype=torch.uint8),
                torch.randint(0, 1000, (BATCH,)),
            )
            for _ in range(4)
        ]
        if cuda:
            ring = [(x.pin_memory(), y.pin_memory()) for x, y in ring]
        cpu_batches: Any = [ring[i % len(ring)] for i in range(total + 2)]
        source = iter(data.DeviceBatches(cpu_batches, device=device, to_device=to_device))
    elif "pinned" in features and cuda:
        held = [torch.empty(BATCH, 3, IMAGE, IMAGE, dtype=torch.uint8).pin_memory() for _ in range(4)]
        source = batches_on_device(device)
    elif "stream" in features and cuda:
        side = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
        with torch.cuda.stream(side):
            torch.ones(1024, device=device).add_(1)
        torch.cuda.synchronize(device)
        source = batches_on_device(device)
    elif features & {"h2d", "norm"} and cuda:
        source = beside_the_step(device, to_device, "h2d" if "h2d" in features else "norm")
    else:
        source = batches_on_device(device)
    control = distributed.ControlChannel(ctx) if "control" in features else None
    window = (
        reporting.ReportWindow(world_size=ctx.world_size, device=device) if "report" in features else None
    )
    step_metric = metrics.WorkerMetrics(job="ladder", rank=ctx.rank).step_seconds
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        schedule.LearningRateSchedule(kind="cosine", total_steps=total, warmup_steps=5, min_lr_ratio=0.0),
    )

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def autocast() -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    last = began = time.perf_counter()
    start = 0.0
    waits: list[float] = []  # seconds in next(source), each timed step
    marks: list[tuple[float, Any]] = []  # (host time, CUDA event) at each timed step's start
    for step in range(1, total + 1):
        if step == warmup + 1:
            sync()
            start = time.perf_counter()
        timed = step > warmup
        if timed and cuda:
            marks.append((time.perf_counter(), reporting._timing_event()))
        before = time.perf_counter()
        inputs, targets = next(source)
        if timed:
            waits.append(time.perf_counter() - before)
        with autocast():
            loss = F.cross_entropy(train_model(inputs), targets)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if window is not None:
            window.add_loss(loss.detach())
            window.add_samples(BATCH)
            scheduler.step()
            now = time.perf_counter()
            step_metric.observe(now - last)
            last = now
        if control is not None and step % switches.control_every() == 0:
            control.exchange(stop=False, preempt=False, checkpoint=False, report=False, ray_report=False)
        if window is not None and control is not None and step % REPORT_EVERY == 0:
            stats = window.close(step=step, total_steps=total)
            if stats.local_loss is not None:
                control.all_reduce_mean(stats.local_loss)
    sync()
    seconds = time.perf_counter() - start
    host = host_timing(waits, marks)
    describe = switches.describe()
    if control is not None:
        control.drain()
    del source, loader, held
    switches.reset()
    return {
        "rung": name,
        "world_size": ctx.world_size,
        "steps": steps,
        "step_ms": 1e3 * seconds / steps,
        "samples_per_second": BATCH * ctx.world_size * steps / seconds,
        "switches": describe,
        "host": host,
        "compiled": compile_,
        "warmup_s": start - began,  # the warm-up steps, the compile included
    }


def main() -> int:
    global BATCH, IMAGE, WORKERS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rungs", default="bare,ddp,input,input-lean,loader,control,report,report-f32")
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--cpu", action="store_true", help="gloo on the CPU (a test of this script)")
    parser.add_argument(
        "--probe-first",
        type=int,
        default=0,
        metavar="MB",
        help="before the first rung, the trainer's start-up all-reduce probe of MB MiB (0: none)",
    )
    parser.add_argument("--gc", action="store_true", help="a full garbage collection before every rung")
    parser.add_argument("--tiny", action="store_true", help="batch 4 of 32 px images, no loader workers")
    parser.add_argument("--compile", action="store_true", help="torch.compile of the DDP module, every rung")
    parser.add_argument("--out", default=None, help="append each rung's line to this results.jsonl")
    args = parser.parse_args()
    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    if args.tiny:
        BATCH, IMAGE, WORKERS = 4, 32, 0
    rungs = [r.strip() for r in args.rungs.split(",") if r.strip()]
    unknown = [r for r in rungs if r not in FEATURES]
    if unknown:
        parser.error(f"--rungs: unknown {unknown}; choose from {', '.join(RUNGS)}")
    use_gpu = torch.cuda.is_available() and not args.cpu
    distributed.apply_network(trainingjob.Network(profile="auto"), multi_node=False)
    ctx = distributed.from_torchrun_env(use_gpu=use_gpu)
    done: dict[str, float] = {}
    if args.probe_first:
        probe = distributed.probe_allreduce(ctx, megabytes=args.probe_first)
        if ctx.rank == 0:
            print(f"probe of {args.probe_first} MiB: {probe.bus_bandwidth_gb_per_second} GB/s", flush=True)
    for name in rungs:
        if args.gc:
            gc.collect()
        result = run_rung(name, ctx=ctx, warmup=args.warmup, steps=args.steps, compile_=args.compile)
        result["impl"] = "ladder"
        result["gpu"] = torch.cuda.get_device_name(ctx.device) if use_gpu else "cpu"
        # Every rank's host timing (rank 0 prints them): a slow rank holds every all-reduce.
        ranks: list[Any] = [None] * ctx.world_size
        torch.distributed.all_gather_object(ranks, result.pop("host"))
        result["host_by_rank"] = ranks
        parent = PARENT.get(name)
        if parent in done:
            result["added_to"] = parent
            result["added_ms"] = result["step_ms"] - done[parent]
        done[name] = result["step_ms"]
        if ctx.rank == 0:
            line = json.dumps(result)
            print("LADDER " + line, flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(line + "\n")
        if args.compile:
            torch._dynamo.reset()
        if use_gpu:
            torch.cuda.empty_cache()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
