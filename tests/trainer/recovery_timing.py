"""In-attempt recovery time on CPU (docs/benchmarks.md, "In-attempt recovery"): not a test, a measurement.

    .venv/bin/python tests/trainer/recovery_timing.py [--repeats 2] [--stall-timeout 10] [--fail-at-step 25]

``TRAINOP_WARM_SPARES=1`` in its environment: with warm spare workers (restart_policy.WarmSpares; they
start ``TRAINOP_SPARE_DELAY_S``, default 20, after each group, so fail later than that: ``--fail-at-step``).

Two ranks (gloo) of ``faulty_entrypoint`` (0.05 s per step, a checkpoint every 10 steps, status every step)
on a local Ray runtime with Ray Train's default polling. Two failures, each in its own run:

- user exception: rank 1 raises ValueError once at step 25; t0 = when it raised (the marker it writes just
  before), t1 = the first status record of the restarted group at a step beyond the checkpoint it resumed
  from. Recovery = t1 - t0.
- stall: rank 1 is frozen (SIGSTOP) at step >= 25; detection = the stacks file's time - the freeze
  (≈ stallTimeoutSeconds), recovery = t1 - detection.

Prints one JSON line per run and a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)

import trainer_support  # noqa: E402

from trainop_trainer import ray_train  # noqa: E402


def _status(config: Any) -> dict[str, Any]:
    try:
        return trainer_support.status(config)
    except (OSError, ValueError):
        return {}


def _first_step_after_resume(config: Any, after: float, deadline_s: float = 600) -> tuple[float, int]:
    """Poll status.json until the restarted group (workerRestarts 1) reports a step: (time, step)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        progress = _status(config).get("progress", {})
        if int(progress.get("workerRestarts", 0)) >= 1 and time.time() > after:
            resumed = [e["step"] for e in trainer_support.events(config) if e["event"] == "resume"]
            if resumed and int(progress.get("step", 0)) > int(resumed[-1]):
                return time.time(), int(progress["step"])
        time.sleep(0.01)
    raise RuntimeError("no step after the resume")


def one_run(kind: str, storage: pathlib.Path, stall_timeout: int, fail_at_step: int = 25) -> dict[str, Any]:
    marker = storage / "raised"
    pid_dir = storage / "pids"
    os.environ["TRAINOP_PID_DIR"] = str(pid_dir)
    workload: dict[str, Any] = {"entrypoint": "faulty_entrypoint:train", "config": {"stepSeconds": 0.05}}
    if kind == "user-exception":
        workload["config"].update({"failAtStep": fail_at_step, "failRank": 1, "failOnceMarker": str(marker)})
    config = trainer_support.mlp_config(
        storage,
        f"recovery-{kind}",
        max_steps=fail_at_step + 55,
        interval_steps=10,
        every_steps=1,
        workload=workload,
    )
    config = trainer_support.with_spec(
        config,
        failurePolicy={
            "maxWorkerFailures": 2,
            "stallTimeoutSeconds": stall_timeout,
            "budgets": {"userCodeError": 2},
        },
    )
    found: dict[str, float] = {}

    def watch() -> None:
        if kind == "stall":
            while int(_status(config).get("progress", {}).get("step", 0)) < fail_at_step:
                time.sleep(0.02)
            pid = int((pid_dir / f"recovery-{kind}-rank1.pid").read_text())
            found["t0"] = time.time()
            os.kill(pid, signal.SIGSTOP)
            stacks = trainer_support.run_dir(config) / "stalls" / "attempt-1-try-0-rank-0.txt"
            while not stacks.exists():
                time.sleep(0.01)
            found["detected"] = stacks.stat().st_mtime
        else:
            while not marker.exists():
                time.sleep(0.01)
            found["t0"] = found["detected"] = float(marker.read_text())
        found["t1"], found["step"] = _first_step_after_resume(config, after=found["detected"])

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    started = time.time()
    result = ray_train.run(config)
    thread.join(60)
    entry = _status(config)["workerFailures"]["last"][0]
    return {
        "kind": kind,
        "outcome": result.outcome,
        "reason": entry["reason"],
        "detection_s": round(found["detected"] - found["t0"], 2),
        "recovery_s": round(found["t1"] - found["detected"], 2),
        "failure_to_first_step_s": round(found["t1"] - found["t0"], 2),
        "run_s": round(time.time() - started, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--stall-timeout", type=int, default=10)
    parser.add_argument("--kinds", default="user-exception,stall")
    parser.add_argument("--fail-at-step", type=int, default=25, help="the step of the raise or the freeze")
    parser.add_argument("--num-cpus", type=int, default=8, help="the local Ray runtime's logical CPUs")
    parser.add_argument(
        "--controller-lines",
        action="store_true",
        help="at the end, trainop's lines in Ray Train's controller logs, one JSON object each",
    )
    args = parser.parse_args()
    ray_train.ensure_ray(num_cpus=args.num_cpus, quiet=True, log_to_driver=False)
    before = trainer_support.train_controller_logs()
    results: list[dict[str, Any]] = []
    for _ in range(args.repeats):
        for kind in args.kinds.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                row = one_run(kind, pathlib.Path(tmp), args.stall_timeout, args.fail_at_step)
            print(json.dumps(row), flush=True)
            results.append(row)
    if args.controller_lines:
        for message in trainer_support.controller_messages(before):
            if message.startswith("trainop:"):
                print(json.dumps({"controller": message}), flush=True)
    for kind in args.kinds.split(","):
        rows = [r for r in results if r["kind"] == kind]
        recovery = [r["recovery_s"] for r in rows]
        median = statistics.median(recovery)
        print(
            f"{kind}: recovery (detection -> first step after resume) median {median:.2f} s, "
            f"max {max(recovery):.2f} s over {len(rows)} runs; detection {[r['detection_s'] for r in rows]}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
