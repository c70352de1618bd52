"""``spec.workload.entrypoint: "trainop_example.regression:train"``: fit y = slope * x + bias with DDP.

Shows every service of the trainer's context: ``ctx.config`` (``slope``, ``bias``, ``batchSize``),
``ctx.prepare_model``, ``ctx.load_checkpoint`` / ``ctx.save_checkpoint``, ``ctx.step_done`` (metrics,
progress, and the ``checkpoint_due`` / ``should_stop`` decisions), and ``ctx.on_evaluate`` (the mean
squared error on a fixed held-out set, at the steps ``spec.evaluation`` names). Each step's data is drawn
from a generator seeded by (seed, rank, step), so a resumed run sees exactly the batches an uninterrupted
one would.
"""

from __future__ import annotations

import torch

from trainop_trainer.user import Context


def train(ctx: Context) -> None:
    slope = float(ctx.config.get("slope", 2.0))
    bias = float(ctx.config.get("bias", 0.5))
    batch_size = int(ctx.config.get("batchSize", ctx.hyperparameters.batch_size_per_worker))
    total_steps = ctx.total_steps or 200

    torch.manual_seed(ctx.hyperparameters.seed)
    model = ctx.prepare_model(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=ctx.hyperparameters.learning_rate)
    start = 0
    restored = ctx.load_checkpoint()
    if restored is not None:
        model.module.load_state_dict(restored.state["model"])
        optimizer.load_state_dict(restored.state["optimizer"])
        start = restored.step

    # A fixed held-out set, this rank's share of it: drawn from its own generator, so evaluating never
    # changes the training data.
    held_out = torch.Generator().manual_seed(12345 + ctx.rank)
    eval_x = torch.randn(256, 1, generator=held_out).to(ctx.device)
    eval_y = slope * eval_x + bias

    def evaluate() -> dict[str, float]:
        with torch.no_grad():
            return {"loss": float(torch.nn.functional.mse_loss(model.module(eval_x), eval_y))}

    ctx.on_evaluate(evaluate)

    generator = torch.Generator()
    for step in range(start + 1, total_steps + 1):
        generator.manual_seed((ctx.hyperparameters.seed * 1_000_003 + ctx.rank) * 1_000_003 + step)
        x = torch.randn(batch_size, 1, generator=generator).to(ctx.device)
        y = slope * x + bias
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

        ctx.step_done(step, loss=loss.detach(), samples=batch_size)
        if ctx.checkpoint_due:
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
            ctx.save_checkpoint(state, step=step)
        if ctx.should_stop:
            return
