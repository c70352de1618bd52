"""Loader workers that hand batches over in their own shared-memory slots (``data.SlotBatches``, switch
``batch_memory=slots``): the same batches in the same order as the DataLoader's own way, slots written again
instead of new segments, the main process's hold let go when an epoch's workers are gone.

Real DataLoader worker processes and real shared memory on the CPU. The pin-memory thread that calls
``SharedBatch.pin_memory`` needs CUDA: ``tests/trainer/test_trainer_cuda_window.py`` runs the whole CUDA path
on the GPU machine; here the batches are taken (``SharedBatch.take``) and copied at once, as that thread does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from trainop_trainer import data, switches
from trainop_trainer.workloads import datasets

BATCH, WORKERS = 8, 2


@pytest.fixture(autouse=True)
def default_switches() -> Iterator[None]:
    switches.reset()
    yield
    switches.reset()


class PerSample(Dataset[Any]):
    """A per-sample dataset (collated by the loader); samples from ``ragged_from`` on are one pixel wider."""

    def __init__(self, n: int, *, ragged_from: int | None = None) -> None:
        self.n = n
        self.ragged_from = ragged_from

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        wide = self.ragged_from is not None and index >= self.ragged_from
        g = torch.Generator().manual_seed(index)
        return torch.randint(0, 256, (3, 4, 5 if wide else 4), generator=g, dtype=torch.uint8), index % 7


def loader(dataset: Dataset[Any], *, slots: bool, start: int = 0) -> DataLoader[Any]:
    sampler = data.ResumableDistributedSampler(dataset, num_replicas=2, rank=1, seed=3)
    sampler.set_start_index(start)
    wrapped = data.SlotBatches(dataset) if slots else dataset
    batched = slots or callable(getattr(dataset, "__getitems__", None))
    collate = data._passthrough if batched else None  # as make_loader does
    return DataLoader(
        wrapped,
        batch_size=BATCH,
        sampler=sampler,
        drop_last=True,
        num_workers=WORKERS,
        collate_fn=collate,
        prefetch_factor=data.PREFETCH_FACTOR,
    )


def taken(batches: DataLoader[Any]) -> tuple[list[tuple[torch.Tensor, ...]], list[int | None], set[int]]:
    """Every batch copied as it arrives, the SharedBatch objects' worker pids, the slot addresses seen."""
    copies: list[tuple[torch.Tensor, ...]] = []
    pids: list[int | None] = []
    addresses: set[int] = set()
    for batch in batches:
        if isinstance(batch, data.SharedBatch):
            pids.append(batch.worker_pid)
            tensors = batch.take()
            addresses.update(t.untyped_storage().data_ptr() for t in tensors)
        else:
            pids.append(None)
            tensors = tuple(batch)
        copies.append(tuple(t.clone() for t in tensors))
    return copies, pids, addresses


def assert_same(a: list[tuple[torch.Tensor, ...]], b: list[tuple[torch.Tensor, ...]]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert len(x) == len(y)
        for s, t in zip(x, y, strict=True):
            assert s.dtype == t.dtype and torch.equal(s, t)


def test_slots_give_the_dataloaders_batches_in_order_writing_a_few_slots_again() -> None:
    images = datasets.SyntheticImages(num_samples=2 * BATCH * 40, image_size=8, num_classes=10, seed=1)
    plain, _, _ = taken(loader(images, slots=False))
    slotted, pids, addresses = taken(loader(images, slots=True))
    assert_same(slotted, plain)
    assert len(slotted) == 40 and set(pids) <= set(data.MAPPED_SLOTS.held()) and None not in pids
    # 40 batches through 2 workers x SLOTS_PER_WORKER slots of two tensors: the same few mappings again.
    assert len(addresses) <= WORKERS * data.SLOTS_PER_WORKER * 2
    assert all(data.MAPPED_SLOTS.held()[pid] <= data.SLOTS_PER_WORKER * 2 for pid in set(pids) if pid)
    # Resuming part-way through the epoch gives the rest of the same batches.
    resumed, _, _ = taken(loader(images, slots=True, start=13 * BATCH))
    assert_same(resumed, plain[13:])


def test_a_new_epochs_workers_replace_the_last_epochs_slots_in_the_main_process() -> None:
    images = datasets.SyntheticImages(num_samples=2 * BATCH * 12, image_size=8, num_classes=10, seed=2)
    batches = loader(images, slots=True)
    _, first, _ = taken(batches)
    _, second, _ = taken(batches)  # a new iterator: new worker processes
    assert set(first).isdisjoint(second)
    held = data.MAPPED_SLOTS.held()
    assert set(second) <= set(held) and not set(first) & set(held)


def test_per_sample_datasets_are_collated_into_slots_and_a_batch_of_another_shape_goes_the_usual_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    samples = PerSample(2 * BATCH * 10)
    plain, _, _ = taken(loader(samples, slots=False))
    slotted, pids, _ = taken(loader(samples, slots=True))
    assert_same(slotted, plain)
    assert None not in pids
    # In a worker (as the loader's worker sees it), samples from index 100 on are wider: a batch of them is
    # returned as it is, and the next batch of the first shape goes into the next slot again.
    monkeypatch.setattr(data, "get_worker_info", lambda: object())
    ragged = data.SlotBatches(PerSample(200, ragged_from=100), slots=2)
    first = ragged.__getitems__(list(range(8)))
    wide = ragged.__getitems__(list(range(100, 108)))
    second = ragged.__getitems__(list(range(8, 16)))
    third = ragged.__getitems__(list(range(16, 24)))
    assert isinstance(first, data.SharedBatch) and isinstance(second, data.SharedBatch)
    assert not isinstance(wide, data.SharedBatch) and wide[0].shape == (8, 3, 4, 5)
    assert first.tensors[0].data_ptr() != second.tensors[0].data_ptr()
    assert isinstance(third, data.SharedBatch) and third.tensors[0].data_ptr() == first.tensors[0].data_ptr()
    expected = torch.utils.data.default_collate([PerSample(200)[i] for i in range(16, 24)])
    assert_same([third.tensors], [tuple(expected)])


def test_make_loader_uses_slots_only_for_pinned_loaders_with_workers_and_the_switch_turns_them_off() -> None:
    images = datasets.SyntheticImages(num_samples=64, image_size=8, num_classes=10, seed=1)
    sampler = data.ResumableDistributedSampler(images, num_replicas=1, rank=0, seed=0)

    def made(*, workers: int, pin: bool) -> Dataset[Any]:
        return data.make_loader(
            images, sampler, batch_size=BATCH, num_workers=workers, pin_memory=pin
        ).dataset

    assert switches.DEFAULTS["batch_memory"] == "slots"
    assert isinstance(made(workers=2, pin=True), data.SlotBatches)
    assert made(workers=0, pin=True) is images and made(workers=2, pin=False) is images
    switches.apply(switches.parse("batch_memory=fresh"))
    assert made(workers=2, pin=True) is images
