"""The failure injector: kill one worker once per run, after a checkpoint (the demo's and tests' knob).

``TRAINOP_INJECT_FAILURE_AT_STEP=N`` (or ``inject_failure_at_step=`` in local mode and ``ray_train.run``)
makes the last rank ``os._exit(1)`` once: at step N if a checkpoint is already committed, otherwise right
after the next checkpoint. Every rank evaluates the same steps (N, then checkpoint steps), so the ranks agree
without extra messages; rank 0 decides, after waiting for the checkpoint in flight to be committed (the
restarted group must find it), and a marker file on the volume makes it happen once per run, also across the
restart that follows.

It must not decide anything else: it reads the newest committed checkpoint step from whoever writes them.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Protocol

from trainop_trainer import distributed, storage

log = logging.getLogger(__name__)


class CommittedCheckpoints(Protocol):
    def wait(self) -> object:
        """Block until the checkpoint in flight (if any) is committed."""
        ...

    @property
    def last_step(self) -> int | None:
        """The newest checkpoint step this worker saved or resumed from."""
        ...


class FailureInjector:
    def __init__(
        self,
        *,
        at_step: int | None,
        ctx: distributed.WorkerContext,
        control: distributed.ControlChannel,
        marker: storage.RunDir,
        checkpoints: CommittedCheckpoints,
    ) -> None:
        self._at_step = at_step
        self._ctx = ctx
        self._control = control
        self._marker = marker
        self._checkpoints = checkpoints
        self._settled = at_step is None

    def after_step(self, step: int, *, checkpointed_now: bool) -> None:
        """Call on every rank after each step (and after each checkpoint with ``checkpointed_now``)."""
        at = self._at_step
        if self._settled or at is None or step < at or (step > at and not checkpointed_now):
            return
        verdict = "wait"  # no checkpoint yet: look again at the next checkpoint
        newest: int | None = None
        if self._ctx.is_rank0:
            self._checkpoints.wait()  # the checkpoint we resume from must be committed before anyone dies
            newest = self._checkpoints.last_step
            if self._marker.exists():
                verdict = "done"
            elif newest is not None:
                verdict = "kill"
                storage.write_text(self._marker, f"killed rank {self._ctx.world_size - 1} at step {step}\n")
        verdict, newest = self._control.broadcast_object((verdict, newest))
        if verdict == "wait":
            return
        self._settled = True
        victim = self._ctx.world_size - 1
        if verdict == "kill" and self._ctx.rank == victim:
            log.warning(
                "trainop: injected failure: rank %d exits at step %d (newest checkpoint: step %s); Ray Train "
                "restarts the worker group, which resumes from that checkpoint",
                victim,
                step,
                newest,
            )
            sys.stderr.flush()
            os._exit(1)
