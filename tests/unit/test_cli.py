"""The `trainop` command line: every subcommand parses, and `run` refuses bad manifests before Ray starts."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from trainop import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "argv",
    [
        ["crds"],
        ["validate", "x.yaml"],
        ["run", "x.yaml", "--fresh", "--verbose", "--workers", "2", "--inject-failure-at-step", "5"],
        [
            "operator",
            "--namespace",
            "a",
            "--namespace",
            "b",
            "--metrics-port",
            "9101",
            "--log-format",
            "json",
        ],
    ],
)
def test_every_documented_subcommand_and_flag_parses(argv: list[str]) -> None:
    args = cli.build_parser().parse_args(argv)
    assert args.command == argv[0]


def test_run_refuses_an_invalid_manifest_with_the_field_and_exit_code_2() -> None:
    bad = ROOT / "tests" / "data" / "invalid" / "21-zero-replicas.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "trainop", "run", str(bad)], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "spec.workers.replicas" in result.stderr
    assert "Traceback" not in result.stderr


def test_crds_prints_both_definitions() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainop", "crds"], capture_output=True, text=True, check=True
    )
    assert "name: trainingjobs.trainop.dev" in result.stdout
    assert "name: tuningsweeps.trainop.dev" in result.stdout
