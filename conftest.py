"""Root pytest configuration: registers the control-plane fixtures for every test directory.

The fixtures (a real kube-apiserver + etcd + kube-controller-manager, session-scoped, and a namespace
per test) live in tests/controlplane/fixtures.py; see docs/controlplane.md.
"""

import pytest

pytest_plugins = ["tests.controlplane.fixtures"]


def pytest_runtest_setup(item: "pytest.Item") -> None:
    """Stop the operator tests' shared, cluster-wide operator before any test outside tests/operator.

    It watches every namespace of the shared control plane, so it would reconcile the TrainingJobs that
    trainer and sweep tests create and overwrite the operator-owned status fields they assert on. The
    operator tests' ``operator`` fixture starts it again when they need it.
    """
    process = getattr(item.config, "trainop_shared_operator", None)
    if process is not None and process.running and "/tests/operator/" not in str(item.path):
        process.stop()
