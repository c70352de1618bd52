"""Fault-injection benchmark (issue #17): recovery with and without recreating the Ray cluster, side by side.

On the real-KubeRay cluster bed (tests/clusterbed, as the e2e tier brings it up: ``helm install`` of the
chart, the operator as a pod of the node agent) two copies of bench/faults/job.yaml run at once, each in its
own namespace:

- ``fast``: ``failurePolicy.maxWorkerFailures: 3`` -- a worker failure is restarted inside the attempt, on
  the pods already there (the trainer's driver restarts the Ray Train worker group from the checkpoint);
- ``baseline``: ``maxWorkerFailures: 0`` -- every failure ends the attempt: KubeRay deletes the Ray
  cluster, the operator creates the next RayJob (new pods, Ray start-up) which resumes from the checkpoint.

After the first committed checkpoint each job gets the same failures, in a seeded random order with seeded
random gaps (``--seed``): ``stall`` (SIGSTOP of one Ray Train worker process in a worker pod: found by the
trainer's watchdog after stallTimeoutSeconds), ``crash`` (SIGKILL of one Ray Train worker process) and
``preempt`` (``kubectl delete pod --grace-period=30`` of a worker pod: never restarted in the attempt, the
pod is going away -- both paths recreate) and ``usercode`` (``kubectl exec`` creates a trigger file in a
worker pod; the job's user code, which watches for it, raises ValueError: a UserCodeError, restarted in the
attempt on the fast path, a new attempt on the baseline). The job runs that user code in a user's own image
(``e2e/usercode/faulty_train.py`` in ``example.com/ml-team/trainer-with-code:v1``, the trainer image plus
the code: tests/clusterbed/images.py), a small MLP like the built-in ``mlp`` the runs before 2026-11-26
20:00 UTC used.

Measured, from the ``kubectl --watch`` stream of the TrainingJob (every status version, with the second it
arrived): per failure, recovery = injection -> the first status.progress report of a new step after the
restart showed on status (status.attempt, or status.workerFailures.counts, changed); time-to-N-steps =
apply -> phase Succeeded with N = maxSteps; goodput = status.goodput (the operator's, r3-ops) at the end.
Raw results go to ``--out`` (JSON); docs/benchmarks.md has the table.

    .venv/bin/python -m bench.faults.run --seed 17 --out bench/faults/results/<date>.json

Never a timed assertion: it reports; docs/benchmarks.md says what was seen.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from e2e import claims, faults, install, scenario
from e2e import cluster as cluster_module
from tests.controlplane import assets

Obj = dict[str, Any]
JOB = Path(__file__).parent / "job.yaml"
FAULTS = ("stall", "crash", "preempt", "usercode")
#: job.yaml's workload.config.raiseWhenFileExists: the user code raises when this file appears in its pod.
USER_CODE_TRIGGER = "/tmp/trainop/raise-user-error"
START_TIMEOUT_S = 600
RECOVERY_TIMEOUT_S = 600


def status(obj: Obj) -> Obj:
    return obj.get("status") or {}


def marker(obj: Obj) -> tuple[int, int]:
    """What changes when a failure has been acted on: a new attempt, or one more in-attempt restart."""
    s = status(obj)
    counts = (s.get("workerFailures") or {}).get("counts") or {}
    return int(s.get("attempt") or 0), sum(int(v) for v in counts.values())


def progress_step(obj: Obj) -> int | None:
    step = (status(obj).get("progress") or {}).get("step")
    return None if step is None else int(step)


class PathRun:
    """One copy of the job (``fast`` or ``baseline``) and the failures injected into it."""

    def __init__(self, run: scenario.Scenario, label: str, plan: list[tuple[str, float]]) -> None:
        self.run = run
        self.label = label
        self.plan = plan
        self.result: Obj = {"path": label, "failures": []}

    def latest(self) -> Obj:
        assert self.run.owner is not None
        return self.run.owner.latest() or {}

    def inject(self, kind: str) -> str:
        run = self.run
        attempt = int(status(self.latest()).get("attempt") or 1)
        ray_job = run.ray_job(attempt)
        run.timeline.note(f"inject {kind} into {ray_job}")
        if kind == "stall":
            return run.env.faults.signal_worker(run.namespace, ray_job, "STOP")
        if kind == "crash":
            return run.env.faults.signal_worker(run.namespace, ray_job, "KILL")
        if kind == "usercode":
            return run.env.faults.create_file_in_worker(run.namespace, ray_job, USER_CODE_TRIGGER)
        return run.env.faults.delete_pod_gracefully(run.namespace, ray_job, "worker", grace_period_s=30)

    def recovered_at(self, before: tuple[int, int], since: float) -> tuple[float, Obj]:
        """The first status version after ``since`` that reports a new step once the marker moved."""
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while time.monotonic() < deadline:
            moved_step: int | None = None
            moved = False
            for sample in self.run.history():
                if sample.seconds < since:
                    continue
                if not moved:
                    if marker(sample.obj) != before:
                        moved, moved_step = True, progress_step(sample.obj)
                    continue
                if scenario.phase(sample.obj) == "Succeeded" or progress_step(sample.obj) != moved_step:
                    return sample.seconds, sample.obj
            if scenario.phase(self.latest()) == "Failed":
                raise AssertionError(f"{self.label}: the job failed: {status(self.latest())}")
            time.sleep(0.5)
        raise AssertionError(f"{self.label}: no recovery within {RECOVERY_TIMEOUT_S}s")

    def main(self) -> None:
        run = self.run
        started = run.timeline.clock()
        run.wait_for(lambda o: scenario.phase(o) == "Running", timeout_s=START_TIMEOUT_S, what="Running")
        run.wait_for_checkpoint_on_volume(attempt=1)
        for kind, gap in self.plan:
            time.sleep(gap)
            if scenario.phase(self.latest()) in ("Succeeded", "Failed"):
                self.result["failures"].append({"kind": kind, "injected": False})
                continue
            before = marker(self.latest())
            step_before = progress_step(self.latest())
            at, at_wall = run.timeline.clock(), time.time()
            answer = self.inject(kind)
            done_at, obj = self.recovered_at(before, at)
            self.result["failures"].append(
                {
                    "kind": kind,
                    "injected": True,
                    "gapSeconds": round(gap, 1),
                    "answer": answer,
                    "stepAtInjection": step_before,
                    "recoverySeconds": round(done_at - at, 1),
                    "injectedAt": at_wall,
                    "recoveredAt": at_wall + (done_at - at),
                    "attemptAfter": status(obj).get("attempt"),
                    "stepAfter": progress_step(obj),
                }
            )
        final = run.wait_until_finished(timeout_s=RECOVERY_TIMEOUT_S * 2)
        s = status(final)
        add_detection_times(self.result["failures"], s)
        self.result.update(
            {
                "phase": scenario.phase(final),
                "timeToNStepsSeconds": round(self.finished_at(final) - started, 1),
                "maxSteps": run.document["spec"]["hyperparameters"]["maxSteps"],
                "attempts": s.get("attempt"),
                "restartsByReason": s.get("restartsByReason"),
                "failures": self.result["failures"],
                "statusFailures": [
                    {k: f.get(k) for k in ("attempt", "reason", "message")} for f in s.get("failures") or []
                ],
                "workerFailures": s.get("workerFailures"),
                "goodput": s.get("goodput"),
                "progress": s.get("progress"),
            }
        )

    def finished_at(self, final: Obj) -> float:
        for sample in self.run.history():
            if scenario.phase(sample.obj) in ("Succeeded", "Failed"):
                return sample.seconds
        return self.run.timeline.clock()


def rfc3339(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def add_detection_times(injected: list[Obj], s: Obj) -> None:
    """Per injected failure, when it was recorded (the first status.workerFailures.last or status.failures
    entry after the injection): detection, and resume after detection (a stall's detection is the stall
    timeout, the same on both paths)."""
    recorded = sorted(
        rfc3339(str(entry["time"]))
        for entry in [*((s.get("workerFailures") or {}).get("last") or []), *(s.get("failures") or [])]
        if entry.get("time")
    )
    for failure in injected:
        if not failure.get("injected"):
            continue
        after = [t for t in recorded if failure["injectedAt"] - 1 <= t <= failure["recoveredAt"]]
        if after:
            failure["detectedSeconds"] = round(after[0] - failure["injectedAt"], 1)
            failure["resumeAfterDetectionSeconds"] = round(failure["recoveredAt"] - after[0], 1)


def summarize(results: list[Obj]) -> Obj:
    table: Obj = {}
    for result in results:
        for kind in FAULTS:
            times = [
                f["recoverySeconds"] for f in result["failures"] if f["kind"] == kind and f.get("injected")
            ]
            after_detection = [
                f["resumeAfterDetectionSeconds"]
                for f in result["failures"]
                if f["kind"] == kind and "resumeAfterDetectionSeconds" in f
            ]
            table.setdefault(kind, {})[result["path"]] = (
                {
                    "n": len(times),
                    "p50": statistics.median(times),
                    "max": max(times),
                    "afterDetectionP50": statistics.median(after_detection) if after_detection else None,
                }
                if times
                else None
            )
    return table


def environment(work: Path) -> tuple[scenario.Environment, Callable[[], None]]:
    cluster = cluster_module.LocalCluster(assets=assets.resolve(), work_dir=work)
    try:
        release = install.helm_install(cluster)
        install.wait_for_rollout(cluster, release)
    except BaseException:
        cluster.close()
        raise
    env = scenario.Environment(
        cluster=cluster,
        release=release,
        faults=faults.ClusterFaults(cluster),
        claims=claims.ClaimFiles(cluster),
        work_dir=work,
    )
    return env, cluster.close


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path(f"/tmp/bench-faults-{uuid.uuid4().hex[:6]}"))
    parser.add_argument(
        "--memory-per-worker",
        default=None,
        help="workers.memoryPerWorker of both paths (job.yaml: 2Gi); 4Gi or more gives the fast path warm "
        "spare workers (trainer.md, 'Warm spare workers')",
    )
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    order = list(FAULTS)
    rng.shuffle(order)
    plan = [(kind, rng.uniform(3, 8)) for kind in order]
    args.work.mkdir(parents=True, exist_ok=True)
    began = time.time()
    load_before = os.getloadavg()
    env, close = environment(args.work)
    bed_up_s = time.time() - began
    paths: list[PathRun] = []
    try:
        for label, max_worker_failures in (("fast", 3), ("baseline", 0)):
            namespace = f"bench-faults-{label}-{uuid.uuid4().hex[:6]}"
            env.cluster.kubectl("create", "namespace", namespace)
            run = scenario.Scenario(env, namespace, title=f"bench faults {label} ({namespace})")

            def edit(doc: Obj, m: int = max_worker_failures) -> list[str]:
                doc["spec"]["failurePolicy"]["maxWorkerFailures"] = m
                changes = [f"maxWorkerFailures={m}"]
                if args.memory_per_worker:
                    doc["spec"]["workers"]["memoryPerWorker"] = args.memory_per_worker
                    changes.append(f"memoryPerWorker={args.memory_per_worker}")
                return changes

            run.apply(JOB, edit)
            paths.append(PathRun(run, label, plan))
        errors: list[str] = []

        def guarded(path: PathRun) -> None:
            try:
                path.main()
            except BaseException:
                errors.append(f"{path.label}: {traceback.format_exc()}")
                path.result["error"] = traceback.format_exc()

        threads = [threading.Thread(target=guarded, args=(p,)) for p in paths]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for path in paths:
            print(path.run.finish())
        close()
    results = [p.result for p in paths]
    report = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(began)),
        "machine": "2-core dev box",
        "command": "python -m bench.faults.run " + " ".join(argv if argv is not None else sys.argv[1:]),
        "seed": args.seed,
        "plan": [{"kind": k, "gapSeconds": round(g, 1)} for k, g in plan],
        "loadAverageBefore": [round(x, 2) for x in load_before],
        "loadAverageAfter": [round(x, 2) for x in os.getloadavg()],
        "bedUpSeconds": round(bed_up_s, 1),
        "wallSeconds": round(time.time() - began, 1),
        "recovery": summarize(results),
        "paths": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(yaml.safe_dump({k: report[k] for k in ("recovery", "loadAverageBefore", "wallSeconds")}))
    print(f"wrote {args.out}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
