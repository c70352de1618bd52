"""Standalone NCCL all-reduce bandwidth, next to the trainer's own probe, in the same processes.

    torchrun --standalone --nproc-per-node N bench/gpu/allreduce.py --out results.jsonl

For each size (float32 tensors of 16 MiB, 256 MiB and 1 GiB): 5 warm-up and 20 timed ``all_reduce`` calls
between CUDA events, slowest rank's mean time; bus bandwidth = bytes / t x 2(n-1)/n in GB/s, as nccl-tests
reports it. Then ``trainop_trainer.distributed.probe_allreduce`` (what every trainer worker runs at start-up:
2 warm-up + 5 timed calls, host clock) at 256 MiB and 1 GiB, so the probe can be compared with a careful
measurement on the same machine at the same moment. Rank 0 prints ``ALLREDUCE {json}`` lines.

``--profile auto`` (the suite's choice) first resolves trainop's network profile on this node the way the
trainer does at start-up (``trainop_trainer.nccl``: one node with NVLink -> ``nvlink``) and exports its
NCCL variables, so the numbers are those of the profile the operator's ``auto`` gets; ``--profile none``
leaves NCCL's defaults. NVLink multicast stays off either way (``NCCL_NVLS_ENABLE=0`` is set here too).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist


def measure(numel: int, device: torch.device, *, warmup: int, iters: int) -> float:
    tensor = torch.ones(numel, dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(tensor)
    torch.cuda.synchronize(device)
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        dist.all_reduce(tensor)
    end.record()
    torch.cuda.synchronize(device)
    seconds = torch.tensor([start.elapsed_time(end) / 1e3 / iters], dtype=torch.float64, device=device)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return float(seconds.item())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--sizes-mib", default="16,256,1024")
    parser.add_argument(
        "--profile", default="none", help="trainop network profile (auto, nvlink, ...) or none"
    )
    args = parser.parse_args()
    # NVLink multicast off, whoever started this (the device machines' GPUs are shared).
    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    profile: dict[str, object] = {"profile": "none"}
    if args.profile != "none":
        from trainop_trainer import nccl

        multi_node = int(os.environ.get("WORLD_SIZE", "1")) > int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        facts = nccl.detect_node_facts(multi_node=multi_node) if args.profile == "auto" else None
        plan = nccl.plan(args.profile, {}, facts)
        for key, value in plan.env.items():
            os.environ.setdefault(key, value)  # as the trainer does: what is already set wins
        profile = {
            "profile": plan.resolved,
            "profile_reason": plan.reason,
            "nccl_env": {key: os.environ[key] for key in sorted(plan.env)},
        }
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl", device_id=device)
    n = dist.get_world_size()
    lines = []
    for mib in (int(s) for s in args.sizes_mib.split(",")):
        nbytes = mib << 20
        seconds = measure(nbytes // 4, device, warmup=5, iters=20)
        lines.append(
            {
                "kind": "standalone",
                "mib": mib,
                "world_size": n,
                "ms": seconds * 1e3,
                "busbw_gbps": nbytes / seconds * 2 * (n - 1) / n / 1e9,
                **profile,
            }
        )
    from trainop_trainer import distributed

    ctx = distributed.WorkerContext(
        rank=dist.get_rank(),
        world_size=n,
        local_rank=local_rank,
        local_world_size=n,
        node_rank=0,
        device=device,
        backend="nccl",
    )
    for mib in (256, 1024):
        result = distributed.probe_allreduce(ctx, megabytes=mib)
        # ``bus_bandwidth_gb_per_second``, formerly ``bus_bandwidth_gbps`` (GB/s both): read either.
        bus = getattr(result, "bus_bandwidth_gb_per_second", getattr(result, "bus_bandwidth_gbps", None))
        lines.append(
            {
                "kind": "trainer_probe_fn",
                "mib": mib,
                "world_size": n,
                "ms": result.seconds_per_op * 1e3,
                "busbw_gbps": bus,
                **profile,
            }
        )
    if dist.get_rank() == 0:
        for line in lines:
            print("ALLREDUCE " + json.dumps(line), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps({"impl": "allreduce", **line}) + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
