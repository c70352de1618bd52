"""Evaluation of the built-in loop's model (``spec.evaluation``) and the metrics it reports.

``Evaluator.due(step)`` says whether the model is evaluated after ``step`` — every ``everySteps`` steps, at
the end of every ``everyEpochs`` epochs (an epoch is a fixed number of optimizer steps, so that is a step
count too), and always after the last step — the same answer on every rank without talking.
``Evaluator.evaluate(model)`` is collective: every rank runs the model, in eval mode and without
gradients, on its share of the evaluation set (sample ``i`` of the set goes to rank ``i % world``), and
the sums — loss, correct top-1 and top-5 predictions, samples or target tokens — are all-reduced once at
the end. Every rank runs the same number of batches (a shorter share is padded and masked out), because
an FSDP-sharded forward pass is itself collective.

Metrics by ``Workload.task``:

- ``classification``: ``loss`` (mean cross-entropy), ``accuracy`` (top-1) and ``top5Accuracy`` (with at
  least 5 classes);
- ``language_model`` / ``masked_lm``: ``loss`` (mean per target token, masked tokens only for BERT),
  ``perplexity`` = exp(loss), ``accuracy`` (next-token / masked-token top-1).

It must not decide what happens with the numbers (``reporting`` publishes them, the ``Checkpointer`` ranks
checkpoints by them) nor touch the training state: the model's train/eval mode is restored, no RNG is
drawn (the evaluation set is read in order), the optimizer is never called.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, default_collate

from trainop.api import trainingjob
from trainop_trainer import distributed
from trainop_trainer.workloads import CLASSIFICATION, Batch

log = logging.getLogger(__name__)

IGNORE_INDEX = -100  # encoders.IGNORE_INDEX: targets that are not predicted (BERT's unmasked tokens)


def rank_indices(size: int, *, rank: int, world_size: int) -> list[int]:
    """This rank's share of an evaluation set of ``size`` samples: every ``world_size``-th sample."""
    return list(range(rank, size, world_size))


def batches_for(size: int, *, world_size: int, batch_size: int, max_batches: int | None) -> int:
    """How many batches every rank runs: enough for the largest share, at most ``max_batches``."""
    largest_share = math.ceil(size / world_size)
    batches = math.ceil(largest_share / batch_size)
    return batches if max_batches is None else min(batches, max_batches)


