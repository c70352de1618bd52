"""Fixtures of the monitoring tests: promtool, and the rules and dashboards under test.

promtool is built from Prometheus' Go module by tests/controlplane/build.sh (component ``promtool``,
pinned as PROMETHEUS_VERSION in versions.env, cached next to the control plane), which `make test` runs.
``$PROMTOOL`` or a promtool on PATH is used when the cache has none. Without any, the promtool tests skip
naming the command that builds it, except under CI=true, where a missing tool fails (tests/tier_gate.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import tier_gate
from tests.controlplane import assets

REPO_ROOT = Path(__file__).resolve().parents[2]
MONITORING = REPO_ROOT / "monitoring"
RULES_FILE = MONITORING / "prometheus" / "trainop.rules.yaml"
RULE_TESTS = sorted((MONITORING / "prometheus" / "tests").glob("*.test.yaml"))
DASHBOARDS = sorted((MONITORING / "grafana").glob("*.json"))


HOW_TO_BUILD_PROMTOOL = (
    "run `bash tests/controlplane/build.sh promtool` (needs Go >= 1.26 and the Go module proxy)"
)


def cached_promtool() -> Path | None:
    """build.sh's promtool at the pinned version, if it was built (the layout build.sh writes)."""
    version = assets.read_versions().get("PROMETHEUS_VERSION", "")
    path = assets.cache_root() / "controlplane" / f"promtool-{version}" / "bin" / "promtool"
    return path if version and os.access(path, os.X_OK) else None


@pytest.fixture(scope="session")
def promtool() -> Path:
    found = os.environ.get("PROMTOOL") or cached_promtool() or shutil.which("promtool")
    if not found and assets.find_go() is not None:
        assets.build_missing(["promtool"])
        found = cached_promtool()
    if not found:
        tier_gate.missing_tool("promtool", HOW_TO_BUILD_PROMTOOL)
    return Path(found)


def run_promtool(promtool: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], capture_output=True, text=True, timeout=120, cwd=cwd)
