"""The operator behind a fault-injecting proxy (``fault_proxy``): the API answering 409, 429, 500 and 503
to a fraction of its writes, or applying a write and losing the answer, and watch streams going silent.

The operator authenticates as a ServiceAccount bound to exactly ``rbac.OPERATOR_RULES`` (a bearer token
passes through the proxy; a client certificate could not). The KubeRay stand-in and the simulated users
talk to the apiserver directly: only the operator's traffic is disturbed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import operator_factories as factories
import pytest
from kuberay_standin import KubeRayStandIn

from tests.controlplane import cluster, kubeconfig
from tests.reliability import churn, fault_proxy, kube_async, operator_runner
from trainop.controller import rbac

pytestmark = pytest.mark.controlplane


def operator_token(plane: cluster.ControlPlane, namespace: str) -> str:
    """A token of ServiceAccount ``trainop-operator`` bound to a ClusterRole of exactly OPERATOR_RULES."""
    name = f"trainop-operator-{namespace}"[:63]
    for path, body in [
        ("/apis/rbac.authorization.k8s.io/v1/clusterroles", {"rules": rbac.OPERATOR_RULES}),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": "trainop-operator", "namespace": namespace}],
            },
        ),
    ]:
        code, out = plane.request(
            "POST", path, body=json.dumps({"metadata": {"name": name}, **body}).encode()
        )
        assert code in (201, 409), out
    return plane.service_account_token(namespace, "trainop-operator")


@contextlib.asynccontextmanager
async def running_proxy(
    plane: cluster.ControlPlane, **faults: float
) -> AsyncIterator[fault_proxy.FaultProxy]:
    """The proxy serves from the test's own event loop (an async fixture would run on another one)."""
    proxy = fault_proxy.FaultProxy(plane.server_url, plane.pki.ca_cert_path, seed=7, **faults)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


def kubeconfig_through(
    proxy: fault_proxy.FaultProxy, plane: cluster.ControlPlane, namespace: str, tmp_path: Path
) -> Path:
    return kubeconfig.write(
        tmp_path / "operator-through-proxy.kubeconfig",
        server=proxy.url,
        ca_cert_path=plane.pki.ca_cert_path,
        token=operator_token(plane, namespace),
        namespace=namespace,
        user="trainop-operator",
    )


async def test_conflicts_throttling_5xx_and_lost_responses_are_retried_and_a_churn_still_converges(
    isolated_plane: cluster.ControlPlane,
    isolated_namespace: str,
    make_operator: Callable[..., operator_runner.Operator],
    tmp_path: Path,
) -> None:
    plans = churn.plan_jobs(random.Random(11), 24, spread_s=6)
    async with (
        running_proxy(isolated_plane, write_fault_rate=0.2, lost_response_rate=0.1) as proxy,
        kube_async.AsyncApi.for_plane(isolated_plane) as api,
    ):
        operator = make_operator(
            isolated_namespace,
            kubeconfig=kubeconfig_through(proxy, isolated_plane, isolated_namespace, tmp_path),
        )
        await operator.start_async()
        scenario = churn.Churn(api, isolated_namespace, plans)
        await scenario.run(timeout_s=240, disrupt=churn.watchdog(lambda: operator.running, "the operator"))
        problems = await churn.verify(scenario)
        errors = await asyncio.to_thread(operator.reconciles, "error")

    assert not problems, "\n".join(problems[:40])
    # The faults reached the operator (so this test exercised them) and it retried rather than died.
    assert {"409", "429", "500", "503", "lost-response"} <= {k for k, v in proxy.injected.items() if v}, dict(
        proxy.injected
    )
    assert errors > 0
    assert operator.running and operator.starts == 1


async def test_a_watch_that_goes_silent_is_re_established_and_the_missed_change_is_acted_on(
    isolated_plane: cluster.ControlPlane,
    isolated_namespace: str,
    make_operator: Callable[..., operator_runner.Operator],
    tmp_path: Path,
) -> None:
    ns = isolated_namespace
    kuberay = KubeRayStandIn(isolated_plane)
    async with running_proxy(isolated_plane) as proxy, kube_async.AsyncApi.for_plane(isolated_plane) as api:
        operator = make_operator(
            ns,
            kubeconfig=kubeconfig_through(proxy, isolated_plane, ns, tmp_path),
            args=["--watch-inactivity-timeout=3"],
        )
        await operator.start_async()
        job_path = f"/apis/trainop.dev/v1alpha1/namespaces/{ns}/trainingjobs"
        await api.create(job_path, factories.manifest("mlp", ns))

        async def phase() -> str | None:
            return ((await api.get(f"{job_path}/mlp")) or {}).get("status", {}).get("phase")

        async def wait_for(what: str, check: Callable[[], object], timeout_s: float) -> None:
            try:
                async with asyncio.timeout(timeout_s):
                    while not await check():  # type: ignore[misc]
                        await asyncio.sleep(0.1)
            except TimeoutError:
                raise AssertionError(f"no {what} within {timeout_s}s") from None

        rayjob = f"/apis/ray.io/v1/namespaces/{ns}/rayjobs"
        await wait_for("RayJob a1", lambda: api.get(f"{rayjob}/mlp-a1"), 30)
        await asyncio.to_thread(kuberay.run, ns, "mlp-a1")
        await wait_for("Running", lambda: _equals(phase(), "Running"), 30)

        frozen = proxy.freeze_watches()
        opened_before = proxy.watches_opened
        assert frozen >= 4, f"only {frozen} watch streams open"  # owners, RayJobs, claims, pods at least
        await asyncio.to_thread(kuberay.fail, ns, "mlp-a1", "lost the head node")
        # Nothing else would wake the operator: no timer is due while a job runs, and the RayJob's
        # change reaches it only through a watch. 3 s of silence, then a new watch from the last version.
        await wait_for("RayJob a2 after the failure", lambda: api.get(f"{rayjob}/mlp-a2"), 30)

        status = (await api.get(f"{job_path}/mlp") or {}).get("status", {})
    assert [f["message"] for f in status["failures"]] == [
        "AppFailed: lost the head node"
    ]  # KubeRay reason: message (class Unknown)
    assert proxy.frozen_closed_by_client > 0 and proxy.watches_opened > opened_before


async def _equals(value: object, expected: object) -> bool:
    return await value == expected  # type: ignore[misc]
