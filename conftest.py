"""Root pytest configuration: the control-plane, S3 and MLflow fixtures and the tiers plugin, everywhere.

The fixtures (a real kube-apiserver + etcd + kube-controller-manager, session-scoped, and a namespace
per test) live in tests/controlplane/fixtures.py; see docs/controlplane.md. tests/tiers.py assigns every
test a tier and a timeout, prints the per-tier counts and, under CI=true, fails a run in which a tier did
not run or a test was skipped outside the GPU allow-list (docs/reliability.md, "CI").
"""

from pathlib import Path

import pytest

from tests import session_beds

# pytester: tests/unit/test_tier_gate.py runs small inner pytest sessions under the tiers plugin.
pytest_plugins = [
    "tests.controlplane.fixtures",
    "tests.objectstore.fixtures",
    "tests.mlflow_server",
    "tests.tiers",
    "tests.property_seed",
    "pytester",
    # ast.parse under one lock: e2e scenario threads and pytest's report formatting (CPython 3.11 bug).
    "tests.ast_lock",
]


def pytest_runtest_setup(item: "pytest.Item") -> None:
    """Stop the operator tests' shared, cluster-wide operator before any test outside tests/operator.

    It watches every namespace of the shared control plane, so it would reconcile the TrainingJobs that
    trainer and sweep tests create and overwrite the operator-owned status fields they assert on. The
    operator tests' ``operator`` fixture starts it again when they need it.
    """
    _stop_beds_before_e2e(item)
    process = getattr(item.config, "trainop_shared_operator", None)
    if process is not None and process.running and "/tests/operator/" not in str(item.path):
        process.stop()


_BEDS_STOPPED = pytest.StashKey[bool]()


def _stop_beds_before_e2e(item: "pytest.Item") -> None:
    """Before the first test after which only e2e tests remain: stop the earlier tiers' beds (the shared
    and isolated control planes, the node agent's bed, the trainer tier's Ray runtime; tests/session_beds.py),
    so the e2e scenarios' Ray pods get the cores. Checked once per run, O(items)."""
    if item.config.stash.get(_BEDS_STOPPED, False):
        return
    e2e = Path(item.config.rootpath) / "e2e"
    if not Path(item.path).is_relative_to(e2e):
        return
    items = item.session.items
    later = items[items.index(item) :]
    if all(Path(other.path).is_relative_to(e2e) for other in later):
        item.config.stash[_BEDS_STOPPED] = True
        stopped = session_beds.stop_all()
        if stopped:
            reporter = item.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(f"\nbefore the e2e tier, stopped: {', '.join(stopped)}")
