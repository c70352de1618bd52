"""Checkpoint overhead on CPU: training time with a checkpoint every 30 s against none (2 ranks, gloo).

    .venv/bin/python bench/cpu/checkpoint_overhead.py [--seconds 90]

Re-runs itself under ``torch.distributed.run`` with 2 processes and trains ResNet-18 (64 px synthetic
images, batch 16 per rank, SGD with momentum: a ~90 MB checkpoint) twice for the same number of steps: with
``checkpoint.intervalMinutes: 0.5`` and with no periodic checkpoint. Reported: the loop time of both runs and
their difference as % of training time, and per checkpoint the stall on the training thread (staging: a copy
of every part's state, RNG included) and the background write time (DCP write on every rank, commit, prune).
The step count is calibrated first so that a run lasts about ``--seconds``; the two settings run twice,
alternating, and the means are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any


def spec_for(steps: int, *, interval_minutes: float) -> dict[str, Any]:
    return {
        "workload": {
            "model": "resnet18",
            "dataset": {
                "kind": "synthetic",
                "numSamples": 8192,
                "imageSize": 64,
                "numClasses": 100,
                "numWorkers": 0,
            },
        },
        "hyperparameters": {"maxSteps": steps, "batchSizePerWorker": 16, "learningRate": 0.01, "seed": 1},
        "precision": "fp32",
        "workers": {"replicas": 2, "gpusPerWorker": 0, "cpusPerWorker": 1},
        "checkpoint": {"intervalMinutes": interval_minutes, "keepLast": 2},
        "network": {"profile": "tcp", "probe": False},
        "reporting": {"everySteps": 50, "everySeconds": 15, "metricsPort": 20000 + os.getpid() % 20000},
    }


def run(ctx: Any, storage: str, steps: int, interval_minutes: float) -> dict[str, float]:
    from trainop.api import trainer_config
    from trainop_trainer import checkpoint_store, metrics, workloads
    from trainop_trainer import config as config_module
    from trainop_trainer.runtime import Runtime
    from trainop_trainer.trainer import Trainer

    job = f"ckpt-{uuid.uuid4().hex[:6]}"
    config = trainer_config.TrainerConfig.model_validate(
        {
            "jobName": job,
            "runName": job,
            "storagePath": storage,
            "spec": spec_for(steps, interval_minutes=interval_minutes),
        },
        by_alias=True,
    )
    launch = config_module.LaunchSettings(config_json=config_module.dumps(config), launch_id=uuid.uuid4().hex)
    runtime = Runtime.start(config=config, ctx=ctx, launch=launch, report_fn=None)
    stalls: list[float] = []
    save, wait_for_staging = runtime.checkpointer.save, runtime.checkpointer.wait_for_staging

    # The training thread's share: issuing the save (staging on CPU) plus any wait for the staging later.
    def timed_save(**kwargs: Any) -> None:
        start = time.perf_counter()
        save(**kwargs)
        stalls.append(time.perf_counter() - start)

    def timed_wait_for_staging() -> None:
        start = time.perf_counter()
        wait_for_staging()
        if stalls:
            stalls[-1] += time.perf_counter() - start

    runtime.checkpointer.save = timed_save  # type: ignore[method-assign]
    runtime.checkpointer.wait_for_staging = timed_wait_for_staging  # type: ignore[method-assign]
    trainer = Trainer(runtime=runtime, workload=workloads.build(config.spec))
    try:
        trainer.train()
    finally:
        runtime.close()
    labels = {"job": job, "rank": str(ctx.rank)}

    def sample(name: str) -> float:
        return float(metrics.REGISTRY.get_sample_value(name, labels) or 0.0)

    store = checkpoint_store.CheckpointStore(pathlib.Path(storage) / job / "checkpoints")
    newest = store.committed_steps()[:1]
    size = sum(f.stat().st_size for f in store.step_path(newest[0]).iterdir()) if newest else 0
    # The last stall is the final checkpoint after the loop (not part of the loop time).
    writes = sample("trainop_trainer_checkpoint_save_seconds_count")
    return {
        "loop_seconds": sample("trainop_trainer_step_seconds_sum"),
        "checkpoints_in_loop": len(stalls) - 1,
        "stall_seconds_each": sum(stalls[:-1]) / max(1, len(stalls) - 1),
        "write_seconds_each": sample("trainop_trainer_checkpoint_save_seconds_sum") / max(1.0, writes),
        "checkpoint_megabytes": size / 1e6,
    }


def worker(seconds: float) -> None:
    import torch

    from trainop_trainer import distributed

    torch.set_num_threads(1)
    ctx = distributed.from_torchrun_env(use_gpu=False)
    with tempfile.TemporaryDirectory() as storage:
        run(ctx, storage, 10, 1440)  # warm-up (allocator, first-step costs)
        calibration = run(ctx, storage, 30, 1440)
        per_step = calibration["loop_seconds"] / 30
        steps = max(50, int(seconds / per_step))
        # Alternate the two settings so that load from other processes hits both alike.
        runs = [run(ctx, storage, steps, minutes) for minutes in (0.5, 1440, 0.5, 1440)]
    if ctx.rank == 0:
        with_ckpt = {key: (runs[0][key] + runs[2][key]) / 2 for key in runs[0]}
        without = {key: (runs[1][key] + runs[3][key]) / 2 for key in runs[1]}
        print("RESULT " + json.dumps({"steps": steps, "with": with_ckpt, "without": without}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=90.0)
    args = parser.parse_args()
    if "RANK" in os.environ:
        worker(args.seconds)
        return 0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(pathlib.Path(__file__).resolve()),
        "--seconds",
        str(args.seconds),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        print(done.stdout[-4000:], done.stderr[-4000:], file=sys.stderr)
        return 1
    result = json.loads(lines[-1][len("RESULT ") :])
    w, wo = result["with"], result["without"]
    overhead = 100 * (w["loop_seconds"] - wo["loop_seconds"]) / wo["loop_seconds"]
    stall_share = 100 * w["checkpoints_in_loop"] * w["stall_seconds_each"] / w["loop_seconds"]
    print(f"steps per run:                  {result['steps']}")
    print(
        f"loop time, checkpoint every 30s: {w['loop_seconds']:.1f} s ({w['checkpoints_in_loop']} checkpoints)"
    )
    print(f"loop time, no checkpoints:       {wo['loop_seconds']:.1f} s")
    print(f"overhead (difference):           {overhead:+.2f} % of training time")
    print(
        f"stall on the training thread:    {w['stall_seconds_each'] * 1e3:.0f} ms per checkpoint "
        f"({stall_share:.2f} % of training time)"
    )
    print(
        f"background write:                {w['write_seconds_each']:.2f} s per checkpoint of "
        f"{w['checkpoint_megabytes']:.0f} MB"
    )
    print(f"(raw: {json.dumps(result)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
