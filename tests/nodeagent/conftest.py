"""Fixtures of the node agent's tier: one bed (network + control plane + agent) for the session.

``agent_bed`` starts :class:`harness.AgentHarness` with two nodes (``node-a`` advertising one
``nvidia.com/gpu``, ``node-b``) and short back-offs (2 s doubling to 8 s) so restart paths show within
seconds; ``pod_namespace`` is a fresh namespace on it whose ``default`` ServiceAccount and
``kube-root-ca.crt`` exist (pods cannot be admitted, or get their token volume, before that). The tier
needs root (network namespaces, mounts, cgroups): without it, it is skipped with one line.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest

from tests import session_beds
from tests.controlplane import assets

from . import harness, kit

NODE_A = {
    "name": "node-a",
    "capacity": {"cpu": "4", "memory": "8Gi", "pods": "30", "nvidia.com/gpu": "1"},
    "labels": {"trainop.dev/pool": "gpu"},
}
NODE_B = {"name": "node-b", "capacity": {"cpu": "2", "memory": "4Gi", "pods": "30"}}


@pytest.fixture(scope="session")
def agent_bed(control_plane_assets: assets.Assets) -> Iterator[harness.AgentHarness]:
    if os.geteuid() != 0:
        pytest.skip("the node agent needs root (network namespaces, mounts, cgroups)")
    settings = harness.HarnessSettings(
        nodes=(NODE_A, NODE_B),
        images=kit.IMAGES,
        backoff_initial_s=2.0,
        backoff_max_s=8.0,
        keep_data_dir=os.environ.get("TRAINOP_CONTROLPLANE_KEEP", "") not in ("", "0"),
    )
    with harness.AgentHarness(assets=control_plane_assets, settings=settings) as bed:
        session_beds.register("node agent bed", bed.stop)
        try:
            yield bed
        finally:
            session_beds.unregister("node agent bed")


@pytest.fixture
def pod_namespace(agent_bed: harness.AgentHarness, request: pytest.FixtureRequest) -> Iterator[kit.Namespace]:
    assert agent_bed.plane is not None
    name = f"na-{request.node.name[5:25].lower().replace('_', '-').strip('-')}-{uuid.uuid4().hex[:6]}"
    agent_bed.plane.create_namespace(name)
    namespace = kit.Namespace(agent_bed, name)
    deadline = time.monotonic() + 60
    while not (
        namespace.exists("serviceaccounts/default") and namespace.exists("configmaps/kube-root-ca.crt")
    ):
        assert time.monotonic() < deadline, "default ServiceAccount / kube-root-ca.crt never appeared"
        time.sleep(0.1)
    yield namespace
    agent_bed.plane.delete_namespace(name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    report = yield
    bed = item.funcargs.get("agent_bed") if hasattr(item, "funcargs") else None
    if report.failed and isinstance(bed, harness.AgentHarness):
        report.sections.append(("node agent log", bed.log_tail(80)))
    return report
