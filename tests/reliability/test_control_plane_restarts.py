"""kube-apiserver restarted, then etcd restarted, in the middle of a churn: the operator (never restarted
itself) reconnects its watches and its client, and every job still ends exactly as planned, with nothing
duplicated or orphaned (the invariants of ``churn.verify``). KubeRay's part is played by the churn's
watch-driven stand-in (``kuberay_async.KubeRayStandIn``, the only mock): it writes the RayJob statuses
KubeRay would (Initializing, Running, then each attempt's planned outcome), across the restarts too.

The restarts are real: the same binaries stopped (SIGTERM) and started again on the same ports and data
(``ControlPlane.restart``), down for two seconds each, so the operator sees refused connections, broken
watch streams, a fresh watch cache (its old resource versions ``410 Gone``) and etcd unavailable behind a
live apiserver (5xx, timeouts).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

from tests.controlplane import cluster
from tests.reliability import churn, kube_async, operator_runner

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]


async def test_apiserver_and_etcd_restarted_mid_churn_the_operator_reconnects_and_every_job_converges(
    isolated_plane: cluster.ControlPlane,
    isolated_namespace: str,
    make_operator: Callable[..., operator_runner.Operator],
) -> None:
    operator = make_operator(isolated_namespace)
    await operator.start_async()
    plans = churn.plan_jobs(random.Random(5), 30, spread_s=12)
    final_at_restart: dict[str, int] = {}

    async with kube_async.AsyncApi.for_plane(isolated_plane) as api:
        scenario = churn.Churn(api, isolated_namespace, plans)

        async def restart_components(done: asyncio.Event) -> None:
            for component, after_s in (("kube-apiserver", 5.0), ("etcd", 6.0)):
                await asyncio.sleep(after_s)
                final_at_restart[component] = scenario.num_final
                # On this thread, not a worker thread: the kernel kills a control-plane process when
                # the thread that started it exits (PR_SET_PDEATHSIG), and worker threads end with
                # the test's event loop. The loop stalls for the restart; the apiserver is down anyway.
                isolated_plane.restart(component, down_s=2.0)
            if not operator.running:
                raise AssertionError("the operator died")

        await scenario.run(timeout_s=300, disrupt=restart_components)
        problems = await churn.verify(scenario)

    assert set(final_at_restart) == {"kube-apiserver", "etcd"}, "a restart did not happen during the churn"
    assert all(n < len(plans) for n in final_at_restart.values()), (
        f"restarts after the churn: {final_at_restart}"
    )
    assert operator.running and operator.starts == 1, "the operator had to be restarted"
    assert not problems, "\n".join(problems[:40])
