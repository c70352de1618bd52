"""Host memory of one GPU rank and its DataLoader workers: what a GPU worker pod's memory must hold.

Grounds the per-GPU memory default of ``trainop.api.resources`` (docs/operator.md, "Pod sizes"). Runs the
packaged trainer on one GPU without Ray (``python -m trainop_trainer.launch``: the same Trainer, Runtime,
checkpoints and loaders as under Ray Train) for each workload and loader count, and samples the memory of
the whole process tree (the rank and its DataLoader worker processes) twice a second from
/proc/<pid>/smaps_rollup, and the used size of /dev/shm:

- ``uss``: private memory, summed (anonymous memory, pinned host buffers, the loaders' own pages);
- ``shared_once``: the largest shared set of any one process (the libraries all of them map: counted once,
  as a memory cgroup charges a page once);
- ``estimate = uss + shared_once``: what the pod's memory cgroup would be charged, about;
- ``rss``: the sum of resident sets (counts shared libraries once per process: an upper bound).

Peaks over the run, written as JSON lines to ``--out`` and as a table on stdout. A checkpoint is written
during the run (its pinned snapshot is part of the peak). Ray's own processes in a worker pod (raylet,
agents, an idle worker) come on top: about 0.5 GiB measured on CPU (docs/operator.md).

    python3 bench/gpu/host_memory.py --out $OUT [--steps 80] [--only resnet50-2-loaders,...]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from trainop.api import trainer_config, trainingjob

CASES: dict[str, dict[str, Any]] = {
    # The CPU demo's model: runs anywhere (on a machine without CUDA every case trains on CPU), so the
    # harness can be checked on the dev box, and it measures what loaders cost a CPU worker.
    "mlp-0-loaders": {
        "workload": {
            "model": "mlp",
            "dataset": {"kind": "synthetic", "numSamples": 16384, "numClasses": 10, "numWorkers": 0},
        },
        "hyperparameters": {"batchSizePerWorker": 64},
    },
    "mlp-2-loaders": {
        "workload": {
            "model": "mlp",
            "dataset": {"kind": "synthetic", "numSamples": 16384, "numClasses": 10, "numWorkers": 2},
        },
        "hyperparameters": {"batchSizePerWorker": 64},
    },
    "resnet50-2-loaders": {
        "workload": {
            "model": "resnet50",
            "dataset": {"kind": "synthetic", "numSamples": 1_000_000, "numWorkers": 2},
        },
        "hyperparameters": {"batchSizePerWorker": 256, "optimizer": "sgd"},
    },
    "resnet50-8-loaders": {
        "workload": {
            "model": "resnet50",
            "dataset": {"kind": "synthetic", "numSamples": 1_000_000, "numWorkers": 8},
        },
        "hyperparameters": {"batchSizePerWorker": 256, "optimizer": "sgd"},
    },
    "gpt-small-2-loaders": {
        "workload": {
            "model": "gpt-small",
            "dataset": {"kind": "synthetic", "numSamples": 1_000_000, "numWorkers": 2},
        },
        "hyperparameters": {"batchSizePerWorker": 16, "optimizer": "adamw", "learningRate": 0.0006},
    },
}


def tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as file:
                    ppid = int(file.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
            except OSError:
                pass
    out, i = [root], 0
    while i < len(out):
        out.extend(children.get(out[i], []))
        i += 1
    return out


def sample(root: int) -> dict[str, int]:
    uss = rss = pss = shared_max = 0
    for pid in tree(root):
        values: dict[str, int] = {}
        try:
            with open(f"/proc/{pid}/smaps_rollup") as file:
                for line in file:
                    key, _, rest = line.partition(":")
                    if rest.strip().endswith("kB"):
                        values[key] = int(rest.split()[0]) * 1024
        except OSError:
            continue
        private = values.get("Private_Clean", 0) + values.get("Private_Dirty", 0)
        uss += private
        rss += values.get("Rss", 0)
        pss += values.get("Pss", 0)
        shared_max = max(shared_max, values.get("Rss", 0) - private)
    shm = shutil.disk_usage("/dev/shm").used if os.path.isdir("/dev/shm") else 0
    return {
        "uss": uss,
        "rss": rss,
        "pss": pss,
        "shared_once": shared_max,
        "estimate": uss + shared_max,
        "shm": shm,
    }


def run_case(name: str, extra: dict[str, Any], *, steps: int, workdir: pathlib.Path) -> dict[str, Any]:
    spec = trainingjob.TrainingJobSpec.model_validate(
        {
            **extra,
            "hyperparameters": {**extra["hyperparameters"], "maxSteps": steps},
            "precision": "bf16",
            "workers": {"replicas": 1, "gpusPerWorker": 1},
            "checkpoint": {"intervalSteps": steps // 2, "keepLast": 2},
            "network": {"probe": False},
            "reporting": {"everySteps": 20, "metricsPort": 29400},
        },
        by_alias=True,
    )
    config = trainer_config.TrainerConfig(
        job_name=name, run_name=name, storage_path=str(workdir), attempt=1, spec=spec, status_target=None
    )
    path = workdir / f"{name}.json"
    path.write_text(trainer_config.dumps(config))
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "trainop_trainer.launch", "--config", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak: dict[str, int] = {}
    while process.poll() is None:
        for key, value in sample(process.pid).items():
            peak[key] = max(peak.get(key, 0), value)
        time.sleep(0.5)
    stderr = process.stderr.read() if process.stderr else ""
    gib = {key: round(value / 2**30, 2) for key, value in peak.items()}
    return {
        "case": name,
        "returncode": process.returncode,
        "seconds": round(time.monotonic() - started, 1),
        "peak_gib": gib,
        "stderr_tail": stderr[-600:] if process.returncode else "",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--only", default="", help="comma-separated case names")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chosen = [c for c in CASES if not args.only or c in args.only.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in chosen:
            row = run_case(name, CASES[name], steps=args.steps, workdir=pathlib.Path(tmp))
            rows.append(row)
            with (out / "host_memory.jsonl").open("a") as file:
                file.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    print("| case | estimate (USS + shared once) | USS | RSS sum | /dev/shm used | s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        p = row["peak_gib"]
        print(
            f"| {row['case']} | {p.get('estimate')} GiB | {p.get('uss')} GiB | {p.get('rss')} GiB | "
            f"{p.get('shm')} GiB | {row['seconds']} |"
        )
    return 0 if all(r["returncode"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
