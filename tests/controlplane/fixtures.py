"""pytest plugin for the ``controlplane`` tier: one real control plane per test session.

Register it from the root conftest (``pytest_plugins = ["tests.controlplane.fixtures"]``). It owns:

- the ``controlplane`` marker; any test that uses the ``control_plane`` fixture (directly or through
  ``namespace``) is marked automatically, so ``-m "not controlplane"`` gives the fast tier;
- ``control_plane`` (session scope): builds missing binaries with build.sh when a Go toolchain exists
  (progress goes to the terminal, a cold build takes many minutes), starts etcd + kube-apiserver +
  kube-controller-manager with our CRDs (``crds/*.yaml``) and KubeRay's installed, and stops it at the end;
- ``namespace`` (function scope): a fresh namespace named after the test, deleted afterwards without
  waiting (the namespace controller finishes it in the background);
- when nothing can provide kube-apiserver and etcd (no cache, no ``KUBEBUILDER_ASSETS``, no Go), the
  whole tier is deselected with one loud line saying how to enable it (deselected rather than skipped so
  ``-ra`` does not repeat the reason once per test); under ``CI=true`` the run stops there instead, with
  the same sentence (tests/tier_gate.py: CI never passes on a tier that did not run);
- a test that needs a binary this machine lacks (helm, kubectl, ...: ``assets.AssetsUnavailable``) is
  skipped naming it (failed under ``CI=true``); KubeRay CRDs missing with no Go to fetch them skips the
  whole tier the same way;
- a failed tier test gets the control plane's log tails attached to its report.

Isolation assumptions, stated because they are not enforced:

- Tests share one cluster. They must work inside their ``namespace`` and give any cluster-scoped object
  they create (ClusterRole, CRD, Namespace) a unique name; they must not delete or edit the installed CRDs.
- pytest-xdist: every worker process has its own session, so each worker starts its own control plane
  (about 0.7 GiB RSS and 6-8 s each on 2 cores) on its own ports and data dir. That is correct but costly
  on a 2-core machine; run this tier with ``-p no:xdist`` or ``-n 0`` unless cores are plentiful.
  Concurrent builds from several workers are serialised by build.sh's lock file.
- Set ``TRAINOP_CONTROLPLANE_KEEP=1`` to keep the data dir (logs, etcd data, kubeconfig) after the session,
  and ``TRAINOP_CONTROLPLANE_CRD_DIR`` to install CRDs from another directory than ``crds/``.
- A CRD in ``crds/`` that the apiserver rejects fails the fixture (every tier test errors with the
  apiserver's message): the operator's tests cannot mean anything without its CRDs.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests import session_beds, tier_gate

from . import assets, cluster, crds

MARKER = "controlplane"
#: Directory of CRD YAML to install instead of the repository's crds/ (an empty dir installs none).
CRD_DIR_ENV = "TRAINOP_CONTROLPLANE_CRD_DIR"
_PLANE = pytest.StashKey[cluster.ControlPlane]()
_UNAVAILABLE = (
    "controlplane tier NOT RUN: no kube-apiserver/etcd and no Go toolchain; "
    f"to enable it, {assets.HOW_TO_ENABLE}"
)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_TierGate(), "trainop-controlplane-tier-gate")
    config.addinivalue_line(
        "markers",
        f"{MARKER}: needs the real kube-apiserver + etcd control plane (tests/controlplane); "
        "deselected with one line when no binaries and no Go toolchain are available",
    )


def _say(config: pytest.Config, line: str, **markup: bool) -> None:
    """Write a line to the real terminal even while pytest captures output (as live logging does)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return
    if capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(line, **markup)
    else:
        reporter.write_line(line, **markup)


@pytest.hookimpl(tryfirst=True)  # before -m deselection, so auto-added markers count
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixture_names = getattr(item, "fixturenames", ())
        uses_plane = "control_plane" in fixture_names or "control_plane_assets" in fixture_names
        if uses_plane and item.get_closest_marker(MARKER) is None:
            item.add_marker(MARKER)


class _TierGate:
    """Deselects the tier, with one loud line, when nothing here can provide kube-apiserver and etcd.

    A separate plugin object because it must run after -m/-k deselection (trylast) while the marking
    above must run before it (tryfirst); one module cannot hold two implementations of a hook.
    """

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        tier = [item for item in items if item.get_closest_marker(MARKER) is not None]
        if not tier or assets.resolve().runnable or assets.find_go() is not None:
            return
        if tier_gate.in_ci():
            raise pytest.UsageError(
                f"CI=true, but the controlplane tier ({len(tier)} tests) cannot run: no kube-apiserver/etcd "
                f"and no Go toolchain; {assets.HOW_TO_ENABLE}"
            )
        config.hook.pytest_deselected(items=tier)
        items[:] = [item for item in items if item.get_closest_marker(MARKER) is None]
        _say(config, f"{_UNAVAILABLE} ({len(tier)} tests deselected)", yellow=True, bold=True)


@pytest.fixture(scope="session")
def control_plane_assets(request: pytest.FixtureRequest) -> assets.Assets:
    """Resolved binaries, built first when missing and Go is available; skips the test otherwise.

    A failed build is an error, not a skip: Go is there, so the tier is expected to run.
    """
    config = request.config
    try:
        return assets.ensure(build=True, on_line=lambda line: _say(config, line))
    except assets.AssetsUnavailable as error:
        tier_gate.missing_tool("the control plane", str(error))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """A test reaching for a binary this machine lacks (helm, kubectl, ...) is skipped, naming it."""
    try:
        return (yield)
    except assets.AssetsUnavailable as error:
        tier_gate.missing_tool("a control-plane binary", str(error))


@pytest.fixture(scope="session")
def control_plane(
    request: pytest.FixtureRequest, control_plane_assets: assets.Assets
) -> Iterator[cluster.ControlPlane]:
    """The session's running control plane (admin kubeconfig at ``.kubeconfig_path``)."""
    config = request.config
    resolved = control_plane_assets
    settings = cluster.ControlPlaneSettings(
        crd_paths=crds.default_crd_paths(Path(os.environ.get(CRD_DIR_ENV) or crds.DEFAULT_CRD_DIR)),
        keep_data_dir=os.environ.get("TRAINOP_CONTROLPLANE_KEEP", "") not in ("", "0"),
    )
    try:
        plane = cluster.ControlPlane(assets=resolved, settings=settings)
    except assets.AssetsUnavailable as error:  # e.g. KubeRay CRDs absent and no Go to fetch them
        tier_gate.missing_tool("the KubeRay CRDs", str(error))
    plane.start()
    config.stash[_PLANE] = plane
    session_beds.register("shared control plane", plane.stop)
    timings = ", ".join(f"{phase} {seconds:.1f}s" for phase, seconds in plane.timings.items())
    _say(config, f"control plane {plane.server_url} up ({timings}); data dir {plane.data_dir}")
    try:
        yield plane
    finally:
        del config.stash[_PLANE]
        session_beds.unregister("shared control plane")
        plane.stop()


def _namespace_prefix(test_name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")
    return slug[:40].rstrip("-") + "-"


@pytest.fixture
def namespace(control_plane: cluster.ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for this test, e.g. ``test-gc-removes-child-3f2a9c1b0d``; deleted afterwards."""
    name = control_plane.create_namespace(f"{_namespace_prefix(request.node.name)}{uuid.uuid4().hex[:10]}")
    yield name
    control_plane.delete_namespace(name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    plane = item.config.stash.get(_PLANE, None)
    if report.failed and plane is not None and item.get_closest_marker(MARKER) is not None:
        report.sections.append(("control plane logs", plane.log_tails()))
    return report
