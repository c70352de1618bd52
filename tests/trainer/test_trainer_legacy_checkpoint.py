"""Read compatibility: a job whose checkpoints the previous trainer wrote (format 1) resumes on this one.

``data/legacy_v1`` holds steps 20 and 30 of the 2-rank MLP job, written by the trainer before the switch to
torch.distributed.checkpoint (its README says how). The resumed run must end where an uninterrupted run of
this trainer ends: the old files carry the same model, optimizer, schedule, position and RNG states. Real
torchrun processes, gloo on CPU.

Bitwise equality to the uninterrupted run holds only on a CPU that computes float32 as the one that wrote
the files did: on the CI machine of 2026-11-27 (another Xeon, AVX-512) the uninterrupted run's own step 30
differs from the files' in the last bits (at most 6e-8), and so does everything after. The comparison with
the uninterrupted run is therefore within 1e-6 (a wrong optimizer state, schedule, data position or RNG
stream moves the weights by 1e-2 and more), and exactness is checked where it is machine-independent: two
resumes from the same old files end bitwise equal.
"""

from __future__ import annotations

import pathlib
import shutil

import torch
import trainer_support

LEGACY = pathlib.Path(__file__).with_name("data") / "legacy_v1" / "checkpoints"
# Float32 rounding between CPUs over 30 steps of the MLP, with room to spare (measured: 6e-8).
ACROSS_CPUS = 1e-6


def train(config_path: pathlib.Path) -> str:
    done = trainer_support.run_torchrun(config_path, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done.stdout + done.stderr


def test_a_format_1_checkpoint_of_the_old_trainer_resumes_bitwise_exactly(tmp_path: pathlib.Path) -> None:
    # The fixture's job: the same config the previous trainer ran (README of data/legacy_v1).
    config = trainer_support.mlp_config(tmp_path / "resumed", "legacy-v1", max_steps=60, interval_steps=10)
    shutil.copytree(LEGACY, trainer_support.run_dir(config) / "checkpoints")
    train(trainer_support.write_config(config, tmp_path / "resumed.json"))

    resumes = [e for e in trainer_support.events(config) if e["event"] == "resume"]
    assert [e["step"] for e in resumes] == [30]
    checkpoints = trainer_support.run_dir(config) / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == [f"step_{s}" for s in (20, 30, 40, 50, 60)]
    assert not (checkpoints / "step_40" / "model.pt").exists()  # new checkpoints are DCP ones

    again = config.model_copy(update={"storage_path": str(tmp_path / "again")})
    shutil.copytree(LEGACY, trainer_support.run_dir(again) / "checkpoints")
    train(trainer_support.write_config(again, tmp_path / "again.json"))
    straight = config.model_copy(update={"storage_path": str(tmp_path / "straight")})
    train(trainer_support.write_config(straight, tmp_path / "straight.json"))

    resumed, reference = trainer_support.final_model(config, 60), trainer_support.final_model(straight, 60)
    assert resumed.keys() == reference.keys()
    repeat = trainer_support.final_model(again, 60)
    assert all(torch.equal(resumed[k], repeat[k]) for k in reference)  # the old files load exactly, each time
    assert all(torch.allclose(resumed[k], reference[k], rtol=0, atol=ACROSS_CPUS) for k in reference), {
        k: float((resumed[k] - reference[k]).abs().max()) for k in reference
    }
