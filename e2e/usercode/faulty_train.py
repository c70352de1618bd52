"""ml-team's training function: the user code of the e2e tier's user image, raising ValueError once on cue.

This file is what a team's own image carries (``e2e/usercode/Dockerfile``: ``FROM`` the trainer image,
``COPY`` of this directory, ``ENV PYTHONPATH``); on the cluster bed the node agent's image map gives the
same (``tests/clusterbed/images.py``, ``USER_IMAGE``). A TrainingJob runs it with ``spec.image`` that image
and ``spec.workload.entrypoint: faulty_train:train``.

It trains a small MLP classifier (``inputDim`` features, ``hiddenDim``, ``numClasses`` labels from a fixed
random teacher; data of step s drawn from (seed, rank, s), so a resumed run sees the same batches) with DDP,
checkpoints whenever the trainer says one is due and resumes from the newest one. Two ways to make it raise
a ``ValueError`` in ``check_batch`` (the frame the trainer names: ``faulty_train.py:<line> (check_batch)``),
each exactly once, so an in-attempt restart from the checkpoint then runs to the end:

- ``failAtStep`` (on rank ``failRank``, default 1) with ``failOnceMarker``, a path on the checkpoint volume:
  raise there only while the marker does not exist, writing it first (the e2e scenario);
- ``raiseWhenFileExists``: a path inside the worker pod (``kubectl exec … touch`` it); the rank that sees
  it first deletes it and raises (bench/faults' ``usercode`` failure). Ranks of other pods never see it.

And one way to run out of memory: ``allocateMiBAtStep`` (on rank ``failRank``) allocates ``allocateMiB``
MiB there, every time it gets there -- more than the worker pod's memory limit, so the kernel's OOM killer
ends the rank's container (the e2e OOM scenario). Should the allocation succeed (no limit below it), it
raises ``RuntimeError`` saying so instead of passing quietly.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch


def check_batch(x: torch.Tensor, step: int, *, fail_at: int, once: str | None, trigger: str | None) -> None:
    """Raise ValueError when asked to (see the module docstring); otherwise do nothing."""
    if trigger is not None:
        try:
            os.remove(trigger)  # the rank whose remove succeeds is the one that raises
        except FileNotFoundError:
            pass
        else:
            raise ValueError(f"bad batch {tuple(x.shape)} at step {step} (trigger {trigger})")
    if step == fail_at and once is not None and not os.path.exists(once):
        with open(once, "w") as f:
            f.write(repr(time.time()))
        raise ValueError(f"bad batch {tuple(x.shape)} at step {step}")


def hog_memory(step: int, *, at: int, mib: int) -> None:
    """At step ``at``, allocate and touch ``mib`` MiB and keep it (see the module docstring)."""
    if step != at:
        return
    held = [bytearray(64 << 20) for _ in range(max(1, mib // 64))]  # zero-filled: every page touched
    raise RuntimeError(
        f"allocated {len(held) * 64} MiB at step {step} and was not killed: no memory limit below that"
    )


def train(ctx: Any) -> None:
    config = ctx.config
    input_dim = int(config.get("inputDim", 16))
    hidden_dim = int(config.get("hiddenDim", 64))
    num_classes = int(config.get("numClasses", 10))
    batch = int(config.get("batchSize", 32))
    fail_at = int(config.get("failAtStep", -1))
    fail_rank = int(config.get("failRank", 1))
    once = config.get("failOnceMarker")
    trigger = config.get("raiseWhenFileExists")
    hog_at = int(config.get("allocateMiBAtStep", -1)) if ctx.rank == fail_rank else -1
    hog_mib = int(config.get("allocateMiB", 0))
    seed = ctx.hyperparameters.seed
    total_steps = ctx.total_steps or 1000

    torch.manual_seed(seed)
    teacher = torch.randn(input_dim, num_classes, generator=torch.Generator().manual_seed(seed))
    model = ctx.prepare_model(
        torch.nn.Sequential(
            torch.nn.Linear(input_dim, hidden_dim),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden_dim, num_classes),
        )
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=ctx.hyperparameters.learning_rate, momentum=0.9)
    start = 0
    restored = ctx.load_checkpoint()
    if restored is not None:
        model.module.load_state_dict(restored.state["model"])
        optimizer.load_state_dict(restored.state["optimizer"])
        start = restored.step
    generator = torch.Generator()
    for step in range(start + 1, total_steps + 1):
        generator.manual_seed((seed * 1_000_003 + ctx.rank) * 1_000_003 + step)
        x = torch.randn(batch, input_dim, generator=generator)
        check_batch(
            x,
            step,
            fail_at=fail_at if ctx.rank == fail_rank else -1,
            once=once,
            trigger=trigger,
        )
        hog_memory(step, at=hog_at, mib=hog_mib)
        loss = torch.nn.functional.cross_entropy(model(x), (x @ teacher).argmax(dim=1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        ctx.step_done(step, loss=loss.detach(), samples=batch)
        if ctx.checkpoint_due:
            ctx.save_checkpoint(
                {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, step=step
            )
        if ctx.should_stop:
            return
