"""Datasets of the built-in workloads. Nothing is downloaded: real datasets are read from a path.

Every dataset yields ``(inputs, targets)`` batches of CPU tensors. Images stay ``uint8`` until they reach
the device (a quarter of the bytes to copy; normalisation runs on the GPU). Datasets that can assemble a
whole batch at once implement ``__getitems__`` (PyTorch's batched fetch), which skips per-sample Python
calls and the collate step: the synthetic sets, CIFAR-10 and token files do.

- ``SyntheticVectors``: seeded Gaussian features, labels from a fixed random linear teacher (learnable).
- ``SyntheticImages``: a seeded pool of random uint8 images; sample ``i`` is pool image ``i % pool``.
- ``SyntheticTokens``: a seeded random token stream cut into windows.
- ``Cifar10``: the "python version" pickled batches (``data_batch_1..5``) from a directory.
- ``imagefolder``: ``torchvision.datasets.ImageFolder`` with random-resized-crop and flip to uint8.
- ``TokenFile``: a flat memory-mapped ``uint16`` token file cut into non-overlapping windows.
- ``MaskedTokens``: any of the token sets above, masked for masked-LM training (BERT's 15 % rule).

All synthetic data is a pure function of (seed, index), so every rank and every attempt sees the same
samples for the same indices: the sampler alone decides the order (see ``sampler.py``).
"""

from __future__ import annotations

import pathlib
import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from trainop.api import trainingjob

Batch = tuple[torch.Tensor, torch.Tensor]


def _generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


class BatchedDataset(Dataset[Batch]):
    """A map-style dataset that can also build a batch from a list of indices in one call."""

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        raise NotImplementedError

    def __getitem__(self, index: int) -> Batch:
        inputs, targets = self.__getitems__([index])
        return inputs[0], targets[0]


class SyntheticVectors(BatchedDataset):
    def __init__(self, *, num_samples: int, input_dim: int, num_classes: int, seed: int) -> None:
        g = _generator(seed)
        self.features = torch.randn(num_samples, input_dim, generator=g)
        teacher = torch.randn(input_dim, num_classes, generator=g)
        self.labels = (self.features @ teacher).argmax(dim=1)

    def __len__(self) -> int:
        return int(self.features.shape[0])

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        index = torch.as_tensor(indices, dtype=torch.long)
        return self.features[index], self.labels[index]


class SyntheticImages(BatchedDataset):
    def __init__(
        self, *, num_samples: int, image_size: int, num_classes: int, seed: int, pool_size: int = 64
    ) -> None:
        g = _generator(seed)
        self.num_samples = num_samples
        pool = min(pool_size, num_samples)
        self.pool = torch.randint(0, 256, (pool, 3, image_size, image_size), generator=g, dtype=torch.uint8)
        self.pool_labels = torch.randint(0, num_classes, (pool,), generator=g)

    def __len__(self) -> int:
        return self.num_samples

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        index = torch.as_tensor(indices, dtype=torch.long) % self.pool.shape[0]
        return self.pool[index], self.pool_labels[index]


class SyntheticTokens(BatchedDataset):
    def __init__(self, *, num_samples: int, sequence_length: int, vocab_size: int, seed: int) -> None:
        g = _generator(seed)
        self.num_samples = num_samples
        self.sequence_length = sequence_length
        # A stream long enough for many distinct windows, capped so a huge num_samples costs no memory.
        length = min(num_samples * sequence_length, 1 << 22) + sequence_length + 1
        self.stream = torch.randint(0, vocab_size, (length,), generator=g, dtype=torch.long)
        self._starts = length - sequence_length - 1

    def __len__(self) -> int:
        return self.num_samples

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        starts = (torch.as_tensor(indices, dtype=torch.long) * self.sequence_length) % self._starts
        offsets = torch.arange(self.sequence_length + 1)
        windows = self.stream[starts[:, None] + offsets[None, :]]
        return windows[:, :-1], windows[:, 1:]


class Cifar10(BatchedDataset):
    """CIFAR-10's python-pickle batches: ``<path>/data_batch_{1..5}`` (or ``<path>/cifar-10-batches-py``)."""

    def __init__(self, path: str) -> None:
        root = pathlib.Path(path)
        if (root / "cifar-10-batches-py").is_dir():
            root = root / "cifar-10-batches-py"
        files = sorted(root.glob("data_batch_*"))
        if not files:
            raise FileNotFoundError(
                f"spec.workload.dataset.path: no CIFAR-10 data_batch_* files in {root}; point it at the "
                "extracted cifar-10-batches-py directory"
            )
        data: list[np.ndarray] = []
        labels: list[int] = []
        for file in files:
            with file.open("rb") as f:
                batch = pickle.load(f, encoding="bytes")
            data.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            labels.extend(int(x) for x in batch[b"labels"])
        self.images = torch.from_numpy(np.concatenate(data))
        self.labels = torch.tensor(labels, dtype=torch.long)

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        index = torch.as_tensor(indices, dtype=torch.long)
        return self.images[index], self.labels[index]


