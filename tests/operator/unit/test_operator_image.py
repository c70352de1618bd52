"""The operator image's install steps (operator/Dockerfile), without Docker (there is no container engine
here, so the Dockerfile itself is only read, not built): build the wheel as its first stage does, install
it into a fresh environment, and run the entry points the Helm chart runs. Also: the ``operator`` extra
pulls neither torch nor Ray, and the operator's code imports neither."""

from __future__ import annotations

import email.parser
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "operator" / "Dockerfile"
HEAVY = ("torch", "torchvision", "ray")


def _run(*args: str, cwd: pathlib.Path | None = None) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=cwd)
    assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("operator-image")
    source = root / "src"  # what the Dockerfile's first stage copies
    source.mkdir()
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            *names, _ = line.split()[1:]
            for name in names:
                path = REPO / name.rstrip("/")
                if path.is_dir():
                    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
                    shutil.copytree(path, source / name.rstrip("/"), ignore=ignore)
                else:
                    shutil.copy(path, source / name)
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(root),
        str(source),
    )
    (built,) = root.glob("trainop-*.whl")
    return built


def _requirements(wheel: pathlib.Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    return metadata.get_all("Requires-Dist") or []


def test_the_operator_extra_pulls_neither_torch_nor_ray(wheel: pathlib.Path) -> None:
    wanted = [
        r
        for r in _requirements(wheel)
        if "extra ==" not in r or re.search(r"""extra == ["']operator["']""", r)
    ]
    names = {re.split(r"[\s\[<>=!~;(]", r, maxsplit=1)[0].lower() for r in wanted}
    assert {"kopf", "kubernetes", "pydantic", "prometheus-client"} <= names, names
    assert not names & set(HEAVY), names


def test_the_installed_wheel_runs_the_commands_the_chart_runs_without_importing_torch_or_ray(
    wheel: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", str(venv))
    site = next((venv / "lib").glob("python3*/site-packages"))
    # The operator's dependencies from this environment (a path entry), so nothing is downloaded.
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    python = str(venv / "bin" / "python")
    _run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", str(wheel))
    script = (
        "import sys, trainop.cli, trainop.controller.main, trainop.controller.__main__\n"
        "print(trainop.cli.__file__)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))\n"
    )
    where, heavy = _run(python, "-c", script, cwd=tmp_path).split("\n")[:2]
    assert where.startswith(str(venv)), where  # the wheel's copy, not the source tree
    assert heavy == "[]", heavy
    chart_args = _chart_args()
    assert chart_args[0] == "operator" and len(chart_args) >= 6, chart_args
    usage = _run(str(venv / "bin" / "trainop"), chart_args[0], "--help", cwd=tmp_path)
    for flag in {a.split("=")[0] for a in chart_args[1:]}:
        assert flag in usage, flag


def _chart_args() -> list[str]:
    """The operator container's args in the chart's deployment template (the literal ones)."""
    template = (REPO / "charts" / "trainop" / "templates" / "deployment.yaml").read_text()
    block = template.split("args:", 1)[1].split("env:", 1)[0]
    return [m.group(1) for m in re.finditer(r"^\s+- (--?[a-z-]+=?|operator)", block, re.M)]


def test_the_dockerfile_installs_the_operator_extra_and_runs_as_the_charts_user() -> None:
    text = DOCKERFILE.read_text()
    assert '"${WHEEL}[operator]"' in text
    assert 'ENTRYPOINT ["trainop"]' in text
    values = yaml.safe_load((REPO / "charts" / "trainop" / "values.yaml").read_text())
    context = values["podSecurityContext"]
    assert f"USER {context['runAsUser']}:{context['runAsGroup']}" in text
    assert values["image"]["repository"] in text  # the build command names the chart's image
