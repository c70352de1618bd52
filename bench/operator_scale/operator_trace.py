"""Where a burst's time goes inside the operator: ``python -m trainop.controller`` run with timing hooks.

    TRAINOP_TRACE=out.json python bench/operator_scale/operator_trace.py <the operator's flags>
    (run.py --trace DIR does this for every operator variant and summarises each run into its result)

cProfile (``run.py --profile``) says where the operator spends CPU; this says where a job *waits*, on the
operator's own clock:

- the work queue: for each reconcile, the time from the ``add`` that queued its key to the ``get`` that
  handed it to a worker;
- the reconciles: start and end of each, per owner;
- every API request as the operator's client saw it (method, resource, start, end): the apiserver's own
  timing (run.py's ``apiserver_time_by_request_all_clients``) subtracted from this is time spent in the
  operator's process (its event loop busy with other work) or on the wire;
- the event loop's lag: a task that asks to wake every 20 ms records how late it woke -- the delay that
  any ready callback (a response that arrived, a watch event) waited for the loop.

The hooks wrap ``workqueue.WorkQueue.add``/``get``, ``reconcile.Reconciler.reconcile`` and
``kube.Kube.request``, which every variant of the operator since ``ecad8ff`` has; nothing else changes.
Bench-only: the operator never imports this module.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import json
import os
import runpy
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

LAG_INTERVAL_S = 0.02
#: The owner key of the reconcile a request belongs to (gather's child tasks inherit it).
_OWNER: contextvars.ContextVar[str] = contextvars.ContextVar("owner", default="")


def _resource_of(method: str, path: str, content_type: str) -> str:
    """'POST roles', 'APPLY configmaps', 'PATCH trainingjobs/status', 'GET trainingjobs'."""
    parts = path.split("?")[0].strip("/").split("/")
    if "namespaces" in parts:
        rest = parts[parts.index("namespaces") + 2 :]
        resource = rest[0] + ("/" + rest[2] if len(rest) > 2 else "")
    else:
        resource = parts[-1]
    verb = "APPLY" if content_type == "application/apply-patch+yaml" else method
    return f"{verb} {resource}"


def install(out: Path) -> Callable[[], None]:
    """Wrap the operator's queue, reconciler and client; returns the function that writes ``out``."""
    from trainop.controller import kube, reconcile, workqueue

    clock = time.monotonic
    pending: dict[Any, float] = {}
    waits: list[tuple[str, float, float]] = []  # key, added, got
    reconciles: list[tuple[str, float, float, bool]] = []  # key, start, end, ok
    # owner key, "VERB resource", start, end, HTTP status (0: none)
    requests: list[tuple[str, str, float, float, int]] = []
    lags: list[float] = []

    add, get = workqueue.WorkQueue.add, workqueue.WorkQueue.get
    init = workqueue.WorkQueue.__init__

    @functools.wraps(add)
    def traced_add(self: Any, key: Any) -> None:
        pending.setdefault(key, clock())
        add(self, key)

    @functools.wraps(get)
    async def traced_get(self: Any) -> Any:
        key = await get(self)
        now = clock()
        waits.append((str(key), pending.pop(key, now), now))
        return key

    async def watch_lag() -> None:
        while True:
            asked = clock()
            await asyncio.sleep(LAG_INTERVAL_S)
            lags.append(clock() - asked - LAG_INTERVAL_S)

    @functools.wraps(init)
    def traced_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._trace_lag_task = asyncio.get_running_loop().create_task(watch_lag())

    reconcile_once = reconcile.Reconciler.reconcile

    @functools.wraps(reconcile_once)
    async def traced_reconcile(self: Any, key: Any) -> Any:
        started, ok = clock(), False
        _OWNER.set(str(key))
        try:
            result = await reconcile_once(self, key)
            ok = True
            return result
        finally:
            reconciles.append((str(key), started, clock(), ok))

    request = kube.Kube.request

    @functools.wraps(request)
    async def traced_request(self: Any, method: str, path: str, **kwargs: Any) -> Any:
        what = _resource_of(method, path, kwargs.get("content_type", "application/json"))
        started, status = clock(), 0
        try:
            result = await request(self, method, path, **kwargs)
            status = 200
            return result
        except kube.ApiError as error:
            status = error.status
            raise
        finally:
            requests.append((_OWNER.get(), what, started, clock(), status))

    workqueue.WorkQueue.add = traced_add  # type: ignore[method-assign]
    workqueue.WorkQueue.get = traced_get  # type: ignore[method-assign]
    workqueue.WorkQueue.__init__ = traced_init  # type: ignore[method-assign]
    reconcile.Reconciler.reconcile = traced_reconcile  # type: ignore[method-assign]
    kube.Kube.request = traced_request  # type: ignore[method-assign]

    def write() -> None:
        out.write_text(
            json.dumps({"waits": waits, "reconciles": reconciles, "requests": requests, "lags": lags})
        )

    return write


