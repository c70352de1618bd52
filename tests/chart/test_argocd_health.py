"""The Argo CD health checks for TrainingJob and TuningSweep, run on Argo CD's own test cases.

Each kind's check lives in charts/trainop/argocd/resource_customizations/trainop.dev/<Kind>/ in Argo CD's
layout: health.lua, health_test.yaml (expected status and message per fixture) and testdata/*.yaml. Every
case runs twice:

- in Lua 5.1 (lupa), the language version of gopher-lua;
- in gopher-lua itself, Argo CD's interpreter (tests/chart/argocd_lua, built with Go into the cache).

Both are sandboxed like Argo CD's custom checks from argocd-cm: base, package, table and an os reduced to
time/date; no string or math library and no string methods. A check that uses string.format passes in a
plain Lua and fails in Argo CD; here it fails too (see test_sandbox_*).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import lupa.lua51
import pydantic
import pytest
import yaml

from tests.controlplane import assets
from trainop.api import trainingjob, tuningsweep

from .conftest import CHART_DIR, require_tool

ARGOCD_DIR = CHART_DIR / "argocd"
CUSTOMIZATIONS = ARGOCD_DIR / "resource_customizations" / "trainop.dev"
KINDS = ("TrainingJob", "TuningSweep")
# Every check in the Argo CD layout, trainop's and the optional Application one: "<group>/<Kind>" -> dir.
CHECKS = {
    f"{path.parent.parent.name}/{path.parent.name}": path.parent
    for path in sorted((ARGOCD_DIR / "resource_customizations").glob("*/*/health.lua"))
}
GOPHER_SOURCE = Path(__file__).resolve().parent / "argocd_lua"
VALID_STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}


class KubernetesLoader(yaml.SafeLoader):
    """YAML as the apiserver serves it: timestamps stay strings (PyYAML would make datetimes)."""


KubernetesLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load(path: Path) -> Any:
    return yaml.load(path.read_text(), Loader=KubernetesLoader)


def _dir(kind: str) -> Path:
    """A check's directory, by Kind (trainop's) or by "<group>/<Kind>"."""
    return CHECKS.get(kind) or CUSTOMIZATIONS / kind


def health_script(kind: str) -> str:
    return (_dir(kind) / "health.lua").read_text()


def cases(kind: str) -> list[tuple[str, dict[str, str]]]:
    """(inputPath, expected healthStatus) for every case of the check's health_test.yaml."""
    spec = load(_dir(kind) / "health_test.yaml")
    return [(case["inputPath"], case["healthStatus"]) for case in spec["tests"]]


ALL_CASES = [(check, path, expected) for check in CHECKS for path, expected in cases(check)]


# -------------------------------------------------------------------------------------- Lua 5.1 (lupa)
_SANDBOX = """
local safe_os = {time = os.time, date = os.date}
debug.setmetatable("", nil)  -- no ("x"):upper() without the string library, as in gopher-lua
string, math, io, debug, coroutine, python = nil, nil, nil, nil, nil, nil
for _, name in ipairs({"string", "math", "io", "debug", "coroutine"}) do package.loaded[name] = nil end
os = safe_os
package.loaded.os = safe_os
"""


def _to_lua(runtime: Any, value: Any) -> Any:
    """JSON-like Python value -> Lua value, as Argo CD's decodeValue does (arrays 1-based, null = nil)."""
    if isinstance(value, dict):
        table = runtime.table()
        for key, item in value.items():
            table[key] = _to_lua(runtime, item)
        return table
    if isinstance(value, list):
        table = runtime.table()
        for index, item in enumerate(value, start=1):
            table[index] = _to_lua(runtime, item)
        return table
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    return float(value)


def run_lua51(script: str, obj: dict[str, Any]) -> dict[str, str]:
    runtime = lupa.lua51.LuaRuntime(register_eval=False, register_builtins=False)
    runtime.execute(_SANDBOX)
    runtime.globals().obj = _to_lua(runtime, obj)
    returned = runtime.execute(script)
    assert lupa.lua51.lua_type(returned) == "table", f"health.lua returned {returned!r}, not a table"
    return {"status": returned["status"], "message": returned["message"]}


@pytest.mark.parametrize(
    ("kind", "input_path", "expected"), ALL_CASES, ids=[f"{k}-{Path(p).stem}" for k, p, _ in ALL_CASES]
)
def test_health_in_lua51_matches_the_expected_status_and_message(
    kind: str, input_path: str, expected: dict[str, str]
) -> None:
    obj = load(_dir(kind) / input_path)
    assert run_lua51(health_script(kind), obj) == expected


