"""``python -m trainop_trainer.launch`` and a stop request left behind by an earlier run.

A driver that received Ctrl+C or SIGTERM writes ``<run>/trainop/stop-requested``; the request belongs to
that launch. A later launch must clear it before training (as ``ray_train.run`` does), not checkpoint after
its first step and stop. A real process (gloo, world size 1) on real files; nothing is mocked.
"""

from __future__ import annotations

import pathlib

import trainer_support

from trainop_trainer import config as config_module


def test_a_stale_stop_request_does_not_stop_a_new_launch(tmp_path: pathlib.Path) -> None:
    config = trainer_support.mlp_config(tmp_path, "stale-stop", workers=1, max_steps=20, interval_steps=10)
    stop_file = pathlib.Path(config_module.paths_for(config).stop_file)
    stop_file.parent.mkdir(parents=True)
    stop_file.write_text("signal 2 at 0\n")  # what preempt.install_driver_handler wrote on an earlier Ctrl+C

    run = trainer_support.launch_one(config, tmp_path / "trainer.json")

    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "training completed at step 20 of 20" in out, out
    assert trainer_support.checkpoint_steps(config) == [10, 20]
    assert not stop_file.exists()


def test_a_bad_injected_failure_step_is_one_line_and_exit_2(tmp_path: pathlib.Path) -> None:
    """The launch reads $TRAINOP_INJECT_FAILURE_AT_STEP before any rank trains: a value that is not a step is
    one sentence naming the variable, exit 2, no traceback and no checkpoint."""
    config = trainer_support.mlp_config(tmp_path, "bad-inject", workers=1, max_steps=20, interval_steps=10)
    run = trainer_support.launch_one(
        config, tmp_path / "trainer.json", **{config_module.INJECT_FAILURE_ENV: "abc"}
    )

    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert run.stderr.strip().splitlines()[-1] == (
        "trainop: error: TRAINOP_INJECT_FAILURE_AT_STEP must be a step number >= 1, got 'abc'; fix it, or "
        "unset it to inject no failure"
    )
    assert trainer_support.checkpoint_steps(config) == []