class TokenFile(BatchedDataset):
    """A flat file of little-endian uint16 token ids, memory-mapped, in windows of ``sequence_length``."""

    def __init__(self, path: str, *, sequence_length: int, vocab_size: int) -> None:
        file = pathlib.Path(path)
        if not file.is_file():
            raise FileNotFoundError(f"spec.workload.dataset.path: {file} is not a file of uint16 tokens")
        self.tokens = np.memmap(file, dtype=np.uint16, mode="r")
        self.sequence_length = sequence_length
        self.num_windows = (len(self.tokens) - 1) // sequence_length
        if self.num_windows < 1:
            raise ValueError(
                f"spec.workload.dataset.path: {file} holds {len(self.tokens)} tokens, fewer than one window "
                f"of sequenceLength {sequence_length} + 1"
            )
        head_max = int(self.tokens[: 1 << 20].max())
        if head_max >= vocab_size:
            raise ValueError(
                f"spec.workload.dataset.path: token id {head_max} in {file} does not fit the model's "
                f"vocabulary of {vocab_size}: set spec.workload.config.vocabSize above the largest token id"
            )

    def __len__(self) -> int:
        return self.num_windows

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        starts = np.asarray(indices, dtype=np.int64) * self.sequence_length
        windows = np.stack([self.tokens[s : s + self.sequence_length + 1] for s in starts]).astype(np.int64)
        batch = torch.from_numpy(windows)
        return batch[:, :-1], batch[:, 1:]


def image_folder(path: str, *, image_size: int) -> Dataset[Any]:
    """An ImageFolder tree (``<class>/<image>``) with the standard training augmentation, to uint8."""
    import torchvision
    from torchvision.transforms import v2

    root = pathlib.Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"spec.workload.dataset.path: {root} is not a directory of class folders")
    transform = v2.Compose(
        [
            v2.PILToTensor(),
            v2.RandomResizedCrop(image_size, antialias=True),
            v2.RandomHorizontalFlip(),
        ]
    )
    dataset: Dataset[Any] = torchvision.datasets.ImageFolder(str(root), transform=transform)
    return dataset


class MaskedTokens(BatchedDataset):
    """Masked-LM samples from a token dataset: of each window's tokens, 15 % are chosen; of those, 80 % become
    ``mask_token_id``, 10 % a random token, 10 % stay. Targets are the original tokens at chosen positions
    and ``ignore_index`` elsewhere. The choice is drawn from a generator seeded by (seed, sample index): the
    same sample is masked the same way in every epoch, on every rank and after every resume."""

    def __init__(
        self,
        tokens: BatchedDataset,
        *,
        vocab_size: int,
        mask_token_id: int,
        seed: int,
        ignore_index: int = -100,
        mask_probability: float = 0.15,
    ) -> None:
        self.tokens = tokens
        self.vocab_size = vocab_size
        self.mask_token_id = mask_token_id
        self.seed = seed
        self.ignore_index = ignore_index
        self.mask_probability = mask_probability

    def __len__(self) -> int:
        return len(self.tokens)  # type: ignore[arg-type]

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        windows, _ = self.tokens.__getitems__(indices)
        inputs = windows.clone()
        targets = torch.full_like(windows, self.ignore_index)
        g = torch.Generator()
        for row, index in enumerate(indices):
            g.manual_seed(self.seed * 1_000_003 + int(index))
            length = windows.shape[1]
            chosen = torch.rand(length, generator=g) < self.mask_probability
            action = torch.rand(length, generator=g)
            random_tokens = torch.randint(0, self.vocab_size, (length,), generator=g, dtype=windows.dtype)
            targets[row, chosen] = windows[row, chosen]
            inputs[row, chosen & (action < 0.8)] = self.mask_token_id
            swap = chosen & (action >= 0.8) & (action < 0.9)
            inputs[row, swap] = random_tokens[swap]
        return inputs, targets


class Digits(BatchedDataset):
    """scikit-learn's bundled handwritten digits (1,797 samples of 8x8 pixels, 10 classes): a small real
    dataset that ships inside a package, so a learning check needs no download. Pixels 0..16 become
    float32 0..1, flattened to 64 features."""

    NUM_FEATURES = trainingjob.DIGITS_FEATURES  # the mlp's inputDim on it (the API refuses another)
    NUM_CLASSES = 10

    def __init__(self) -> None:
        try:
            from sklearn.datasets import load_digits
        except ImportError:
            raise ValueError(
                "spec.workload.dataset.kind digits reads scikit-learn's bundled digits: install "
                "scikit-learn in the trainer image, or choose another dataset kind"
            ) from None
        bunch = load_digits()
        self.features = torch.from_numpy(np.asarray(bunch.data, dtype=np.float32) / 16.0)
        self.labels = torch.from_numpy(np.asarray(bunch.target, dtype=np.int64))

    def __len__(self) -> int:
        return int(self.features.shape[0])

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        index = torch.as_tensor(indices, dtype=torch.long)
        return self.features[index], self.labels[index]


class IndexSubset(BatchedDataset):
    """The samples ``indices`` of ``base`` (a held-out split or what is left for training), keeping the
    base's batched fetch when it has one."""

    def __init__(self, base: Dataset[Batch], indices: Sequence[int]) -> None:
        self.base = base
        self.indices = list(indices)
        self._getitems = getattr(base, "__getitems__", None)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        mapped = [self.indices[i] for i in indices]
        if callable(self._getitems):
            batch: Batch = self._getitems(mapped)
            return batch
        from torch.utils.data import default_collate

        collated: Batch = default_collate([self.base[i] for i in mapped])
        return collated


def holdout_split(dataset: Dataset[Batch], *, fraction: float, seed: int) -> tuple[IndexSubset, IndexSubset]:
    """``(train, holdout)``: a seeded choice of ``fraction`` of the samples is held out, the same on every
    rank and every attempt; training never sees them."""
    size = len(dataset)  # type: ignore[arg-type]
    held = int(size * fraction)
    if held < 1 or held >= size:
        raise ValueError(
            f"spec.evaluation.holdoutFraction {fraction} of {size} samples leaves no evaluation or no "
            "training samples: choose a fraction that leaves samples on both sides, or set "
            "evaluation.dataset"
        )
    order = torch.randperm(size, generator=_generator(seed + 7919)).tolist()
    return IndexSubset(dataset, sorted(order[held:])), IndexSubset(dataset, sorted(order[:held]))