# ----------------------------------------------------------------------------------------- gopher-lua
@pytest.fixture(scope="session")
def gopher_lua() -> Path:
    """The argocd-lua helper binary, built once per source version into the trainop cache."""
    go = assets.find_go()
    if go is None:
        require_tool("Go toolchain", "needed to build the gopher-lua runner (tests/chart/argocd_lua)")
    assert go is not None
    digest = hashlib.sha256(
        b"".join((GOPHER_SOURCE / name).read_bytes() for name in ("go.mod", "go.sum", "main.go"))
    ).hexdigest()[:16]
    binary = assets.cache_root() / "argocd-lua" / digest / "argocd-lua"
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
        build = subprocess.run(
            [str(go), "build", "-trimpath", "-o", str(binary) + ".tmp", "."],
            cwd=GOPHER_SOURCE,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if build.returncode != 0:
            pytest.fail(f"building tests/chart/argocd_lua failed:\n{build.stderr}", pytrace=False)
        Path(str(binary) + ".tmp").rename(binary)
    return binary


def run_gopher(binary: Path, script: str, objects: list[dict[str, Any]]) -> list[dict[str, str]]:
    result = subprocess.run(
        [str(binary)],
        input=json.dumps({"script": script, "objects": objects}),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    results: list[dict[str, str]] = json.loads(result.stdout)
    return results


@pytest.mark.parametrize("kind", sorted(CHECKS))
def test_health_in_gopher_lua_matches_the_expected_status_and_message(gopher_lua: Path, kind: str) -> None:
    kind_cases = cases(kind)
    objects = [load(_dir(kind) / path) for path, _ in kind_cases]
    got = run_gopher(gopher_lua, health_script(kind), objects)
    assert dict(zip([p for p, _ in kind_cases], got, strict=True)) == {
        path: expected for path, expected in kind_cases
    }


# ---------------------------------------------------------------------------------- the sandbox bites
NEEDS_STRING_LIBRARY = 'return {status = "Healthy", message = string.format("%d", 1)}'
NEEDS_STRING_METHOD = 'local s = "x"; return {status = "Healthy", message = s:upper()}'


@pytest.mark.parametrize(
    "script", [NEEDS_STRING_LIBRARY, NEEDS_STRING_METHOD], ids=["string.format", "s:upper"]
)
def test_sandbox_of_lua51_refuses_the_string_library_like_argo_cd(script: str) -> None:
    with pytest.raises(lupa.lua51.LuaError):
        run_lua51(script, {})


@pytest.mark.parametrize(
    "script", [NEEDS_STRING_LIBRARY, NEEDS_STRING_METHOD], ids=["string.format", "s:upper"]
)
def test_sandbox_of_gopher_lua_refuses_the_string_library_like_argo_cd(gopher_lua: Path, script: str) -> None:
    (result,) = run_gopher(gopher_lua, script, [{}])
    assert result.get("error") and not result["status"], result


# ------------------------------------------------------------------------------------------ coverage
@pytest.mark.parametrize("kind", KINDS)
def test_cases_cover_every_phase_no_status_generation_lag_and_deletion(kind: str) -> None:
    seen_phases = set()
    lagging = deleting = without_status = False
    for path, expected in cases(kind):
        assert expected["status"] in VALID_STATUSES
        obj = load(CUSTOMIZATIONS / kind / path)
        status, meta = obj.get("status"), obj["metadata"]
        if meta.get("deletionTimestamp"):
            deleting = True
        elif not status:
            without_status = True
        elif status.get("observedGeneration", meta["generation"]) < meta["generation"]:
            lagging = True
            assert expected["status"] == "Progressing"
        else:
            seen_phases.add(status["phase"])
    assert {phase.value for phase in trainingjob.Phase} <= seen_phases
    assert lagging and deleting and without_status


@pytest.mark.parametrize("kind", KINDS)
def test_every_fixture_is_a_valid_object_of_the_api(kind: str) -> None:
    model = {"TrainingJob": trainingjob.TrainingJob, "TuningSweep": tuningsweep.TuningSweep}[kind]
    for path, _ in cases(kind):
        obj = load(CUSTOMIZATIONS / kind / path)
        status = obj.get("status", {})
        if status.get("phase") not in {p.value for p in trainingjob.Phase} | {None}:
            continue  # the deliberately unknown phase
        if any(c["type"] == "SpecValid" and c["status"] == "False" for c in status.get("conditions", [])):
            with pytest.raises(pydantic.ValidationError):  # the deliberately invalid edit
                model.model_validate(obj)
            continue
        model.model_validate(obj)


def test_every_testdata_file_is_used_by_a_case() -> None:
    assert {"trainop.dev/TrainingJob", "trainop.dev/TuningSweep", "argoproj.io/Application"} <= set(CHECKS)
    for check in CHECKS:
        used = {Path(path).name for path, _ in cases(check)}
        present = {path.name for path in (_dir(check) / "testdata").glob("*.yaml")}
        assert used == present, check


# ----------------------------------------------------------------------------------------- snippets
def _render_snippets() -> dict[str, str]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("render_snippets", ARGOCD_DIR / "render_snippets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {name: render() for name, render in module.SNIPPETS.items()}


def test_snippets_are_up_to_date() -> None:
    for name, text in _render_snippets().items():
        assert (ARGOCD_DIR / name).read_text() == text, (
            f"charts/trainop/argocd/{name} is stale: run python charts/trainop/argocd/render_snippets.py"
        )


def test_argocd_cm_snippet_installs_both_checks_under_argo_cd_keys() -> None:
    config_map = load(ARGOCD_DIR / "argocd-cm.yaml")
    assert (config_map["kind"], config_map["metadata"]["name"]) == ("ConfigMap", "argocd-cm")
    assert config_map["data"] == {
        f"resource.customizations.health.trainop.dev_{kind}": health_script(kind) for kind in KINDS
    }
    helm_values = load(ARGOCD_DIR / "argo-cd-values.yaml")
    assert helm_values["configs"]["cm"] == config_map["data"]
    app_of_apps = load(ARGOCD_DIR / "argocd-cm-app-of-apps.yaml")
    assert app_of_apps["data"] == {
        "resource.customizations.health.argoproj.io_Application": health_script("argoproj.io/Application")
    }
