"""The `trainop` command line: every subcommand parses, and `run` refuses bad manifests before Ray starts."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from trainop import cli
from trainop.api import crd, reference

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "argv",
    [
        ["crds"],
        ["validate", "x.yaml"],
        ["render", "x.yaml", "--namespace", "team-a", "--uid", "0f0e0d0c-0000-4000-8000-000000000001"],
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


@pytest.mark.parametrize("flag", ["--docs", "--chart-rbac"])
def test_crds_refuses_a_file_option_without_out_instead_of_writing_nothing(
    flag: str, tmp_path: pathlib.Path
) -> None:
    target = tmp_path / "out.txt"
    result = subprocess.run(
        [sys.executable, "-m", "trainop", "crds", flag, str(target)], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert result.stderr.strip() == f"trainop crds: {flag} writes beside the CRD files: add --out DIR"
    assert not target.exists() and result.stdout == ""


def test_validate_explains_the_refused_field_with_the_description_kubectl_explain_shows() -> None:
    bad = ROOT / "tests" / "data" / "invalid" / "21-zero-replicas.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "trainop", "validate", str(bad)], capture_output=True, text=True
    )
    assert result.returncode == 1
    first, *explanation = result.stderr.splitlines()
    assert first.endswith("spec.workers.replicas: must be greater than or equal to 1")
    shown = " ".join(" ".join(explanation).split())
    described = crd.trainingjob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"
    ]["properties"]["workers"]["properties"]["replicas"]["description"]
    assert shown == f"workers.replicas: {described}"


def test_a_misspelt_field_is_refused_naming_the_field_it_resembles() -> None:
    bad = ROOT / "tests" / "data" / "invalid" / "32-typo-field.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "trainop", "validate", str(bad)], capture_output=True, text=True
    )
    assert result.returncode == 1
    assert "spec.workers.replicaz: unknown field: did you mean replicas?" in result.stderr


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("spec.workers.tolerations[0].effect", "spec.workers.tolerations[0].effect"),
        ("spec.network.ncclEnv.LD_PRELOAD", "spec.network.ncclEnv"),
        ("spec.workers.replicaz", "spec.workers"),
    ],
)
def test_an_error_path_below_or_beside_the_schema_is_explained_by_its_nearest_described_field(
    path: str, field: str
) -> None:
    found = reference.field_description("TrainingJob", path)
    assert found is not None and found[0] == field and found[1]


def test_a_search_space_key_with_dots_is_one_map_key() -> None:
    found = reference.field_description("TuningSweep", "spec.searchSpace.hyperparameters.learningRate.lower")
    assert found is not None
    assert found[0] == "spec.searchSpace.hyperparameters.learningRate.lower"
    assert found[1].startswith("Lowest value")
