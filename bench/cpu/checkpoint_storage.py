"""Checkpoint cost in an S3 bucket against the volume: GPT-small's training state (1.5 GB), one process.

    .venv/bin/python bench/cpu/checkpoint_storage.py [--repeats 3] [--out results.json]

Builds the built-in ``gpt-small`` (124 M parameters) with AdamW, takes one optimizer step at sequence 64 so
that the optimizer state exists (parameters + two moments in fp32: 1.49 GB), and registers model, optimizer
and train state with the trainer's own ``Checkpointer`` in a world of one (gloo). Then, alternating between
the two places, ``--repeats`` times each:

- ``volume``: a directory on this machine's disk (what a PVC is to the pod), DCP's file writer with fsync;
- ``s3``: a bucket of versitygw (tests/objectstore) on loopback, serving a directory on the same disk, through
  the trainer's pyarrow S3 client (multipart uploads on background threads).

For each save: the stall on the training thread (``Checkpointer.save(wait=False)`` until it returns: the
state staged by a copy, as the built-in loop does on CPU), and the background time until the checkpoint is
committed (serialise + write/upload + ``.metadata``); then the time to load it back into fresh parts (the
resume path: validation, DCP read). While the background write runs, the training thread keeps a CPU-bound
loop going (matrix products on one thread); its rate against an idle baseline shows how much the write
slows training on this 2-core machine. Prints one JSON line per measurement and a summary.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from tests.objectstore.server import S3Server  # noqa: E402
from trainop.api import trainer_config, trainingjob  # noqa: E402
from trainop_trainer import config as config_module  # noqa: E402
from trainop_trainer import distributed, run_record, stateful, storage, workloads  # noqa: E402
from trainop_trainer.checkpointer import Checkpointer  # noqa: E402

CTX = distributed.WorkerContext(
    rank=0,
    world_size=1,
    local_rank=0,
    local_world_size=1,
    node_rank=0,
    device=torch.device("cpu"),
    backend="gloo",
)


def gpt_small_state() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    spec = trainingjob.TrainingJobSpec.model_validate(
        {
            "workload": {"model": "gpt-small", "dataset": {"kind": "synthetic", "sequenceLength": 64}},
            "hyperparameters": {"maxSteps": 1, "optimizer": "adamw", "learningRate": 1e-4},
        },
        by_alias=True,
    )
    workload = workloads.build(spec)
    model = workload.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    inputs, targets = workload.dataset[0]
    batch = (inputs.unsqueeze(0), targets.unsqueeze(0))
    x, y = workload.to_device(batch, torch.device("cpu"))
    workload.loss_fn(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def checkpointer(
    root: storage.RunDir, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> Checkpointer:
    paths = config_module.RunPaths(run_dir=root)
    record = run_record.RunRecord(paths=paths, launch_id="bench", is_rank0=True)
    saver = Checkpointer(root=root / "checkpoints", ctx=CTX, keep_last=2, record=record)
    saver.register("model", stateful.ModelState(model))
    saver.register("optimizer", stateful.OptimizerState(model, optimizer))
    saver.register("train_state", stateful.TrainState())
    return saver


class Spinner:
    """A CPU-bound loop on the calling thread's behalf (one BLAS thread): iterations per second."""

    def __init__(self) -> None:
        self.a = torch.randn(256, 256)

    def rate(self, seconds: float) -> float:
        count, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            self.a @ self.a
            count += 1
        return count / seconds

    def until(self, done: threading.Event) -> float:
        count, start = 0, time.perf_counter()
        while not done.is_set():
            self.a @ self.a
            count += 1
        return count / max(time.perf_counter() - start, 1e-9)


def one_save(saver: Checkpointer, step: int, spinner: Spinner) -> dict[str, float]:
    started = time.perf_counter()
    saver.save(step=step, epoch=0, progress={}, metrics={}, wait=False)
    stall = time.perf_counter() - started
    done = threading.Event()
    committed: dict[str, float] = {}

    def wait() -> None:
        saver.wait()
        committed["at"] = time.perf_counter()
        done.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    rate = spinner.until(done)  # the training thread goes on while the write runs
    waiter.join()
    return {"stall_s": stall, "background_s": committed["at"] - started, "train_rate_during": rate}


def one_load(root: storage.RunDir, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
    """Restore the newest checkpoint into ``model``/``optimizer`` (other objects than the saved ones)."""
    loader = checkpointer(root, model, optimizer)
    started = time.perf_counter()
    restored = loader.load()
    seconds = time.perf_counter() - started
    loader.close()
    assert restored is not None
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        rank=0,
        world_size=1,
        init_method=f"tcp://127.0.0.1:{distributed.free_port()}",
        timeout=datetime.timedelta(seconds=1800),
    )
    work = pathlib.Path(tempfile.mkdtemp(prefix="ckpt-storage-", dir=os.environ.get("BENCH_DIR", "/tmp")))
    server = S3Server.start(work / "s3")
    try:
        bucket = server.create_bucket(f"bench-{uuid.uuid4().hex[:8]}")
        os.environ.update(server.env(trainer_config.S3_CHECKPOINT))
        places: dict[str, storage.RunDir] = {
            "volume": work / "volume" / "run",
            "s3": storage.for_uri(
                f"s3://{bucket}/run", bucket=server.bucket(bucket), use=trainer_config.S3_CHECKPOINT
            ),
        }
        model, optimizer = gpt_small_state()
        fresh_model, fresh_optimizer = gpt_small_state()
        size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        size += sum(
            v.numel() * v.element_size()
            for state in optimizer.state.values()
            for v in state.values()
            if torch.is_tensor(v)
        )
        spinner = Spinner()
        idle_rate = spinner.rate(3.0)
        print(json.dumps({"state_bytes": size, "idle_train_rate": idle_rate}), flush=True)
        savers = {name: checkpointer(root, model, optimizer) for name, root in places.items()}
        results: dict[str, list[dict[str, float]]] = {name: [] for name in places}
        step = 0
        for repeat in range(args.repeats):
            for name, saver in savers.items():
                step += 1
                row = one_save(saver, step, spinner)
                row["load_s"] = one_load(places[name], fresh_model, fresh_optimizer)
                row["repeat"] = repeat
                results[name].append(row)
                print(json.dumps({"place": name, **row}), flush=True)
        for saver in savers.values():
            saver.close()
        summary: dict[str, Any] = {"state_gb": round(size / 1e9, 3), "idle_train_rate": round(idle_rate, 1)}
        for name, rows in results.items():
            summary[name] = {
                key: round(statistics.median(r[key] for r in rows), 3)
                for key in ("stall_s", "background_s", "load_s", "train_rate_during")
            }
            summary[name]["write_mb_per_s"] = round(size / 1e6 / summary[name]["background_s"], 1)
            summary[name]["runs"] = len(rows)
        summary["load_average_end"] = os.getloadavg()
        print("SUMMARY " + json.dumps(summary), flush=True)
        if args.out:
            pathlib.Path(args.out).write_text(json.dumps({"summary": summary, "rows": results}, indent=2))
    finally:
        server.stop()
        dist.destroy_process_group()
        shutil.rmtree(work, ignore_errors=True)  # gigabytes of checkpoints per run
    return 0


if __name__ == "__main__":
    sys.exit(main())
