"""Process-group facts, network set-up, the bandwidth probe, and the control channel between ranks.

- ``WorkerContext``: rank, world size, device and backend of this process, whoever launched it (Ray Train
  or torchrun). ``from_torchrun_env`` initialises the process group itself; under Ray Train, TorchTrainer
  already did and ``from_ray`` only reads the context.
- ``apply_network``: resolves ``spec.network`` with ``nccl.plan`` on this node and exports the variables
  before the first NCCL collective (PyTorch creates NCCL communicators lazily, so the process group that
  Ray Train initialised has not read them yet). Variables already in the environment (pod env from the
  operator, Ray ``runtime_env``) are kept; the user's ``ncclEnv`` always wins.
- ``probe_allreduce``: a short all-reduce benchmark after start-up; bus bandwidth = algbw * 2(n-1)/n in
  GB/s (bytes, as nccl-tests reports it).
- ``ControlChannel``: how ranks agree on decisions that are not a function of the step count (rank 0's
  clocks for time-based checkpoints and reports; a SIGTERM or stop request seen by any rank). It is one
  tiny MAX all-reduce per step over a dedicated gloo group, issued asynchronously and read one step later,
  so it overlaps a whole step and never waits on the GPU.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import socket
import time
from typing import Any

import torch
import torch.distributed as dist

from trainop.api import trainingjob
from trainop_trainer import nccl

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class WorkerContext:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    device: torch.device
    backend: str

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    @property
    def multi_node(self) -> bool:
        return self.world_size > self.local_world_size


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def from_ray() -> WorkerContext:
    """The context of a Ray Train worker (TorchTrainer has initialised the process group)."""
    import ray.train
    import ray.train.torch

    ctx = ray.train.get_context()
    device = ray.train.torch.get_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return WorkerContext(
        rank=ctx.get_world_rank(),
        world_size=ctx.get_world_size(),
        local_rank=ctx.get_local_rank(),
        local_world_size=ctx.get_local_world_size(),
        node_rank=ctx.get_node_rank(),
        device=device,
        backend=dist.get_backend() if dist.is_initialized() else "none",
    )


def from_torchrun_env(*, use_gpu: bool, timeout_s: float = 1800.0) -> WorkerContext:
    """Initialise the process group from torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*)."""
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        # Not under torchrun: a single process, any free port will do.
        os.environ["MASTER_PORT"] = str(free_port())
    if use_gpu:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    return WorkerContext(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        node_rank=int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0"))),
        device=device,
        backend=backend,
    )


def apply_network(network: trainingjob.Network, *, multi_node: bool) -> nccl.NcclPlan:
    """Resolve the profile on this node and export its variables (see the module docstring)."""
    facts = nccl.detect_node_facts(multi_node=multi_node) if network.profile == "auto" else None
    plan = nccl.plan(network.profile.value, network.nccl_env, facts)
    for key, value in plan.env.items():
        if key in network.nccl_env:
            os.environ[key] = value
        else:
            os.environ.setdefault(key, value)
    log.info(
        "network profile %s -> %s (%s); env %s",
        plan.requested,
        plan.resolved,
        plan.reason,
        " ".join(f"{k}={os.environ[k]}" for k in sorted(plan.env)) or "(NCCL defaults)",
    )
    return plan


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    bus_bandwidth_gb_per_second: float | None  # GB/s (1e9 bytes/s); None with one worker (nothing to measure)
    probe_bytes: int
    world_size: int
    seconds_per_op: float


def probe_allreduce(ctx: WorkerContext, *, megabytes: int, iterations: int = 5) -> ProbeResult:
    """Time an all-reduce of ``megabytes`` MiB of float32 over the main process group."""
    if ctx.device.type != "cuda" and megabytes > 16:
        # gloo on CPU moves a few hundred MB/s on a small machine: 16 MiB tells as much in far less time.
        megabytes = 16
    numel = megabytes * (1 << 20) // 4
    nbytes = numel * 4
    if ctx.world_size < 2 or not dist.is_initialized():
        return ProbeResult(None, nbytes, ctx.world_size, 0.0)
    tensor = torch.ones(numel, dtype=torch.float32, device=ctx.device)

    def sync() -> None:
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)

    for _ in range(2):
        dist.all_reduce(tensor)
    sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(tensor)
    sync()
    seconds = (time.perf_counter() - start) / iterations
    # Every rank measured its own time; the slowest rank defines the collective's speed.
    slowest = torch.tensor([seconds], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    seconds = float(slowest.item())
    n = ctx.world_size
    bus = nbytes / seconds * 2 * (n - 1) / n / 1e9
    del tensor
    return ProbeResult(bus, nbytes, n, seconds)


@dataclasses.dataclass(frozen=True)
class Agreed:
    """Flags every rank sees at the same step (logical OR over ranks)."""

    stop: bool = False  # a stop request (the driver got SIGTERM)
    preempt: bool = False  # some worker process got SIGTERM
    checkpoint: bool = False  # rank 0's checkpoint clock ran out
    report: bool = False  # rank 0's report clock ran out
    ray_report: bool = False  # rank 0's clock for ray.train.report ran out
    profile_steps: int = 0  # a profile window of this many steps was asked for (rank 0's request watcher)
    communication_report: bool = False  # a communication report was asked for


class ControlChannel:
    """Agreement between ranks with one step of lag: ``exchange`` posts this step's flags and returns the
    agreement of the flags posted at the previous call."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self._group: Any = None
        if ctx.world_size > 1:
            # A dedicated CPU group: never interleaves with DDP's gradient all-reduces, works next to NCCL.
            self._group = dist.new_group(backend="gloo")
        self._posted = torch.zeros(7, dtype=torch.int32)
        self._work: Any = None
        self._has_posted = False

    def exchange(
        self,
        *,
        stop: bool,
        preempt: bool,
        checkpoint: bool,
        report: bool,
        ray_report: bool,
        profile_steps: int = 0,
        communication_report: bool = False,
    ) -> Agreed:
        agreed = self._collect()
        flags = [
            int(stop),
            int(preempt),
            int(checkpoint),
            int(report),
            int(ray_report),
            int(profile_steps),
            int(communication_report),
        ]
        self._posted = torch.tensor(flags, dtype=torch.int32)
        if self._group is not None:
            self._work = dist.all_reduce(self._posted, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        self._has_posted = True
        return agreed

    def _settle(self) -> None:
        """Wait for the exchange in flight (its result stays for the next ``exchange``)."""
        if self._work is not None:
            self._work.wait()
            self._work = None

    def _collect(self) -> Agreed:
        if not self._has_posted:
            return Agreed()
        self._settle()
        self._has_posted = False
        values = self._posted.tolist()
        stop, preempt, checkpoint, report, ray_report = (bool(v) for v in values[:5])
        return Agreed(
            stop=stop,
            preempt=preempt,
            checkpoint=checkpoint,
            report=report,
            ray_report=ray_report,
            profile_steps=int(values[5]),
            communication_report=bool(values[6]),
        )

    def drain(self) -> Agreed:
        """Finish the exchange in flight (every rank calls it at the same point) and return its result."""
        return self._collect()

    def barrier(self) -> None:
        if self._group is not None:
            self._settle()
            dist.barrier(group=self._group)

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self._group is None:
            return obj
        self._settle()
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]

    def gather_to_rank0(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` as a list on rank 0 (None elsewhere)."""
        if self._group is None:
            return [obj]
        self._settle()
        gathered: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(gathered, obj, group=self._group)
        return gathered if self.ctx.is_rank0 else None

    def all_reduce_max(self, value: float) -> float:
        """Maximum of a float over ranks."""
        if self._group is None:
            return value
        self._settle()
        tensor = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self._group)
        return float(tensor.item())

    def all_reduce_mean(self, value: float) -> float:
        """Mean of a float over ranks (report time only)."""
        if self._group is None:
            return value
        self._settle()
        tensor = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(tensor, group=self._group)
        return float(tensor.item()) / self.ctx.world_size
