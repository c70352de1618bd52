"""The batch-size finder: ``hyperparameters.batchSizePerWorker: auto``.

Before the first step of a run, every rank measures the peak memory of one real training step — forward,
backward and an optimizer step at learning rate 0, through the job's own parallelism (DDP, FSDP2, HSDP),
precision, activation checkpointing and compilation — at a few batch sizes, and ``search`` picks the
largest multiple of ``batchSizeSearch.multipleOf`` whose step fits the memory budget:

1. ``multipleOf``, then doubling while the line through the last two measurements predicts that the next
   batch fits (memory = fixed + per-sample x batch is what activations make of a step);
2. the batch the line predicts at the budget, tried; then the prediction again from the new point, until it
   offers nothing larger; a batch that did not fit is bisected down to one that does.

Under DDP the probes run under ``no_sync`` (no collective inside a probe, so an out-of-memory error on one
rank cannot strand the others): the finder also tries one step beyond its prediction, and catches the
error. Under FSDP the all-gathers are part of what is measured and a failed step would leave sharded state
half-way, so only batches predicted to fit are tried there: the result rests on memory growing linearly
with the batch (bench/gpu checks it by trying batch + multipleOf). Every rank's measurement is combined
(the largest peak counts), so all ranks walk the same path and agree on the batch.

Memory is measured as PyTorch's peak reserved memory on CUDA (what an out-of-memory error is about),
against the device's memory less what is not PyTorch's (CUDA context, NCCL, other processes) less
``memoryHeadroom``. On CPU it is the process's peak resident memory (``VmHWM``, reset through
``/proc/self/clear_refs``) against ``workers.memoryPerWorker``.

Probing leaves no trace: the learning rate is 0 (parameters unchanged, bit for bit), buffers (batch-norm
statistics) and RNG states are put back, the optimizer state the probes created is dropped. The choice is
written to ``<run>/trainop/batch-size.json`` and reused by every later start of the run (a restarted worker
group, a new attempt), so a run keeps one batch size — its data position and learning rate depend on it.
The learning rate follows ``batchSizeSearch.learningRateRule``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import pathlib
import re
from collections.abc import Callable

import torch

from trainop.api import trainingjob
from trainop_trainer import storage

log = logging.getLogger(__name__)

Measure = Callable[[int], int | None]  # batch -> peak bytes over every rank, None: out of memory


class BatchSizeError(RuntimeError):
    """Even the smallest batch does not fit."""


@dataclasses.dataclass(frozen=True)
class Probe:
    batch: int
    peak_bytes: int | None  # None: out of memory

    def fits(self, budget: int) -> bool:
        return self.peak_bytes is not None and self.peak_bytes <= budget


@dataclasses.dataclass(frozen=True)
class Choice:
    batch_size: int
    learning_rate: float
    budget_bytes: int
    probes: tuple[Probe, ...]

    def to_json(self) -> str:
        return json.dumps(
            {
                "batchSizePerWorker": self.batch_size,
                "learningRate": self.learning_rate,
                "budgetBytes": self.budget_bytes,
                "probes": [dataclasses.asdict(p) for p in self.probes],
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> Choice:
        data = json.loads(text)
        return cls(
            batch_size=int(data["batchSizePerWorker"]),
            learning_rate=float(data["learningRate"]),
            budget_bytes=int(data["budgetBytes"]),
            probes=tuple(Probe(int(p["batch"]), p["peak_bytes"]) for p in data.get("probes", [])),
        )


def _round_down(value: float, multiple: int) -> int:
    return math.floor(value / multiple) * multiple


def search(
    measure: Measure, *, budget: int, multiple_of: int, max_batch: int, verify_next: bool
) -> tuple[int, list[Probe]]:
    """The largest multiple of ``multiple_of`` up to ``max_batch`` whose measured peak fits ``budget``.
    ``verify_next``: also try one step beyond what the prediction allows (only where an out-of-memory
    error in a probe is harmless)."""
    probes: list[Probe] = []
    tried: dict[int, Probe] = {}

    def trial(batch: int) -> bool:
        if batch not in tried:
            probe = Probe(batch, measure(batch))
            tried[batch] = probe
            probes.append(probe)
        return tried[batch].fits(budget)

    def predicted_max() -> int:
        """The batch at which the line through the two largest fitting measurements reaches the budget."""
        points = sorted((p.batch, p.peak_bytes) for p in tried.values() if p.fits(budget))
        (b1, m1), (b2, m2) = points[-2], points[-1]
        per_sample = max((m2 - m1) / (b2 - b1), 1.0)  # type: ignore[operator]
        return _round_down(b2 + (budget - m2) / per_sample, multiple_of)  # type: ignore[operator]

    best = multiple_of
    if max_batch < multiple_of or not trial(best):
        raise BatchSizeError(
            f"a batch of {multiple_of} per worker does not fit the memory budget of {budget / 2**30:.1f} GiB "
            f"(measured {tried[best].peak_bytes if best in tried else '?'} bytes): use a smaller "
            "hyperparameters.batchSizeSearch.multipleOf, activation checkpointing, or more GPUs with fsdp"
        )
    failed: int | None = None
    # 1. Double while the line predicts that the next batch fits.
    while best < max_batch:
        candidate = min(_round_down(2 * best, multiple_of), _round_down(max_batch, multiple_of))
        if candidate <= best:
            break
        if len([p for p in tried.values() if p.fits(budget)]) >= 2 and predicted_max() < candidate:
            break
        if not trial(candidate):
            failed = candidate
            break
        best = candidate
    # 2. Follow the prediction while it offers more, bisect what did not fit.
    while best < max_batch:
        if failed is not None and failed - best <= multiple_of:
            break
        if len([p for p in tried.values() if p.fits(budget)]) >= 2:
            candidate = predicted_max()
        else:
            candidate = best + multiple_of
        upper = (failed - multiple_of) if failed is not None else _round_down(max_batch, multiple_of)
        candidate = min(candidate, upper)
        if candidate <= best:
            break
        if trial(candidate):
            best = candidate
        else:
            failed = candidate
            # Bisect between the best fit and the failure (a step that is always below the failure).
            middle = _round_down((best + candidate) / 2, multiple_of)
            while middle > best and not trial(middle):
                failed = middle
                middle = _round_down((best + middle) / 2, multiple_of)
            if middle > best:
                best = middle
    if verify_next and (failed is None or failed > best + multiple_of):
        beyond = best + multiple_of
        while beyond <= max_batch and trial(beyond):
            best, beyond = beyond, beyond + multiple_of
    return best, probes


def learning_rate_for(hp: trainingjob.Hyperparameters, batch_size: int) -> float:
    search_spec = hp.batch_size_search
    ratio = batch_size / search_spec.reference_batch_size
    if search_spec.learning_rate_rule == trainingjob.LearningRateRule.LINEAR:
        return hp.learning_rate * ratio
    if search_spec.learning_rate_rule == trainingjob.LearningRateRule.SQRT:
        return hp.learning_rate * math.sqrt(ratio)
    return hp.learning_rate


# ----------------------------------------------------------------------------------------- memory gauges
_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_UNITS = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def quantity_bytes(quantity: str) -> int:
    match = _QUANTITY.match(quantity)
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(f"cannot read the memory quantity {quantity!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


class CudaGauge:
    """Peak reserved memory of PyTorch's CUDA allocator."""

    def __init__(self, device: torch.device, *, headroom: float) -> None:
        self.device = device
        free, total = torch.cuda.mem_get_info(device)
        others = total - free - torch.cuda.memory_reserved(device)  # context, NCCL, other processes
        self.budget = int((total - others) * (1.0 - headroom))

    def reset(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int:
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_reserved(self.device))


