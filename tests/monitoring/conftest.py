"""Fixtures of the monitoring tests: promtool, and the rules and dashboards under test.

promtool comes from Debian's `prometheus` package (`apt-get install -y prometheus`; .ci/run installs it).
Without it the promtool tests skip with one reason, except under CI=true, where a missing tool fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
MONITORING = REPO_ROOT / "monitoring"
RULES_FILE = MONITORING / "prometheus" / "trainop.rules.yaml"
RULE_TESTS = sorted((MONITORING / "prometheus" / "tests").glob("*.test.yaml"))
DASHBOARDS = sorted((MONITORING / "grafana").glob("*.json"))


def _missing(what: str) -> None:
    message = f"{what} unavailable: install Debian's prometheus package (apt-get install -y prometheus)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def promtool() -> Path:
    found = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if not found:
        _missing("promtool")
    assert found is not None
    return Path(found)


def run_promtool(promtool: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], capture_output=True, text=True, timeout=120, cwd=cwd)
