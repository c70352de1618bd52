"""CPU step time of the trainop Trainer against a bare DDP loop of the same model (2 ranks, gloo).

    .venv/bin/python bench/cpu/step_time.py [--steps 1500] [--repeats 3]

Re-runs itself under ``torch.distributed.run`` with 2 processes. Both loops train the same model on the same
data with the same DDP settings, optimizer (SGD + momentum), LR schedule and DataLoader; the bare loop has
nothing else, the Trainer has everything it always has (the per-step control exchange, loss accumulation,
step-time histogram, report and checkpoint decisions, status at ``reporting.everySteps``). Timing is the
wall time of the training loop (start-up, restore and the final checkpoint excluded), alternating the two
loops ``--repeats`` times in the same processes; the median per-step time is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

CASES = {
    # The demo's model: tiny steps, so any per-step overhead of the loop shows.
    "mlp-small (in 32, hidden 128, batch 64)": {
        "inputDim": 32,
        "hiddenDim": 128,
        "numLayers": 2,
        "batch": 64,
    },
    # A heavier MLP: milliseconds of compute per step.
    "mlp-large (in 256, hidden 1024 x3, batch 256)": {
        "inputDim": 256,
        "hiddenDim": 1024,
        "numLayers": 3,
        "batch": 256,
    },
}


def spec_for(case: dict[str, Any], steps: int) -> dict[str, Any]:
    return {
        "workload": {
            "model": "mlp",
            "config": {k: case[k] for k in ("inputDim", "hiddenDim", "numLayers")},
            "dataset": {"kind": "synthetic", "numSamples": 65536, "numClasses": 10, "numWorkers": 0},
        },
        "hyperparameters": {
            "maxSteps": steps,
            "batchSizePerWorker": case["batch"],
            "learningRate": 0.01,
            "seed": 1,
        },
        "precision": "fp32",
        "workers": {"replicas": 2, "gpusPerWorker": 0, "cpusPerWorker": 1},
        "checkpoint": {"intervalMinutes": 1440},
        "network": {"profile": "tcp", "probe": False},
        "reporting": {"everySteps": 50, "everySeconds": 15, "metricsPort": 20000 + os.getpid() % 20000},
    }


def time_bare(spec: Any, ctx: Any) -> float:
    """Seconds for ``maxSteps`` steps of a plain DDP loop."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from trainop_trainer import data, schedule, workloads

    workload = workloads.build(spec)
    model = DistributedDataParallel(workload.model, gradient_as_bucket_view=True)
    hp = spec.hyperparameters
    optimizer = torch.optim.SGD(model.parameters(), lr=hp.learning_rate, momentum=hp.momentum)
    steps = hp.max_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, schedule.LearningRateSchedule(kind="cosine", total_steps=steps)
    )
    sampler = data.ResumableDistributedSampler(
        workload.dataset, num_replicas=ctx.world_size, rank=ctx.rank, seed=1
    )
    loader = data.make_loader(
        workload.dataset, sampler, batch_size=hp.batch_size_per_worker, num_workers=0, pin_memory=False
    )
    done, epoch = 0, 0
    start = time.perf_counter()
    while done < steps:
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = workload.loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            scheduler.step()
            done += 1
            if done == steps:
                break
        epoch += 1
    return time.perf_counter() - start


def time_trainer(spec_dict: dict[str, Any], ctx: Any, storage: str, job: str) -> float:
    """Seconds of the Trainer's loop for ``maxSteps`` steps (its own step-time histogram, summed)."""
    import uuid

    from trainop.api import trainer_config
    from trainop_trainer import config as config_module
    from trainop_trainer import metrics, workloads
    from trainop_trainer.runtime import Runtime
    from trainop_trainer.trainer import Trainer

    config = trainer_config.TrainerConfig.model_validate(
        {"jobName": job, "runName": job, "storagePath": storage, "spec": spec_dict}, by_alias=True
    )
    launch = config_module.LaunchSettings(config_json=config_module.dumps(config), launch_id=uuid.uuid4().hex)
    runtime = Runtime.start(config=config, ctx=ctx, launch=launch, report_fn=None)
    try:
        Trainer(runtime=runtime, workload=workloads.build(config.spec)).train()
    finally:
        runtime.close()
    labels = {"job": job, "rank": str(ctx.rank)}
    return float(metrics.REGISTRY.get_sample_value("trainop_trainer_step_seconds_sum", labels) or 0.0)


def worker(steps: int, repeats: int) -> None:
    import torch

    from trainop.api import trainingjob
    from trainop_trainer import distributed

    torch.set_num_threads(1)
    ctx = distributed.from_torchrun_env(use_gpu=False)
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as storage:
        for name, case in CASES.items():
            spec_dict = spec_for(case, steps)
            spec = trainingjob.TrainingJobSpec.model_validate(spec_dict, by_alias=True)
            runs: dict[str, list[float]] = {"bare": [], "trainer": []}
            for repeat in range(repeats):
                runs["bare"].append(time_bare(spec, ctx) / steps)
                job = f"bench-{len(results)}-{repeat}"
                runs["trainer"].append(time_trainer(spec_dict, ctx, storage, job) / steps)
            results[name] = runs
    if ctx.rank == 0:
        print("RESULT " + json.dumps(results), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if "RANK" in os.environ:
        worker(args.steps, args.repeats)
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
        "--steps",
        str(args.steps),
        "--repeats",
        str(args.repeats),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        print(done.stdout[-4000:], done.stderr[-4000:], file=sys.stderr)
        return 1
    results = json.loads(lines[-1][len("RESULT ") :])
    print(f"{'model':48} {'bare DDP ms/step':>17} {'trainop ms/step':>16} {'overhead':>9}")
    for name, runs in results.items():
        bare, ours = statistics.median(runs["bare"]) * 1e3, statistics.median(runs["trainer"]) * 1e3
        print(f"{name:48} {bare:17.3f} {ours:16.3f} {100 * (ours - bare) / bare:8.1f}%")
    print(f"({args.steps} steps, median of {args.repeats}; raw: {json.dumps(results)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