class CpuGauge:
    """Peak resident memory of this process (Linux ``VmHWM``, reset before each probe)."""

    def __init__(self, *, memory_bytes: int, processes: int, headroom: float) -> None:
        self.budget = int(memory_bytes / max(1, processes) * (1.0 - headroom))

    def reset(self) -> None:
        pathlib.Path("/proc/self/clear_refs").write_text("5")

    def peak(self) -> int:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("/proc/self/status has no VmHWM")


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def read_choice(path: storage.RunDir) -> Choice | None:
    try:
        return Choice.from_json(path.read_text())
    except (OSError, ValueError, KeyError):
        return None


def log_choice(choice: Choice, *, reused: bool) -> None:
    tried = ", ".join(
        f"{p.batch}: {'out of memory' if p.peak_bytes is None else f'{p.peak_bytes / 2**30:.2f} GiB'}"
        for p in choice.probes
    )
    log.info(
        "batch size %d per worker (%s), learning rate %.6g; budget %.2f GiB; probes %s",
        choice.batch_size,
        "chosen earlier in this run" if reused else "found",
        choice.learning_rate,
        choice.budget_bytes / 2**30,
        tried or "-",
    )


def probe_state(*, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    """Save what probing may touch; the returned function puts it back (see the module docstring)."""
    import random

    import numpy as np

    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    lrs = [group["lr"] for group in optimizer.param_groups]
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    np_rng = np.random.get_state()
    py_rng = random.getstate()
    for group in optimizer.param_groups:
        group["lr"] = 0.0

    def restore() -> None:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(buffers[name])
        for group, lr in zip(optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        optimizer.state.clear()
        optimizer.zero_grad(set_to_none=True)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        np.random.set_state(np_rng)
        random.setstate(py_rng)

    return restore
