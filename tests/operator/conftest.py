"""Shared set-up of the operator's tests (tests/operator/**).

- Makes the helper modules importable in any import mode: ``operator_factories`` (manifests shared by
  both tiers), ``state_machine_cases`` (unit), ``cluster_api``, ``operator_process``, ``kuberay_standin``
  (integration).
- Registers the control-plane pytest plugin (``tests.controlplane.fixtures``: ``control_plane``,
  ``namespace``) only if the root conftest has not (it does, with ``pytest_plugins``): registering it
  twice would start two control planes, and pytest refuses ``pytest_plugins`` outside the root conftest.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
for path in (HERE, HERE / "unit", HERE / "integration", REPO_ROOT):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

CONTROLPLANE_PLUGIN = "tests.controlplane.fixtures"


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin(CONTROLPLANE_PLUGIN):
        config.pluginmanager.import_plugin(CONTROLPLANE_PLUGIN)
