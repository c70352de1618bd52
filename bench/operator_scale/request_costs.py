"""What each kind of request the operator makes costs the kube-apiserver (+ etcd) in CPU, at N jobs.

    .venv/bin/python bench/operator_scale/request_costs.py [--jobs 300] [--repeat 300]

Starts a control plane, lets the operator bring N TrainingJobs to Running (so the namespace holds N of
every child), stops the operator, then replays each request type ``--repeat`` times (8 in flight) and
reads the CPU seconds the apiserver and etcd spent (from /proc). This is how the scale work picked what
to cut: a request type's cost per call, and whether it grows with the number of jobs in the namespace
(a label-selected LIST does: the apiserver filters every object of the namespace).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

import run as scale  # noqa: E402  (this directory: the scale bench's harness)

from tests.reliability import kube_async, kuberay_async  # noqa: E402

TJ = f"/apis/trainop.dev/v1alpha1/namespaces/{scale.NAMESPACE}/trainingjobs"
RJ = f"/apis/ray.io/v1/namespaces/{scale.NAMESPACE}/rayjobs"
CORE = f"/api/v1/namespaces/{scale.NAMESPACE}"


async def replay(
    api: kube_async.AsyncApi, make: Callable[[int], Awaitable[Any]], repeat: int, in_flight: int = 8
) -> None:
    semaphore = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with semaphore:
            await make(i)

    await asyncio.gather(*(one(i) for i in range(repeat)))


async def measure(plane: Any, num_jobs: int, repeat: int) -> dict[str, dict[str, float]]:
    async with kube_async.AsyncApi.for_plane(plane) as api:
        names = [f"job-{i:05d}" for i in range(num_jobs)]
        n = len(names)
        cases: dict[str, Callable[[int], Awaitable[Any]]] = {
            "GET trainingjob": lambda i: api.get(f"{TJ}/{names[i % n]}"),
            "GET rayjob": lambda i: api.get(f"{RJ}/{names[i % n]}-a1"),
            "LIST rayjobs by owner label": lambda i: api.list(RJ, selector=f"trainop.dev/job={names[i % n]}"),
            "GET claim": lambda i: api.get(f"{CORE}/persistentvolumeclaims/{names[i % n]}-ckpt"),
            "LIST pods by owner label": lambda i: api.list(
                f"{CORE}/pods", selector=f"trainop.dev/job={names[i % n]},trainop.dev/attempt=1"
            ),
            "GET configmap": lambda i: api.get(f"{CORE}/configmaps/{names[i % n]}-trainer"),
            "PATCH trainingjob/status (a condition message)": lambda i: api.patch(
                f"{TJ}/{names[i % n]}/status", {"status": {"nextRestartTime": None, "restarts": 0}}
            ),
            "PATCH rayjob/status (KubeRay's)": lambda i: api.patch(
                f"{RJ}/{names[i % n]}-a1/status", {"status": {"message": f"m{i}"}}
            ),
            "POST event": lambda i: api.create(
                f"{CORE}/events",
                {
                    "metadata": {"generateName": "bench."},
                    "involvedObject": {
                        "kind": "TrainingJob",
                        "name": names[i % n],
                        "namespace": scale.NAMESPACE,
                    },
                    "reason": "Bench",
                    "message": "x",
                    "type": "Normal",
                },
            ),
        }
        pids = plane.pids()
        out = {}
        for name, make in cases.items():
            await replay(api, make, 20)  # warm connections and caches
            cpu = {c: scale.proc_stat(pids[c])["cpu_s"] for c in ("kube-apiserver", "etcd")}
            started = time.monotonic()
            await replay(api, make, repeat)
            wall = time.monotonic() - started
            spent = {c: scale.proc_stat(pids[c])["cpu_s"] - cpu[c] for c in cpu}
            out[name] = {
                "apiserver_cpu_ms_each": round(1000 * spent["kube-apiserver"] / repeat, 2),
                "etcd_cpu_ms_each": round(1000 * spent["etcd"] / repeat, 2),
                "wall_ms_each_8_in_flight": round(1000 * wall / repeat, 2),
            }
        return out


async def settle_running(plane: Any, num_jobs: int) -> None:
    """N jobs brought to Running by the operator (with the stand-in), so every child exists."""
    async with kube_async.AsyncApi.for_plane(plane) as api:
        kuberay = kuberay_async.KubeRayStandIn(
            api, scale.NAMESPACE, lambda _: kuberay_async.Plan(kuberay_async.Outcome.HOLD)
        )
        kuberay.start()
        semaphore = asyncio.Semaphore(16)

        async def create(i: int) -> None:
            async with semaphore:
                await api.create(TJ, scale.operator_factories.manifest(f"job-{i:05d}", scale.NAMESPACE))

        await asyncio.gather(*(create(i) for i in range(num_jobs)))
        while True:
            jobs = await api.list(TJ)
            if sum((j.get("status") or {}).get("phase") == "Running" for j in jobs) == num_jobs:
                break
            await asyncio.sleep(1)
        await kuberay.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainop-bench-") as tmp:
        plane, _ = scale.start_plane(Path(tmp))
        try:
            kubeconfig = scale.operator_kubeconfig(plane)
            operator, _ = scale.start_operator(kubeconfig, plane.data_dir / "operator.log", 4, None)
            try:
                asyncio.run(settle_running(plane, args.jobs))
            finally:
                operator.stop()
            result = asyncio.run(measure(plane, args.jobs, args.repeat))
        finally:
            plane.stop()
    print(json.dumps({"jobs": args.jobs, "costs": result}, indent=2))


if __name__ == "__main__":
    main()
