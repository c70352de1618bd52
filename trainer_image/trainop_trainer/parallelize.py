"""Parallelism applied in one place: device, activation checkpointing, torch.compile, then DDP or FSDP2.

``apply(model, blocks=..., ...)`` takes a freshly built model (on the CPU, initialised from the job's seed,
identical on every rank) and the names of its repeated blocks (transformer layers, ResNet bottlenecks:
``Workload.blocks``) and applies ``spec.parallelism`` in torchtitan's order:

1. move to the device (channels_last for CNNs);
2. activation checkpointing (``activationCheckpointing.mode: blocks``): every ``every``-th block is wrapped
   in ``checkpoint_wrapper`` (non-reentrant), so its activations are recomputed in the backward pass;
   parameter names do not change (the state-dict helpers strip the wrapper); with ``compile``,
   ``compileWrapper`` picks Inductor's kernel-launching wrapper (``use_compile_wrapper``);
3. ``strategy``:

   - ``ddp``: ``DistributedDataParallel`` (gradients bucketed and all-reduced during the backward pass),
     timing only its first 10 iterations for its runtime statistics (``time_ddp_start_only``), then
     ``torch.compile`` of the DDP module (its graph splitting keeps the all-reduce overlapped);
     ``precision`` is applied by autocast in the loop;
   - ``fsdp``: with ``compile``, each block is compiled in place first (the whole model when it has no
     blocks); then ``fully_shard`` on every block and on
     the root (embeddings, head, and whatever is outside the blocks), over a 1-D mesh of every rank.
     ``precision: bf16`` becomes FSDP's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``:
     sharded parameters stay fp32, the gathered copies and the compute are bf16, gradients are reduced in
     fp32; no autocast. ``reshardAfterForward`` and ``cpuOffload`` (``CPUOffloadPolicy``) are passed on;
   - ``hsdp``: the same on a 2-D mesh (replicate across worker pods, shard within each pod's GPUs).

It must not build optimizers or know about checkpoints: parameters are only moved, wrapped and sharded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainop.api import trainingjob
from trainop_trainer import distributed, switches

log = logging.getLogger(__name__)

AUTOCAST_DTYPES = {trainingjob.Precision.BF16: torch.bfloat16, trainingjob.Precision.FP16: torch.float16}

# DDP times its first 10 iterations and then every 100th for its runtime statistics; the forward after a
# timed iteration waits for that iteration's CUDA events, which empties the host's lead over the GPU every 100
# steps (issue #21). A sample rate no run reaches leaves the first 10.
DDP_STATS_SAMPLE_RATE = 2**31 - 1


def time_ddp_start_only(ddp: DistributedDataParallel) -> DistributedDataParallel:
    """Unless ``switches`` ``ddp_stats=sampled``: DDP times no iteration after its first 10 (no host-device
    synchronisation every 100 steps). Returns ``ddp``."""
    if switches.ddp_stats_sampled():
        return ddp
    setter = getattr(ddp, "_set_ddp_runtime_logging_sample_rate", None)  # private: absent in some torch
    if setter is None:
        log.info("this torch's DDP has no runtime-statistics sample rate; DDP samples every 100th step")
        return ddp
    setter(DDP_STATS_SAMPLE_RATE)
    return ddp


@dataclasses.dataclass
class Parallelized:
    model: nn.Module  # the module whose parameters the optimizer and the checkpoints see
    train_model: nn.Module  # what the loop calls (DDP and/or compiled wrapper, or the sharded model)
    strategy: trainingjob.ParallelismStrategy
    autocast_dtype: torch.dtype | None  # None under FSDP: its mixed-precision policy casts instead
    cpu_offload: bool = False

    def gradient_sync(self, enabled: bool) -> Any:
        """A context for one micro-batch: ``enabled=False`` skips the gradient reduction (accumulation)."""
        if enabled:
            return contextlib.nullcontext()
        if self.strategy == trainingjob.ParallelismStrategy.DDP:
            ddp = getattr(self.train_model, "_orig_mod", self.train_model)
            assert isinstance(ddp, DistributedDataParallel)
            return ddp.no_sync()
        return _FsdpNoSync(self.model)


class _FsdpNoSync:
    """FSDP2's ``set_requires_gradient_sync(False)`` for the duration of a micro-batch."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __enter__(self) -> None:
        self.model.set_requires_gradient_sync(False)  # type: ignore[operator]

    def __exit__(self, *exc: object) -> None:
        self.model.set_requires_gradient_sync(True)  # type: ignore[operator]


