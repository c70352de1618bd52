"""Reliability tier: the operator under SIGKILL churn, control-plane restarts and a fault-injecting proxy.

Makes the operator tests' helpers importable (``operator_factories``, ``cluster_api``,
``kuberay_standin``) and registers the private control plane plugin (``isolated_plane``: why a second
plane is there). Every test here needs it and is marked ``controlplane``; the long ones also ``slow``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
for path in (REPO_ROOT / "tests" / "operator", REPO_ROOT / "tests" / "operator" / "integration", REPO_ROOT):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

PLUGIN = "tests.reliability.isolated_plane"


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin(PLUGIN):
        config.pluginmanager.import_plugin(PLUGIN)