class Evaluator:
    def __init__(
        self,
        *,
        evaluation: trainingjob.Evaluation,
        dataset: Dataset[Batch],
        task: str,
        ctx: distributed.WorkerContext,
        batch_size: int,
        to_device: Callable[[Batch, torch.device], Batch],
        autocast: Callable[[], contextlib.AbstractContextManager[Any]],
        steps_per_epoch: int,
        total_steps: int,
    ) -> None:
        self.evaluation = evaluation
        self.dataset = dataset
        self.task = task
        self.ctx = ctx
        self.batch_size = evaluation.batch_size_per_worker or batch_size
        self.to_device = to_device
        self.autocast = autocast
        self.total_steps = total_steps
        self._epoch_steps = (
            None if evaluation.every_epochs is None else evaluation.every_epochs * steps_per_epoch
        )
        size = len(dataset)  # type: ignore[arg-type]
        if size < 1:
            raise ValueError("spec.evaluation: the evaluation set is empty; give it samples")
        self._indices = rank_indices(size, rank=ctx.rank, world_size=ctx.world_size)
        self._num_batches = batches_for(
            size, world_size=ctx.world_size, batch_size=self.batch_size, max_batches=evaluation.max_batches
        )
        self._getitems = getattr(dataset, "__getitems__", None)
        self.last_step: int | None = None  # the step of the last evaluation of this worker group

    def due(self, step: int) -> bool:
        """True when the model is evaluated after ``step`` (every rank gets the same answer)."""
        if step == self.last_step:
            return False
        every = self.evaluation.every_steps
        if every is not None and step % every == 0:
            return True
        if self._epoch_steps is not None and step % self._epoch_steps == 0:
            return True
        return step >= self.total_steps

    def _batch(self, number: int) -> tuple[Batch, torch.Tensor]:
        """Batch ``number`` of this rank, padded to the batch size, and the mask of its real samples."""
        start = number * self.batch_size
        real = self._indices[start : start + self.batch_size]
        filler = self._indices[:1] or [0]
        indices = real + filler * (self.batch_size - len(real))
        mask = torch.zeros(self.batch_size, dtype=torch.bool)
        mask[: len(real)] = True
        if callable(self._getitems):
            batch: Batch = self._getitems(indices)
        else:
            batch = default_collate([self.dataset[i] for i in indices])
        return batch, mask

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Collective: the metrics of ``model`` on the whole evaluation set (or ``maxBatches`` per rank)."""
        started = time.perf_counter()
        device = self.ctx.device
        # loss sum, top-1 correct, top-5 correct, count (samples or target tokens)
        sums = torch.zeros(4, dtype=torch.float64, device=device)
        classes = 0
        was_training = model.training
        model.eval()
        try:
            for number in range(self._num_batches):
                cpu_batch, mask = self._batch(number)
                inputs, targets = self.to_device(cpu_batch, device)
                with self.autocast():
                    outputs = model(inputs)
                sums += _sums(outputs.float(), targets, mask.to(device), task=self.task)
                classes = int(outputs.shape[-1])
        finally:
            model.train(was_training)
        if dist.is_initialized() and self.ctx.world_size > 1:
            dist.all_reduce(sums)
        loss_sum, top1, top5, count = sums.tolist()
        metrics = _metrics(loss_sum, top1, top5, count, task=self.task, classes=classes)
        metrics["samples"] = float(count)
        if self.ctx.is_rank0:
            log.info(
                "evaluation: %s (%d batches per rank, %.2fs)",
                " ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k != "samples"),
                self._num_batches,
                time.perf_counter() - started,
            )
        return metrics


def _sums(outputs: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, *, task: str) -> torch.Tensor:
    """[loss sum, top-1 correct, top-5 correct, count] of one batch, masked rows left out."""
    if task == CLASSIFICATION:
        losses = F.cross_entropy(outputs, targets, reduction="none")
        keep = mask.to(losses.dtype)
        k = min(5, outputs.shape[-1])
        topk = outputs.topk(k, dim=-1).indices
        hit = topk == targets.unsqueeze(-1)
        top1 = hit[:, 0].to(keep.dtype)
        top5 = hit.any(dim=-1).to(keep.dtype)
        return torch.stack(
            [(losses * keep).sum(), (top1 * keep).sum(), (top5 * keep).sum(), keep.sum()]
        ).double()
    # Token-level tasks: [batch, sequence, vocab] logits; targets IGNORE_INDEX where nothing is predicted.
    vocab = outputs.shape[-1]
    flat_targets = targets.reshape(targets.shape[0], -1)
    valid = (flat_targets != IGNORE_INDEX) & mask.unsqueeze(-1)
    flat_outputs = outputs.reshape(-1, vocab)
    masked_targets = torch.where(valid, flat_targets, torch.full_like(flat_targets, IGNORE_INDEX))
    loss_sum = F.cross_entropy(
        flat_outputs, masked_targets.reshape(-1), reduction="sum", ignore_index=IGNORE_INDEX
    )
    predicted = flat_outputs.argmax(dim=-1).reshape(flat_targets.shape)
    top1 = ((predicted == flat_targets) & valid).sum()
    count = valid.sum()
    return torch.stack(
        [
            loss_sum.double(),
            top1.double(),
            torch.zeros((), dtype=torch.float64, device=outputs.device),
            count.double(),
        ]
    )


def _metrics(
    loss_sum: float, top1: float, top5: float, count: float, *, task: str, classes: int
) -> dict[str, float]:
    if count <= 0:
        return {}
    loss = loss_sum / count
    metrics = {"loss": loss, "accuracy": top1 / count}
    if task == CLASSIFICATION:
        if classes >= 5:
            metrics["top5Accuracy"] = top5 / count
    else:
        metrics["perplexity"] = math.exp(min(loss, 80.0))  # exp(80) already says "not learning"
    return metrics


def mean_over_ranks(
    control: distributed.ControlChannel, metrics: Sequence[tuple[str, float]]
) -> dict[str, float]:
    """A user evaluate hook's numbers, averaged over ranks (every rank must return the same keys)."""
    return {name: control.all_reduce_mean(float(value)) for name, value in metrics}
