"""Ray Train's FashionMNIST tutorial loop (docs.ray.io, "Get Started with Distributed Training using
PyTorch"), adapted to data that ships with a package: scikit-learn's 8x8 handwritten digits instead of
FashionMNIST's 28x28 clothes, so nothing is downloaded. Everything else is the tutorial's shape, written
only against Ray Train's API — ``ray.train.torch.prepare_model`` / ``prepare_data_loader``,
``ray.train.get_checkpoint``, ``ray.train.report`` with a checkpoint from rank 0 — and knows nothing of
trainop: ``spec.workload.rayTrain: trainop_ray_example.digits:train_loop_per_worker`` runs it as it is.

Config keys (``spec.workload.config``): ``lr`` (0.05), ``epochs`` (10), ``batch_size`` (32 per worker).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import ray.train
import ray.train.torch
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class NeuralNetwork(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(8 * 8, 128),
            nn.ReLU(),
            nn.Dropout(0.25),
            nn.Linear(128, 128),
            nn.ReLU(),
            nn.Dropout(0.25),
            nn.Linear(128, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_relu_stack(self.flatten(x))


def datasets() -> tuple[TensorDataset, TensorDataset]:
    """The digits as 1x8x8 images in 0..1, split 80/20 with a fixed seed (the same on every worker)."""
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    cut = int(0.8 * len(labels))
    train, test = order[:cut], order[cut:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[test], labels[test])


def train_loop_per_worker(config: dict[str, Any]) -> None:
    lr = config.get("lr", 0.05)
    epochs = config.get("epochs", 10)
    batch_size = config.get("batch_size", 32)

    training_data, test_data = datasets()
    train_dataloader = DataLoader(training_data, batch_size=batch_size, shuffle=True)
    test_dataloader = DataLoader(test_data, batch_size=batch_size)
    train_dataloader = ray.train.torch.prepare_data_loader(train_dataloader)
    test_dataloader = ray.train.torch.prepare_data_loader(test_dataloader)

    model = ray.train.torch.prepare_model(NeuralNetwork())
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    start_epoch = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            state = torch.load(os.path.join(checkpoint_dir, "checkpoint.pt"))
        getattr(model, "module", model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1

    for epoch in range(start_epoch, epochs):
        if ray.train.get_context().get_world_size() > 1:
            train_dataloader.sampler.set_epoch(epoch)

        model.train()
        for x, y in train_dataloader:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        model.eval()
        test_loss, correct, num_total = 0.0, 0, 0
        with torch.no_grad():
            for x, y in test_dataloader:
                pred = model(x)
                test_loss += loss_fn(pred, y).item() * len(y)
                num_total += len(y)
                correct += (pred.argmax(1) == y).sum().item()
        metrics = {"epoch": epoch, "loss": test_loss / num_total, "accuracy": correct / num_total}

        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            checkpoint = None
            if ray.train.get_context().get_world_rank() == 0:
                torch.save(
                    {
                        "model": getattr(model, "module", model).state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "epoch": epoch,
                    },
                    os.path.join(temp_checkpoint_dir, "checkpoint.pt"),
                )
                checkpoint = ray.train.Checkpoint.from_directory(temp_checkpoint_dir)
            ray.train.report(metrics, checkpoint=checkpoint)
