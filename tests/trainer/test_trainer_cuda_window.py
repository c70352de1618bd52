"""The report window and the input path on a CUDA device.

``gpu``-marked: skipped (the only skip the tier gate allows) where there is no GPU, and run on the lent GPU
machine with the benchmark calls (docs/benchmarks-gpu.md, "Round 4"):
``python3 -m pytest -o addopts= --noconftest -p no:cacheprovider tests/trainer/test_trainer_cuda_window.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainop_trainer import data, switches
from trainop_trainer.data import Batch, DeviceBatches
from trainop_trainer.reporting import ReportWindow
from trainop_trainer.workloads import datasets

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
# About 0.2 s of a spinning kernel on an H100/H200 (torch.cuda._sleep counts clock cycles).
LONG_KERNEL_CYCLES = 400_000_000


@pytest.fixture(autouse=True)
def default_switches() -> Iterator[None]:
    switches.reset()
    yield
    switches.reset()


def test_lagged_reports_give_the_previous_window_and_the_last_report_the_rest() -> None:
    window = ReportWindow(world_size=2, device=CUDA)
    window.restart(0)
    for value in (1.0, 2.0, 3.0):
        window.add_loss(torch.tensor(value, device=CUDA))
        window.add_samples(8)
    first = window.close(step=3, total_steps=6)
    assert first.local_loss is None and first.covers is None  # nothing staged before the first report

    for _ in range(2):
        window.add_loss(torch.tensor(10.0, device=CUDA))
        window.add_samples(8)
    second = window.close(step=5, total_steps=6)
    assert second.covers == (0, 3)
    assert second.local_loss == pytest.approx(2.0)
    assert second.samples_per_second is not None and second.samples_per_second > 0

    window.add_loss(torch.tensor(7.0, device=CUDA))
    window.add_samples(8)
    last = window.close(step=6, total_steps=6)
    # The window staged at step 5 (two losses of 10) is reported with the last one (7): none is lost.
    assert last.covers == (3, 6) and last.local_loss == pytest.approx(9.0)
    assert last.eta_seconds == 0.0


def test_a_final_report_before_the_last_step_covers_the_staged_window_too() -> None:
    """A run that stops early (a preemption's checkpoint) reports ``final``: no window is left staged."""
    window = ReportWindow(world_size=1, device=CUDA)
    window.restart(0)
    for step, value in ((1, 4.0), (2, 2.0)):
        window.add_loss(torch.tensor(value, device=CUDA))
        window.add_samples(8)
        window.close(step=step, total_steps=100)
    window.add_loss(torch.tensor(6.0, device=CUDA))
    window.add_samples(8)
    stop = window.close(step=3, total_steps=100, final=True)
    assert stop.covers == (1, 3) and stop.local_loss == pytest.approx(4.0)
    assert stop.samples_per_second is not None and stop.samples_per_second > 0


def test_the_last_window_is_timed_on_the_device_not_from_where_the_host_was_ahead() -> None:
    """The host closes a window while the device still runs the window's long kernel: the later windows'
    own device work is tiny, so their rate must not count the ~0.2 s the host was ahead."""
    window = ReportWindow(world_size=1, device=CUDA)
    window.restart(0)
    torch.cuda.synchronize()
    window.add_loss(torch.tensor(1.0, device=CUDA))
    torch.cuda._sleep(LONG_KERNEL_CYCLES)  # type: ignore[no-untyped-call]  # the window's long step
    window.add_samples(100)
    window.close(step=1, total_steps=3)  # lagged: returns at once, the kernel still runs
    for step in (2, 3):
        window.add_loss(torch.tensor(1.0, device=CUDA))
        window.add_samples(100)
        last = window.close(step=step, total_steps=3)  # at 2: reports window 1 (waits for its kernel)
    # The last report covers windows 2 and 3, which started when the host was ~0.2 s ahead of the device:
    # host-timed, they would take that lead, about 1,000 samples/s.
    assert last.covers == (1, 3)
    assert last.samples_per_second is not None and last.samples_per_second > 5_000


def _loader(batches: int) -> DataLoader[tuple[torch.Tensor, ...]]:
    images = torch.arange(batches, dtype=torch.uint8).repeat_interleave(4).reshape(batches, 4)
    return DataLoader(TensorDataset(images, torch.arange(batches)), batch_size=1)


def _to_device(batch: Batch, device: torch.device) -> Batch:
    return batch[0].to(device, non_blocking=True).float(), batch[1].to(device, non_blocking=True)


def test_eager_prefetch_gives_every_batch_in_order() -> None:
    got = [int(b[1].item()) for b in DeviceBatches(_loader(5), device=CUDA, to_device=_to_device)]
    assert got == [0, 1, 2, 3, 4]


def test_prefetch_repeat_reads_the_loader_but_trains_on_the_first_device_batch_again() -> None:
    switches.apply({"prefetch": "repeat"})
    batches = list(DeviceBatches(_loader(5), device=CUDA, to_device=_to_device))
    assert len(batches) == 5  # the loader is read to its end: epochs and positions stay as they are
    assert all(batch[0] is batches[0][0] for batch in batches)
    assert float(batches[-1][0][0, 0]) == 0.0


def test_slot_batches_through_the_pin_memory_thread_give_the_fresh_loaders_batches_on_the_device() -> None:
    """``batch_memory=slots`` on the real CUDA path: DataLoader workers, its pin-memory thread calling
    ``SharedBatch.pin_memory``, ``DeviceBatches``' side stream; three epochs (new workers each)."""
    images = datasets.SyntheticImages(num_samples=16 * 30, image_size=32, num_classes=10, seed=4)
    sampler = data.ResumableDistributedSampler(images, num_replicas=1, rank=0, seed=5)

    def epochs(memory: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
        switches.apply({"batch_memory": memory})
        loader = data.make_loader(images, sampler, batch_size=16, num_workers=3, pin_memory=True)
        assert isinstance(loader.dataset, data.SlotBatches) == (memory == "slots")
        out = []
        for epoch in range(3):
            sampler.set_epoch(epoch)
            for x, y in DeviceBatches(loader, device=CUDA, to_device=_to_device):
                assert x.is_cuda and y.is_cuda
                out.append((x.cpu(), y.cpu()))
        return out

    fresh, slots = epochs("fresh"), epochs("slots")
    assert len(slots) == len(fresh) == 90
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(slots, fresh, strict=True))
    # The last epoch's three workers' slots are held, no more than their slots of two tensors each.
    held = data.MAPPED_SLOTS.held()
    assert len(held) == 3 and all(n <= data.SLOTS_PER_WORKER * 2 for n in held.values())


def test_normalising_on_the_training_stream_gives_the_same_batches_as_on_the_copy_stream() -> None:
    """``normalise=step``: the copy stream only copies, the training stream normalises when the step takes
    the batch; every batch is bitwise the one of the default (``normalise=copy``), in order, for each
    ``input`` kernel, and switching between batches (as an A/B block does) gives the same too."""
    from trainop_trainer.workloads import ImageToDevice

    images = datasets.SyntheticImages(num_samples=8 * 6, image_size=32, num_classes=10, seed=3)
    sampler = data.ResumableDistributedSampler(images, num_replicas=1, rank=0, seed=5)
    loader = data.make_loader(images, sampler, batch_size=8, num_workers=0, pin_memory=True)
    to_device = ImageToDevice(channels_last=True, dtype=torch.bfloat16)

    def run(settings: list[dict[str, str | int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Batch k is loaded (one ahead) under ``settings[k]`` (the last for the rest)."""
        switches.reset()
        switches.apply(settings[0])
        out = []
        for i, (x, y) in enumerate(DeviceBatches(loader, device=CUDA, to_device=to_device)):
            assert x.is_contiguous(memory_format=torch.channels_last)
            out.append((x.cpu(), y.cpu()))
            switches.apply(settings[min(i + 2, len(settings) - 1)])
        return out

    def same(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> bool:
        return torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])

    for mode in switches.INPUT_MODES:
        on_copy = run([{"input": mode, "normalise": "copy"}])
        on_step = run([{"input": mode, "normalise": "step"}])
        assert len(on_step) == len(on_copy) == 6
        assert all(same(a, b) for a, b in zip(on_step, on_copy, strict=True))
    reference = run([{}])
    mixed = run([{"normalise": "step"}, {"normalise": "copy"}, {"normalise": "step"}])
    assert all(same(a, b) for a, b in zip(mixed, reference, strict=True))
