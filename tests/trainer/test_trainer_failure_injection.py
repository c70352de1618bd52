"""The failure injector: one worker dies once, only after a checkpoint is committed, never twice per run.

The victim is a real process (``os._exit(1)``) run with world size 1, where rank 0 is also the last rank.
The checkpoint side is a small in-test stand-in for the committed-checkpoint interface (a step number and
a wait that returns at once), declared here because only that interface matters to the injector.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

import trainer_support

SCRIPT = textwrap.dedent(
    """
    import pathlib, sys, torch
    from trainop_trainer import distributed
    from trainop_trainer.failure_injection import FailureInjector

    class Checkpoints:
        last_step = None
        def wait(self):
            return None

    ctx = distributed.WorkerContext(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
                                    device=torch.device("cpu"), backend="gloo")
    checkpoints = Checkpoints()
    injector = FailureInjector(at_step=int(sys.argv[2]), ctx=ctx, control=distributed.ControlChannel(ctx),
                               marker=pathlib.Path(sys.argv[1]), checkpoints=checkpoints)
    for step in range(1, 40):
        checkpointed = step % 10 == 0
        if checkpointed:
            checkpoints.last_step = step
        injector.after_step(step, checkpointed_now=checkpointed)
        print("survived", step, flush=True)
    """
)


def run(marker: pathlib.Path, at_step: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(marker), str(at_step)],
        capture_output=True,
        text=True,
        timeout=120,
        env=trainer_support.subprocess_env(),
    )


def test_without_a_checkpoint_yet_the_worker_dies_right_after_the_next_one(tmp_path: pathlib.Path) -> None:
    done = run(tmp_path / "marker", at_step=5)
    assert done.returncode == 1
    assert done.stdout.split()[-1] == "9"  # step 10 checkpointed, then the process died
    assert "injected failure: rank 0 exits at step 10 (newest checkpoint: step 10)" in done.stderr


def test_with_a_committed_checkpoint_the_worker_dies_at_the_step_asked(tmp_path: pathlib.Path) -> None:
    done = run(tmp_path / "marker", at_step=24)
    assert done.returncode == 1
    assert "exits at step 24 (newest checkpoint: step 20)" in done.stderr


def test_it_happens_once_per_run_also_across_the_restart(tmp_path: pathlib.Path) -> None:
    marker = tmp_path / "marker"
    assert run(marker, at_step=24).returncode == 1
    assert marker.read_text() == "killed rank 0 at step 24\n"
    again = run(marker, at_step=24)
    assert again.returncode == 0, again.stderr
    assert again.stdout.split()[-1] == "39"
