"""pytest plugin: a private control plane for the reliability and security tiers, and an operator on it.

Why not the session's shared ``control_plane``: these tests restart kube-apiserver and etcd (which would
disturb every other test), and they run their own operator process, whose log and metrics they read; the
operator tier's shared cluster-wide operator would reconcile their namespaces too if it ran on the same
cluster (two writers on one object is not a fault these tests mean to inject). So this plugin starts one
more ``ControlPlane`` (about 8 s and 0.7 GiB) the first time a test asks for ``isolated_plane``, shared by
every test that does, and stops it at the end of the session.

Registered from both tests/reliability/conftest.py and tests/security/conftest.py with
``pluginmanager.import_plugin`` (once: pytest refuses ``pytest_plugins`` outside the root conftest), so
the two directories share one plane. Tests using it are marked ``controlplane`` automatically (through
``control_plane_assets``). A failing test gets the plane's log tails and its operator's log attached.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import session_beds
from tests.controlplane import assets, cluster, crds
from tests.reliability import operator_runner

_PLANE = pytest.StashKey[cluster.ControlPlane]()
_OPERATORS = pytest.StashKey[list[operator_runner.Operator]]()


@pytest.fixture(scope="session")
def isolated_plane(
    request: pytest.FixtureRequest, control_plane_assets: assets.Assets
) -> Iterator[cluster.ControlPlane]:
    plane = cluster.ControlPlane(
        assets=control_plane_assets,
        settings=cluster.ControlPlaneSettings(crd_paths=crds.default_crd_paths()),
    )
    plane.start()
    request.config.stash[_PLANE] = plane
    session_beds.register("isolated control plane", plane.stop)
    try:
        yield plane
    finally:
        del request.config.stash[_PLANE]
        session_beds.unregister("isolated control plane")
        plane.stop()


@pytest.fixture
def isolated_namespace(isolated_plane: cluster.ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].rstrip("-")
    name = isolated_plane.create_namespace(f"{slug}-{uuid.uuid4().hex[:6]}")
    yield name
    isolated_plane.delete_namespace(name)


@pytest.fixture
def make_operator(
    request: pytest.FixtureRequest, isolated_plane: cluster.ControlPlane, tmp_path: Path
) -> Iterator[Callable[..., operator_runner.Operator]]:
    """``make_operator(namespace, args=[...], env={...}, kubeconfig=...)``: an operator process on the
    isolated plane (not started); every one made is stopped after the test."""
    made: list[operator_runner.Operator] = []
    request.config.stash[_OPERATORS] = made

    def make(namespace: str, **kwargs: Any) -> operator_runner.Operator:
        kwargs.setdefault("kubeconfig", isolated_plane.kubeconfig_path)
        operator = operator_runner.Operator(
            namespaces=[namespace], log_path=tmp_path / f"operator-{len(made)}.log", **kwargs
        )
        made.append(operator)
        return operator

    yield make
    for operator in made:
        operator.stop()
    del request.config.stash[_OPERATORS]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        plane = item.config.stash.get(_PLANE, None)
        if plane is not None:
            report.sections.append(("isolated control plane logs", plane.log_tails()))
        for operator in item.config.stash.get(_OPERATORS, []):
            tail = "\n".join(operator.log().splitlines()[-80:])
            report.sections.append((f"operator log {operator.log_path.name}", tail))
    return report
