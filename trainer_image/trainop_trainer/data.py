"""Data loading for the train loop: a resumable distributed sampler, the DataLoader, device prefetch.

``ResumableDistributedSampler`` is ``DistributedSampler`` (same seeded per-epoch shuffle, same split across
ranks) that can start part-way through an epoch: resuming at "epoch e, b batches consumed" yields exactly
the indices the uninterrupted run would have seen next. That, plus restored RNG states, is what makes a
resumed run bitwise equal to an uninterrupted one on deterministic hardware.

``DeviceBatches`` moves batches to the device. On CUDA it copies batch k+1 on a side stream while batch k
trains (pinned memory, non-blocking copies), so the copy does not sit on the compute stream; an image batch's
normalisation then runs on the training stream when its step starts (``switches`` ``normalise``).

``SlotBatches`` (switch ``batch_memory=slots``, the default for CUDA loaders with workers): a DataLoader
worker sends each batch in a new shared-memory segment, which the main process maps, copies into pinned
memory in the DataLoader's pin-memory thread and then unmaps and frees. For a 38 MB image batch the unmap
and free hold the GIL for milliseconds, in which the training thread cannot launch kernels (py-spy on 2x
H200, docs/benchmarks-gpu.md). With slots each worker writes its batches into a few shared-memory slots of
its own, in turn; the main process keeps the slots mapped (``MappedSlots``) while the worker lives, so a
batch costs it one copy into pinned memory and nothing is unmapped. A slot is written again only after
the batch in it was copied: the DataLoader gives a worker its next batch only after the main process took
one of its earlier ones, and keeps at most ``prefetch_factor`` batches per worker in flight, one fewer
than the slots.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, default_collate, get_worker_info

from trainop_trainer import switches

Batch = tuple[torch.Tensor, torch.Tensor]


class ResumableDistributedSampler(DistributedSampler[int]):
    def __init__(self, dataset: Dataset[Any], *, num_replicas: int, rank: int, seed: int) -> None:
        super().__init__(
            dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True
        )
        self.start_index = 0

    def set_start_index(self, start_index: int) -> None:
        """Skip the first ``start_index`` samples of this rank's share of the current epoch."""
        self.start_index = start_index

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        return iter(indices[self.start_index :])

    def __len__(self) -> int:
        return max(0, self.num_samples - self.start_index)


def _passthrough(batch: Batch) -> Batch:
    return batch


PREFETCH_FACTOR = 4  # batches in flight per loader worker
SLOTS_PER_WORKER = PREFETCH_FACTOR + 1


