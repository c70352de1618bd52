"""The image's install steps, without Docker: build the wheel, install it into a fresh environment that
already has torch and Ray (as the base image does), and run the entry points from the installed wheel."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sysconfig

import pytest
import trainer_support

REPO = trainer_support.REPO


def _run(*args: str, cwd: pathlib.Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=cwd, env=env)
    assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A fresh venv with the wheel installed; torch, Ray etc. come from this environment's site-packages
    (a path entry, like a base image's packages), so nothing is downloaded."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"  # what the Dockerfile copies into its build stage
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(REPO / "operator", source / "operator", ignore=ignore)
    shutil.copytree(REPO / "trainer_image", source / "trainer_image", ignore=ignore)
    _run(
        trainer_support.PYTHON,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--wheel-dir",
        str(root / "wheels"),
        str(source),
    )
    (wheel,) = (root / "wheels").glob("trainop-*.whl")

    venv = root / "venv"
    _run(trainer_support.PYTHON, "-m", "venv", "--without-pip", str(venv))
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "base-image-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run(
        trainer_support.PYTHON,
        "-m",
        "pip",
        "--python",
        str(venv / "bin" / "python"),
        "install",
        "--no-deps",
        "--no-index",
        str(wheel),
    )
    return venv / "bin" / "python"


def test_the_wheel_carries_both_packages_and_the_entry_point_comes_from_it(installed: pathlib.Path) -> None:
    where = _run(
        str(installed),
        "-c",
        "import trainop_trainer, trainop.api; print(trainop_trainer.__file__); print(trainop.api.__file__)",
        cwd=installed.parent,
    )
    for line in where.split():
        assert str(installed.parents[1]) in line, where  # the venv's copy, not the source tree
    usage = _run(str(installed), "-m", "trainop_trainer", "--help", cwd=installed.parent)
    assert "usage: python -m trainop_trainer" in usage and "--config" in usage


def test_the_installed_trainer_plans_and_trains_a_tiny_config(
    installed: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    config = trainer_support.mlp_config(
        tmp_path / "store", "wheel-job", workers=1, max_steps=8, interval_steps=4
    )
    path = trainer_support.write_config(config, tmp_path / "trainer.json")
    env = trainer_support.subprocess_env(TRAINOP_CONFIG=str(path))
    plan = _run(str(installed), "-m", "trainop_trainer", "--plan", cwd=tmp_path, env=env)
    assert "Scaling(num_workers=1, use_gpu=False" in plan and "network: tcp" in plan

    _run(str(installed), "-m", "trainop_trainer.launch", cwd=tmp_path, env=env)
    assert trainer_support.checkpoint_steps(config) == [4, 8]
