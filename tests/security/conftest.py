"""Security tier: the operator's RBAC, the trainer's token, Pod Security, and what must never be written.

Shares the reliability tier's private control plane (``tests.reliability.isolated_plane``): these tests
run their own operator process and read its log, which the operator tier's shared cluster-wide operator
on the session plane would muddle. Every test here is marked ``controlplane``.
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