class MappedSlots:
    """The main process's hold on its loader workers' slots: each stays mapped while its worker lives (the
    next batch in it then maps nothing: PyTorch's shared-memory cache finds the live storage)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_worker: dict[int, dict[int, torch.UntypedStorage]] = {}

    def keep(self, worker_pid: int, tensors: Sequence[torch.Tensor]) -> None:
        with self._lock:
            held = self._by_worker.get(worker_pid)
            if held is None:
                self._forget_exited()
                held = self._by_worker[worker_pid] = {}
            for tensor in tensors:
                storage = tensor.untyped_storage()
                held.setdefault(storage.data_ptr(), storage)

    def _forget_exited(self) -> None:
        """A new worker: let go of the slots of workers that are gone (an epoch's loader shut down)."""
        for pid in list(self._by_worker):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                del self._by_worker[pid]
            except PermissionError:
                pass

    def held(self) -> dict[int, int]:
        """Worker pid -> storages held (for tests and logs)."""
        with self._lock:
            return {pid: len(storages) for pid, storages in self._by_worker.items()}


MAPPED_SLOTS = MappedSlots()


class SharedBatch:
    """A batch in a loader worker's slot, on its way to the main process; ``pin_memory`` is what the
    DataLoader's pin-memory thread calls on it."""

    def __init__(self, tensors: tuple[torch.Tensor, ...], worker_pid: int) -> None:
        self.tensors = tensors
        self.worker_pid = worker_pid

    def take(self) -> tuple[torch.Tensor, ...]:
        """The slot's tensors, its mapping kept; valid until the worker writes the slot again (copy them)."""
        MAPPED_SLOTS.keep(self.worker_pid, self.tensors)
        return self.tensors

    def pin_memory(self) -> tuple[torch.Tensor, ...]:
        return tuple(tensor.pin_memory() for tensor in self.take())


class SlotBatches(Dataset[Any]):
    """``dataset`` whose batches a loader worker hands over in its own shared-memory slots (module
    docstring). A batch that is not a tuple of tensors shaped like the first one goes the DataLoader's way."""

    def __init__(self, dataset: Dataset[Any], *, slots: int = SLOTS_PER_WORKER) -> None:
        self.dataset = dataset
        self.slots = slots
        self._batched = callable(getattr(dataset, "__getitems__", None))
        self._ring: list[tuple[torch.Tensor, ...]] | None = None
        self._written = 0

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> Any:
        if self._batched:
            batch = self.dataset.__getitems__(indices)  # type: ignore[attr-defined]
        else:
            batch = default_collate([self.dataset[i] for i in indices])
        if get_worker_info() is None or not (
            isinstance(batch, tuple | list) and batch and all(isinstance(t, torch.Tensor) for t in batch)
        ):
            return batch
        if self._ring is None:
            self._ring = [
                tuple(
                    torch.empty(t.shape, dtype=t.dtype).share_memory_()  # type: ignore[no-untyped-call]
                    for t in batch
                )
                for _ in range(self.slots)
            ]
        slot = self._ring[self._written % self.slots]
        if len(slot) != len(batch) or any(
            d.shape != t.shape or d.dtype != t.dtype for d, t in zip(slot, batch, strict=True)
        ):
            return batch
        for destination, tensor in zip(slot, batch, strict=True):
            destination.copy_(tensor)
        self._written += 1
        return SharedBatch(slot, os.getpid())


def make_loader(
    dataset: Dataset[Any],
    sampler: ResumableDistributedSampler,
    *,
    batch_size: int,
    num_workers: int,
    pin_memory: bool,
) -> DataLoader[Any]:
    # Datasets with __getitems__ return a finished batch; only per-sample datasets need collating.
    if pin_memory and num_workers > 0 and switches.batch_slots():
        dataset = SlotBatches(dataset)
    batched = callable(getattr(dataset, "__getitems__", None))
    collate: Callable[[Any], Any] = _passthrough if batched else default_collate
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=num_workers,
        pin_memory=pin_memory,
        collate_fn=collate,
        persistent_workers=False,
        prefetch_factor=PREFETCH_FACTOR if num_workers > 0 else None,
    )


def batches_per_epoch(sampler: ResumableDistributedSampler, batch_size: int) -> int:
    """Full batches in one epoch of one rank (ignoring any resume offset)."""
    return sampler.num_samples // batch_size


class DeviceBatches:
    """Iterates a loader's CPU batches as device batches, prefetching one ahead on CUDA."""

    def __init__(
        self,
        loader: DataLoader[Any],
        *,
        device: torch.device,
        to_device: Callable[[Batch, torch.device], Batch],
    ) -> None:
        self.loader = loader
        self.device = device
        self.to_device = to_device

    def __iter__(self) -> Iterator[Batch]:
        if self.device.type != "cuda":
            for batch in self.loader:
                yield self.to_device(batch, self.device)
            return
        stream = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
        source = iter(self.loader)
        # A to_device with transfer/finish halves (workloads.ImageToDevice) leaves the finish to the training
        # stream (switches normalise=step, the default: see switches.py for why); the copy stays on the copy
        # stream either way.
        transfer = getattr(self.to_device, "transfer", None)
        finish = getattr(self.to_device, "finish", None)

        def load(previous: Batch | None) -> tuple[Batch, bool] | None:
            """The next batch on its way to the device, and whether it still needs ``finish``."""
            try:
                batch = next(source)
            except StopIteration:
                return None
            if isinstance(batch, SharedBatch):  # a loader that did not pin (no pin-memory thread)
                batch = batch.pin_memory()
            mode = switches.prefetch_mode()
            if mode == "repeat" and previous is not None:
                return previous, False  # a diagnostic (switches.py): the previous device batch again
            if mode == "after":
                # Not before the training stream's queued work (the previous step, its all-reduce): an
                # alternative measured slower than the default (switches.py).
                stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                if transfer is not None and finish is not None and switches.normalise_on_step():
                    return transfer(batch, self.device), True
                return self.to_device(batch, self.device), False

        upcoming = load(None)
        while upcoming is not None:
            current_stream = torch.cuda.current_stream(self.device)
            current_stream.wait_stream(stream)
            ready: Sequence[torch.Tensor] = upcoming[0]
            for tensor in ready:
                tensor.record_stream(current_stream)
            current = (ready[0], ready[1])
            if upcoming[1]:
                assert finish is not None
                current = finish(current, self.device)
            upcoming = load(current)
            yield current
