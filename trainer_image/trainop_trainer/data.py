"""Data loading for the train loop: a resumable distributed sampler, the DataLoader, device prefetch.

``ResumableDistributedSampler`` is ``DistributedSampler`` (same seeded per-epoch shuffle, same split across
ranks) that can start part-way through an epoch: resuming at "epoch e, b batches consumed" yields exactly
the indices the uninterrupted run would have seen next. That, plus restored RNG states, is what makes a
resumed run bitwise equal to an uninterrupted one on deterministic hardware.

``DeviceBatches`` moves batches to the device. On CUDA it copies batch k+1 on a side stream while batch k
trains (pinned memory, non-blocking copies), so the copy does not sit on the compute stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, default_collate

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


def make_loader(
    dataset: Dataset[Any],
    sampler: ResumableDistributedSampler,
    *,
    batch_size: int,
    num_workers: int,
    pin_memory: bool,
) -> DataLoader[Any]:
    # Datasets with __getitems__ return a finished batch; only per-sample datasets need collating.
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
        prefetch_factor=4 if num_workers > 0 else None,
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

        def load(previous: Batch | None) -> Batch | None:
            try:
                batch = next(source)
            except StopIteration:
                return None
            mode = switches.prefetch_mode()
            if mode == "repeat" and previous is not None:
                return previous  # a diagnostic (switches.py): the previous device batch again
            if mode == "after":
                # Not before the training stream's queued work (the previous step, its all-reduce): an
                # alternative measured slower than the default (switches.py).
                stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                return self.to_device(batch, self.device)

        upcoming = load(None)
        while upcoming is not None:
            current_stream = torch.cuda.current_stream(self.device)
            current_stream.wait_stream(stream)
            ready: Sequence[torch.Tensor] = upcoming
            for tensor in ready:
                tensor.record_stream(current_stream)
            current = (ready[0], ready[1])
            upcoming = load(current)
            yield current