# --------------------------------------------------------------------------------------- summary
def _percentiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50_ms": round(1000 * statistics.median(ordered), 1),
        "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1),
        "max_ms": round(1000 * ordered[-1], 1),
        "sum_s": round(sum(ordered), 2),
    }


def _steps(spans: Sequence[tuple[float, float]]) -> int:
    """Sequential round trips: spans grouped while they overlap (a gather), counted."""
    steps, reach = 0, float("-inf")
    for started, ended in sorted(spans):
        if started >= reach:
            steps += 1
            reach = ended
        else:
            reach = max(reach, ended)
    return steps


def summarise(path: Path) -> dict[str, Any]:
    """What a run's trace says: queue waits, reconcile durations, each owner's first reconcile (its
    requests, how many sequential round trips, the time to its RayJob), client-side request latency by
    request type, and the event loop's lag."""
    data: Mapping[str, Any] = json.loads(path.read_text())
    first_wait: dict[str, float] = {}
    for key, added, got in data["waits"]:
        first_wait.setdefault(key, got - added)
    first_run: dict[str, tuple[float, float]] = {}
    for key, started, ended, _ in data["reconciles"]:
        first_run.setdefault(key, (started, ended))
    in_first: dict[str, list[tuple[str, float, float]]] = collections.defaultdict(list)
    by_request: dict[str, list[float]] = collections.defaultdict(list)
    for owner, what, started, ended, _ in data["requests"]:
        by_request[what].append(ended - started)
        run = first_run.get(owner)
        if run is not None and run[0] <= started <= run[1]:
            in_first[owner].append((what, started, ended))
    to_ray_job = [
        max(e for w, _, e in spans if w == "POST rayjobs") - first_run[owner][0]
        for owner, spans in in_first.items()
        if any(w == "POST rayjobs" for w, _, _ in spans)
    ]
    return {
        "queue_wait_first": _percentiles(list(first_wait.values())),
        "queue_wait_all": _percentiles([got - added for _, added, got in data["waits"]]),
        "reconcile_first": _percentiles([e - s for s, e in first_run.values()]),
        "reconcile_all": _percentiles([e - s for _, s, e, _ in data["reconciles"]]),
        "first_reconcile_start_to_rayjob": _percentiles(to_ray_job),
        "first_reconcile_requests": statistics.fmean(len(v) for v in in_first.values()) if in_first else 0,
        "first_reconcile_round_trips": statistics.fmean(
            _steps([(s, e) for _, s, e in v]) for v in in_first.values()
        )
        if in_first
        else 0,
        "reconciles": len(data["reconciles"]),
        "reconcile_errors": sum(1 for *_, ok in data["reconciles"] if not ok),
        "client_request_ms": {
            what: {
                "count": len(values),
                "mean_ms": round(1000 * statistics.fmean(values), 1),
                "p99_ms": round(1000 * sorted(values)[min(len(values) - 1, int(0.99 * len(values)))], 1),
            }
            for what, values in sorted(by_request.items(), key=lambda kv: -sum(kv[1]))
        },
        "loop_lag": _percentiles(data["lags"]),
    }


def main(argv: list[str]) -> None:
    write = install(Path(os.environ["TRAINOP_TRACE"]))
    sys.argv = ["trainop.controller", *argv]
    try:
        runpy.run_module("trainop.controller", run_name="__main__")
    finally:
        write()


if __name__ == "__main__":
    main(sys.argv[1:])
