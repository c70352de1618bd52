"""A user entrypoint for the failure tests: trains y = 3x - 1 with DDP and raises at ``failAtStep``.

``ctx.config``: ``failAtStep`` (raise ``ValueError`` there, on rank ``failRank``, in every worker group),
``failOnceMarker`` (a path: raise only while it does not exist, writing the time into it first),
``stepSeconds`` (sleep that long in every step: a slow step, for tests that act in the middle). Data
of step s is drawn from (seed, rank, s), so resumed runs see the same batches.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

from trainop_trainer.user import Context


def check_shape(x: torch.Tensor, step: int, fail_at: int, once: str | None = None) -> None:
    if step == fail_at:
        if once is not None:
            if os.path.exists(once):
                return
            with open(once, "w") as f:
                f.write(repr(time.time()))
        raise ValueError(f"bad shape {tuple(x.shape)} at step {step}")


def train(ctx: Context) -> None:
    fail_at = int(ctx.config.get("failAtStep", -1))
    fail_rank = int(ctx.config.get("failRank", 1))

    def before_step(step: int, x: torch.Tensor) -> None:
        if ctx.rank == fail_rank:
            check_shape(x, step, fail_at, ctx.config.get("failOnceMarker"))

    fit_line(ctx, before_step, step_seconds=float(ctx.config.get("stepSeconds", 0.0)))


def fit_line(
    ctx: Context, before_step: Callable[[int, torch.Tensor], None], *, step_seconds: float = 0.0
) -> None:
    """Fit y = 3x - 1 from the newest checkpoint on, calling ``before_step(step, batch)`` before each step
    (the place a test entrypoint fails or waits)."""
    total_steps = ctx.total_steps or 40
    torch.manual_seed(ctx.hyperparameters.seed)
    model = ctx.prepare_model(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=ctx.hyperparameters.learning_rate)
    start = 0
    restored = ctx.load_checkpoint()
    if restored is not None:
        model.module.load_state_dict(restored.state["model"])
        optimizer.load_state_dict(restored.state["optimizer"])
        start = restored.step
    generator = torch.Generator()
    for step in range(start + 1, total_steps + 1):
        generator.manual_seed((ctx.hyperparameters.seed * 1_000_003 + ctx.rank) * 1_000_003 + step)
        x = torch.randn(16, 1, generator=generator)
        before_step(step, x)
        loss = torch.nn.functional.mse_loss(model(x), 3.0 * x - 1.0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        time.sleep(step_seconds)
        ctx.step_done(step, loss=loss.detach(), samples=16)
        if ctx.checkpoint_due:
            ctx.save_checkpoint(
                {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, step=step
            )
        if ctx.should_stop:
            return