def _submodule_parent(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    parent_path, _, name = path.rpartition(".")
    return (model.get_submodule(parent_path) if parent_path else model), name


def apply_activation_checkpointing(model: nn.Module, blocks: Sequence[str], *, every: int) -> list[str]:
    """Wrap every ``every``-th block (1st, 1+every-th, ...) in a non-reentrant checkpoint wrapper."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    wrapped = []
    for index, path in enumerate(blocks):
        if index % every:
            continue
        parent, name = _submodule_parent(model, path)
        block = parent.get_submodule(name)
        parent.register_module(
            name,
            checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=True),
        )
        wrapped.append(path)
    return wrapped


def use_compile_wrapper(spec: trainingjob.TrainingJobSpec) -> None:
    """``spec.compileWrapper`` (with ``compile``): Inductor's C++ wrapper (``cpp``) or its Python one, for
    every graph this process compiles from now on; unset, Inductor's own setting stays. The C++ wrapper
    launches a graph's kernels from compiled C++, which takes the host less time per step: compiled
    ResNet-50 at ~40 ms a step is close to host-bound, and with it both the trainer and bare DDP ran steadier
    and faster (docs/benchmarks-gpu.md, rounds 14-19); its first compilation takes minutes longer (the
    wrapper's C++ is compiled too)."""
    wrapper = spec.compile_wrapper
    if not spec.compile or wrapper is None:
        return
    import torch._inductor.config as inductor_config

    inductor_config.cpp_wrapper = wrapper == trainingjob.CompileWrapper.CPP
    log.info("torch.compile with Inductor's %s wrapper (compileWrapper)", wrapper.value)


def compiled_graphs() -> int:
    """How many graphs torch.compile (Dynamo) has captured in this process (``torch._dynamo.reset`` keeps the
    count)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


NOTHING_COMPILED = (
    "spec.compile is true, but torch.compile captured no graph in the first training step: the model %s "
    "runs eagerly. Under DDP torch.compile compiles the model's own forward; a model whose forward is "
    "torch's own code (an nn.Sequential at the top, say) is skipped. Give the model a forward of its own, or "
    "set compile: false"
)


def check_compiled(spec: trainingjob.TrainingJobSpec, model_name: str, *, rank0: bool) -> bool:
    """After the first training step of a process: with ``spec.compile``, whether torch.compile captured any
    graph; if none, rank 0 logs one WARNING that names the field. Without it a compile that silently did
    nothing (locally, torch 2.15: DDP around an ``nn.Sequential``) would look like a slow model."""
    if not spec.compile:
        return True
    graphs = compiled_graphs()
    if rank0:
        if graphs:
            log.info("torch.compile: %d graphs captured in this process by the first training step", graphs)
        else:
            log.warning(NOTHING_COMPILED, model_name)
    return graphs > 0


def _mesh(ctx: distributed.WorkerContext, strategy: trainingjob.ParallelismStrategy) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    device_type = ctx.device.type
    if strategy == trainingjob.ParallelismStrategy.HSDP:
        shard = ctx.local_world_size
        if ctx.world_size % shard:
            raise ValueError(
                f"spec.parallelism.strategy hsdp shards within each worker pod: {ctx.world_size} ranks are "
                f"not whole pods of {shard}; use fsdp"
            )
        return init_device_mesh(
            device_type, (ctx.world_size // shard, shard), mesh_dim_names=("replicate", "shard")
        )
    return init_device_mesh(device_type, (ctx.world_size,), mesh_dim_names=("shard",))


def apply(
    model: nn.Module,
    *,
    blocks: Sequence[str],
    spec: trainingjob.TrainingJobSpec,
    ctx: distributed.WorkerContext,
    channels_last: bool = False,
) -> Parallelized:
    parallelism = spec.parallelism
    strategy = parallelism.strategy
    model.to(ctx.device)
    if channels_last:
        model.to(memory_format=torch.channels_last)
    ac = parallelism.activation_checkpointing
    if ac.mode == trainingjob.ActivationCheckpointingMode.BLOCKS:
        if not blocks:
            raise ValueError(
                "spec.parallelism.activationCheckpointing: this model has no repeated blocks to checkpoint; "
                "set mode none"
            )
        wrapped = apply_activation_checkpointing(model, blocks, every=ac.every)
        log.info("activation checkpointing on %d of %d blocks", len(wrapped), len(blocks))
    use_compile_wrapper(spec)

    if strategy == trainingjob.ParallelismStrategy.DDP:
        ddp_kwargs: dict[str, Any] = {"gradient_as_bucket_view": switches.bucket_view()}
        if ctx.device.type == "cuda":
            ddp_kwargs["device_ids"] = [ctx.device.index]
        train_model: nn.Module = time_ddp_start_only(DistributedDataParallel(model, **ddp_kwargs))
        if spec.compile:
            train_model = torch.compile(train_model)  # type: ignore[assignment]
        return Parallelized(
            model=model,
            train_model=train_model,
            strategy=strategy,
            autocast_dtype=AUTOCAST_DTYPES.get(spec.precision),
        )

    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp_policy = MixedPrecisionPolicy()
    if spec.precision == trainingjob.Precision.BF16:
        mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    shard = functools.partial(
        fully_shard,
        mesh=_mesh(ctx, strategy),
        mp_policy=mp_policy,
        offload_policy=CPUOffloadPolicy() if parallelism.cpu_offload else OffloadPolicy(),
    )
    for index, path in enumerate(blocks):
        block = model.get_submodule(path)
        if spec.compile:
            block.compile()  # in place: parameter names stay as they are
        # The last block is gathered again at once for the backward pass: keeping it saves one all-gather.
        last = index == len(blocks) - 1
        shard(block, reshard_after_forward=parallelism.reshard_after_forward and not last)
    shard(model, reshard_after_forward=parallelism.reshard_after_forward)
    if spec.compile and not blocks:
        model.compile()
    return Parallelized(
        model=model,
        train_model=model,
        strategy=strategy,
        autocast_dtype=None,
        cpu_offload=parallelism.cpu_offload,
    )
