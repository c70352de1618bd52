"""User entrypoints for the sweep restart tests: trials whose progress waits on files, not on timing.

Both fit y = 3x - 1 with DDP (``faulty_entrypoint.fit_line``; one worker is enough) and read ``ctx.config``:

- ``gateDir``: a directory the test owns.
- ``trialsRoot``: the sweep's ``<experiment>/trials``, where each trial's ``status.json`` names its newest
  checkpoint once the trainer has committed it.

``hold_after_checkpoint`` trains to its first checkpoint, waits until that checkpoint is recorded, creates
``<gateDir>/holding`` and waits for ``<gateDir>/release`` before its next step: until the test releases it,
it is surely running, with a checkpoint to resume from. A run started after the release does not hold.
``fail_once`` raises ``ValueError`` before its first step once ``<gateDir>/holding`` exists, and only
while ``<gateDir>/failed`` does not (it creates that file as it raises): it fails in one attempt and
succeeds in the next. Each step's data is drawn from (seed, rank, step), so a resumed run sees the batches
an uninterrupted one would.
"""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Callable

import torch

from tests.trainer.faulty_entrypoint import fit_line
from trainop_trainer.user import Context

POLL_S = 0.1
# A gate that never opens is a failed test, not a hang until the tier's timeout.
GATE_TIMEOUT_S = 300.0


def _checkpoint_recorded(trials_root: pathlib.Path) -> bool:
    for status_file in trials_root.glob("*/status.json"):
        try:
            if json.loads(status_file.read_text()).get("checkpoint", {}).get("path"):
                return True
        except (OSError, ValueError):
            continue
    return False


def _wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gated sweep test waited {GATE_TIMEOUT_S:.0f} s for {what}")
        time.sleep(POLL_S)


def fail_once(ctx: Context) -> None:
    gate = pathlib.Path(ctx.config["gateDir"])

    def before_step(step: int, _: torch.Tensor) -> None:
        if step != 1 or (gate / "failed").exists():
            return
        _wait_for((gate / "holding").exists, "the other trial to hold")
        (gate / "failed").write_text(repr(time.time()))
        raise ValueError("the gated sweep test's failure")

    fit_line(ctx, before_step)


def hold_after_checkpoint(ctx: Context) -> None:
    gate = pathlib.Path(ctx.config["gateDir"])
    trials_root = pathlib.Path(ctx.config["trialsRoot"])
    hold_at = (ctx.spec.checkpoint.interval_steps or 0) + 1

    def before_step(step: int, _: torch.Tensor) -> None:
        if step != hold_at or (gate / "release").exists():
            return
        _wait_for(lambda: _checkpoint_recorded(trials_root), "its checkpoint to be recorded")
        (gate / "holding").touch()
        _wait_for((gate / "release").exists, "the test to release it")

    fit_line(ctx, before_step)
