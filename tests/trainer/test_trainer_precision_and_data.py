"""The trainer paths every other test leaves out (they all run fp32, one micro-batch per step, synthetic
data): fp16 with its GradScaler, gradient accumulation, and ``imagefolder`` datasets -- each under the real
launcher (``python -m trainop_trainer.launch``, torch.distributed with gloo), on CPU.

fp16 runs on CPU because the launcher trains on CPU whenever CUDA is absent, whatever ``gpusPerWorker``
says, and torch's CPU autocast and GradScaler support float16; a spec asking for fp16 must ask for GPUs
(the API refuses fp16 with ``gpusPerWorker: 0``), so the job here asks for one and gets the CPU. The
GPU run of the same path is bench/gpu's (docs/benchmarks-gpu.md).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
from typing import Any

import numpy as np
import pytest
import torch
import trainer_support

from trainop.api import trainer_config

pytestmark = pytest.mark.slow


def _variant(config: trainer_config.TrainerConfig, **spec: Any) -> trainer_config.TrainerConfig:
    """``config`` with top-level spec fields replaced (nested dicts merged one level), validated again."""
    wire = json.loads(trainer_config.dumps(config))
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(wire["spec"].get(key), dict):
            wire["spec"][key] = {**wire["spec"][key], **value}
        else:
            wire["spec"][key] = value
    return trainer_config.TrainerConfig.model_validate(wire, by_alias=True, by_name=False)


def _launch(config: trainer_config.TrainerConfig, tmp_path: pathlib.Path) -> subprocess.CompletedProcess[str]:
    path = trainer_support.write_config(config, tmp_path / f"{config.run_name}.json")
    return subprocess.run(
        [trainer_support.PYTHON, "-m", "trainop_trainer.launch", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=trainer_support.subprocess_env(CUDA_VISIBLE_DEVICES=""),
    )


def _train_state(config: trainer_config.TrainerConfig, step: int) -> dict[str, Any]:
    """The loop's counters and the GradScaler's state in the checkpoint of ``step`` (DCP parts)."""
    try:
        scaler = trainer_support.checkpoint_part(config, step, "grad_scaler")
    except KeyError:  # a disabled GradScaler's state is {}: DCP stores no entry for an empty dict
        scaler = {}
    return {"step": trainer_support.checkpoint_part(config, step, "train_state")["step"], "scaler": scaler}


def test_fp16_trains_with_a_grad_scaler_whose_state_is_checkpointed(tmp_path: pathlib.Path) -> None:
    base = trainer_support.mlp_config(
        tmp_path, "fp16", workers=1, max_steps=6, interval_steps=3, every_steps=3
    )
    job = _variant(base, precision="fp16", workers={"gpusPerWorker": 1})
    done = _launch(job, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert trainer_support.checkpoint_steps(job) == [3, 6]
    scaler = _train_state(job, 6)["scaler"]
    # An enabled GradScaler checkpoints its scale and growth tracker; fp32 and bf16 checkpoint {}.
    assert scaler["scale"] > 1.0 and "_growth_tracker" in scaler, scaler
    assert np.isfinite(trainer_support.status(job)["progress"]["loss"])
    fp32 = _train_state(_fp32_reference(tmp_path), 3)["scaler"]
    assert fp32 == {}


def _fp32_reference(tmp_path: pathlib.Path) -> trainer_config.TrainerConfig:
    job = trainer_support.mlp_config(tmp_path, "fp32", workers=1, max_steps=3, interval_steps=3)
    done = _launch(job, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    return job


def test_gradient_accumulation_makes_the_same_steps_as_one_batch_of_all_its_micro_batches(
    tmp_path: pathlib.Path,
) -> None:
    """Two micro-batches of 8 accumulated are one optimizer step over the same 16 samples: the weights
    after 8 steps match a run with batches of 16 (fp32, gloo, the same seed and sample order)."""
    steps = 8
    no_clip = {"gradientClipNorm": None}  # clipping to norm 1 could hide a gradient off by a constant factor
    accumulated = _variant(
        trainer_support.mlp_config(
            tmp_path, "accum-2", workers=1, max_steps=steps, interval_steps=steps, batch_size=8
        ),
        hyperparameters={"gradientAccumulationSteps": 2, **no_clip},
    )
    whole = _variant(
        trainer_support.mlp_config(
            tmp_path, "accum-1", workers=1, max_steps=steps, interval_steps=steps, batch_size=16
        ),
        hyperparameters=no_clip,
    )
    for job in (accumulated, whole):
        done = _launch(job, tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
    a, b = trainer_support.final_model(accumulated, steps), trainer_support.final_model(whole, steps)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-6, msg=name)
    assert _train_state(accumulated, steps)["step"] == _train_state(whole, steps)["step"] == steps


def _image_folder(root: pathlib.Path, classes: int, per_class: int) -> pathlib.Path:
    from PIL import Image

    rng = np.random.default_rng(3)
    for label in range(classes):
        folder = root / f"class_{label}"
        folder.mkdir(parents=True)
        for index in range(per_class):
            pixels = rng.integers(0, 256, size=(40, 48, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{index}.png")
    return root


def test_an_imagefolder_dataset_is_read_from_its_class_folders_and_trained_on(tmp_path: pathlib.Path) -> None:
    root = _image_folder(tmp_path / "images", classes=3, per_class=8)
    workload = {
        "model": "resnet18",
        "dataset": {
            "kind": "imagefolder",
            "path": str(root),
            "imageSize": 32,
            "numClasses": 3,
            "numWorkers": 0,
        },
    }
    job = trainer_support.mlp_config(
        tmp_path,
        "folder",
        workers=1,
        max_steps=4,
        interval_steps=2,
        every_steps=2,
        batch_size=4,
        workload=workload,
    )
    done = _launch(job, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert trainer_support.checkpoint_steps(job) == [2, 4]
    progress = trainer_support.status(job)["progress"]
    assert progress["step"] == 4 and np.isfinite(progress["loss"])
    assert trainer_support.final_model(job, 4)["fc.weight"].shape == (3, 512)  # numClasses reached the model


def test_an_imagefolder_path_that_is_not_a_directory_names_the_field(tmp_path: pathlib.Path) -> None:
    workload = {
        "model": "resnet18",
        "dataset": {"kind": "imagefolder", "path": str(tmp_path / "nope"), "imageSize": 32, "numWorkers": 0},
    }
    job = trainer_support.mlp_config(tmp_path, "missing", workers=1, max_steps=2, workload=workload)
    done = _launch(job, tmp_path)
    assert done.returncode != 0
    assert "spec.workload.dataset.path" in done.stdout + done.stderr
    assert "is not a directory of class folders" in done.stdout + done.stderr
