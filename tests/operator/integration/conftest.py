"""Fixtures of the operator's integration tier: a real control plane, the operator as a process, KubeRay's
stand-in, and the admin API as plain JSON (``cluster_api``). Every test module here is marked
``controlplane``.

One operator process (cluster-wide) is shared by the whole session; a test that needs its own
(namespace-scoped, with failpoints, killed and restarted) takes ``dedicated_operator``, which stops the
shared one for the duration (two operators on one namespace would race).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import kuberay_standin
import operator_process
import pytest
import yaml
from cluster_api import Api

from tests.controlplane import cluster

OPERATOR_KEY = pytest.StashKey[operator_process.OperatorProcess]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    process = item.config.stash.get(OPERATOR_KEY, None)
    if report.failed and process is not None:
        report.sections.append(("operator log", process.log_tail(80)))


@pytest.fixture(scope="session")
def api(control_plane: cluster.ControlPlane) -> Api:
    return Api(control_plane)


@pytest.fixture(scope="session")
def kuberay(control_plane: cluster.ControlPlane) -> kuberay_standin.KubeRayStandIn:
    return kuberay_standin.KubeRayStandIn(control_plane)


@pytest.fixture(scope="session")
def _operator_process(
    request: pytest.FixtureRequest,
    control_plane: cluster.ControlPlane,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[operator_process.OperatorProcess]:
    process = operator_process.OperatorProcess(
        kubeconfig=control_plane.kubeconfig_path, log_dir=tmp_path_factory.mktemp("operator")
    )
    request.config.stash[OPERATOR_KEY] = process
    # The root conftest stops it before tests outside tests/operator (see SHARED_OPERATOR_ATTR there).
    request.config.trainop_shared_operator = process  # type: ignore[attr-defined]
    yield process
    process.stop()


@pytest.fixture
def operator(_operator_process: operator_process.OperatorProcess) -> operator_process.OperatorProcess:
    """The shared, cluster-wide operator, (re)started if a previous test stopped or killed it."""
    if not _operator_process.running:
        _operator_process.start()
    return _operator_process


@pytest.fixture
def dedicated_operator(
    _operator_process: operator_process.OperatorProcess,
) -> operator_process.OperatorProcess:
    """The operator process with the shared one stopped: the test starts, kills and restarts it itself."""
    _operator_process.stop()
    return _operator_process


@pytest.fixture
def apply(control_plane: cluster.ControlPlane) -> Callable[[dict[str, Any]], None]:
    """``kubectl apply -f -`` of a manifest, as a user would."""

    def apply_manifest(obj: dict[str, Any]) -> None:
        control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))

    return apply_manifest
