"""The Trainer without Ray (``python -m trainop_trainer.launch``, one process): corruption fallback, SIGTERM.

Real processes, real torch.distributed (gloo, world size 1), real files; nothing is mocked.
"""

from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import time

import torch
import trainer_support


def launch(config_path: pathlib.Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [trainer_support.PYTHON, "-m", "trainop_trainer.launch", "--config", str(config_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=trainer_support.subprocess_env(**env),
    )


def run_to_end(config_path: pathlib.Path, *, returncode: int = 0, **env: str) -> str:
    proc = launch(config_path, **env)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == returncode, out
    return out


def test_training_resumes_from_the_previous_checkpoint_when_the_latest_is_truncated(
    tmp_path: pathlib.Path,
) -> None:
    config = trainer_support.mlp_config(
        tmp_path / "a", "fallback", workers=1, max_steps=60, interval_steps=10
    )
    path = trainer_support.write_config(config, tmp_path / "trainer.json")
    # The process dies right after its step-40 checkpoint (the injected failure: os._exit(1)).
    run_to_end(path, returncode=1, TRAINOP_INJECT_FAILURE_AT_STEP="40")
    assert trainer_support.checkpoint_steps(config) == [10, 20, 30, 40]
    data_file = sorted((trainer_support.run_dir(config) / "checkpoints" / "step_40").glob("*.distcp"))[0]
    data_file.write_bytes(data_file.read_bytes()[: data_file.stat().st_size // 2])

    out = run_to_end(path)

    assert "step_40 is unusable" in out and "falling back to the previous checkpoint" in out
    resumes = [e for e in trainer_support.events(config) if e["event"] == "resume"]
    assert [e["step"] for e in resumes] == [30]
    # Continuing from step 30 gives exactly what an uninterrupted run gives.
    straight = config.model_copy(update={"storage_path": str(tmp_path / "b")})
    run_to_end(trainer_support.write_config(straight, tmp_path / "straight.json"))
    resumed, reference = trainer_support.final_model(config, 60), trainer_support.final_model(straight, 60)
    assert resumed.keys() == reference.keys()
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)


def test_sigterm_to_a_training_process_writes_a_checkpoint_at_or_after_the_signal_and_exits_0(
    tmp_path: pathlib.Path,
) -> None:
    config = trainer_support.mlp_config(
        tmp_path,
        "sigterm-launch",
        workers=1,
        max_steps=10_000_000,
        interval_steps=None,
        interval_minutes=1000,
        every_steps=5,
        num_samples=4096,
        batch_size=64,
        hidden_dim=256,
    )
    proc = launch(trainer_support.write_config(config, tmp_path / "trainer.json"))
    observed = 0
    deadline = time.monotonic() + 120
    while observed < 20 and time.monotonic() < deadline and proc.poll() is None:
        observed = trainer_support.status(config).get("progress", {}).get("step", 0)
        time.sleep(0.05)
    assert observed >= 20, "training did not start"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)

    assert proc.returncode == 0, out
    steps = trainer_support.checkpoint_steps(config)
    assert len(steps) == 1 and steps[0] >= observed, (
        steps,
        observed,
    )  # no periodic one: the interval is 1000 min
    outcome = json.loads((trainer_support.run_dir(config) / "trainop" / "outcome.json").read_text())
    assert outcome["outcome"] == "preempted" and outcome["step"] == steps[0]
    assert trainer_support.status(config)["checkpoint"]["step"] == steps[0]


def test_a_run_checkpointed_on_2_ranks_resumes_on_1_rank_at_the_same_step(tmp_path: pathlib.Path) -> None:
    config = trainer_support.mlp_config(tmp_path, "two-to-one", workers=2, max_steps=60, interval_steps=10)
    path = trainer_support.write_config(config, tmp_path / "trainer.json")
    two = trainer_support.run_torchrun(path, timeout=300, TRAINOP_INJECT_FAILURE_AT_STEP="30")
    assert two.returncode != 0 and trainer_support.checkpoint_steps(config)[-1] == 30
    saved = trainer_support.final_model(config, 30)

    out = run_to_end(path)

    resumes = [e for e in trainer_support.events(config) if e["event"] == "resume"]
    assert [e["step"] for e in resumes] == [30]
    assert "world size changed 2 -> 1" in out
    assert trainer_support.checkpoint_steps(config)[-1] == 60
    step_60 = trainer_support.run_dir(config) / "checkpoints" / "step_60"
    manifest = json.loads((step_60 / "manifest.json").read_text())
    assert manifest["worldSize"] == 1
    assert saved.keys() == trainer_support.final_model(config, 60).keys()
