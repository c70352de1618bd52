"""Fixtures of the chart tests: the real helm binary, rendering helpers, and the chart's paths.

helm comes from the control plane's asset cache (tests/controlplane/build.sh builds it from the Go module
proxy, pinned in versions.env); when it is missing and a Go toolchain exists, only helm is built. Without
either the helm tests skip with one reason, except under CI=true, where a missing tool is a failure: CI
that silently skips the chart's tests would be green for nothing.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from tests import tier_gate
from tests.controlplane import assets

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "charts" / "trainop"
FULL_VALUES = Path(__file__).resolve().parent / "values-full.yaml"


def require_tool(what: str, why_missing: str) -> NoReturn:
    """Skip (or, in CI, fail) a test whose tool is unavailable (tests/tier_gate.py's policy)."""
    tier_gate.missing_tool(what, why_missing)


@dataclasses.dataclass(frozen=True)
class Helm:
    """The real helm binary with hermetic config/cache/data dirs."""

    binary: Path
    home: Path

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.binary), *args], env=self.env(), capture_output=True, text=True, timeout=120
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def template_args(
        self,
        *,
        values: Sequence[Path] = (),
        set_values: Sequence[str] = (),
        release: str = "trainop",
        namespace: str = "trainop-system",
    ) -> list[str]:
        args = ["template", release, str(CHART_DIR), "--namespace", namespace]
        for path in values:
            args += ["--values", str(path)]
        for item in set_values:
            args += ["--set", item]
        return args

    def template(self, **kwargs: Any) -> list[dict[str, Any]]:
        """Render the chart; return every non-empty document."""
        output = self.run(*self.template_args(**kwargs)).stdout
        return [doc for doc in yaml.safe_load_all(output) if doc]


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    resolved = assets.resolve()
    if resolved.helm is None and assets.find_go() is not None:
        assets.build_missing(["helm"])
        resolved = assets.resolve()
    if resolved.helm is None:
        require_tool("helm", f"not in the asset cache and no Go toolchain; {assets.HOW_TO_ENABLE}")
    assert resolved.helm is not None
    return Helm(binary=resolved.helm, home=tmp_path_factory.mktemp("helm-home"))


def objects_of(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = objects_of(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[d['metadata']['name'] for d in found]}"
    return found[0]
