"""The API models as a user meets them through `trainop validate`: examples pass, bad input is named."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import pydantic
import pytest
import yaml

from trainop.api import base, manifest, trainer_config, trainingjob

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.yaml"))
INVALID = sorted((ROOT / "tests" / "data" / "invalid").glob("*.yaml"))


def expected_field(path: pathlib.Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect-field: "), f"{path.name} must start with '# expect-field: <path>'"
    return first.removeprefix("# expect-field: ").strip()


def test_there_are_examples_of_every_kind() -> None:
    kinds = {yaml.safe_load(p.read_text())["kind"] for p in EXAMPLES}
    assert kinds == {"TrainingJob", "TuningSweep"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_validates_with_the_cli(path: pathlib.Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainop", "validate", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "is valid" in result.stdout


def test_the_invalid_corpus_has_at_least_25_manifests() -> None:
    assert len(INVALID) >= 25


def test_the_operator_only_rules_docs_api_md_publishes_are_exactly_the_manifests_the_apiserver_admits() -> (
    None
):
    """The third line of each invalid manifest records the real apiserver's verdict, which
    tests/integration/test_api_verdicts.py checks; the admitted ones are the published list's examples."""
    admitted = {p.name for p in INVALID if p.read_text().splitlines()[2].startswith("# apiserver: admitted")}
    refused = {
        p.name for p in INVALID if p.read_text().splitlines()[2].startswith("# apiserver: refused at ")
    }
    assert admitted | refused == {p.name for p in INVALID}, "every invalid manifest records a verdict"
    assert admitted == {rule.example for rule in manifest.OPERATOR_ONLY_RULES}
    published = (
        (ROOT / "docs" / "api.md").read_text().split("## Refused by the operator, not at apply time")[1]
    )
    for rule in manifest.OPERATOR_ONLY_RULES:
        assert f"| {rule.rule} |" in published, f"docs/api.md does not list {rule.rule!r}: run `make crds`"
    rows = [line for line in published.splitlines() if line.startswith("| ")]
    assert len(rows) - 2 == len(manifest.OPERATOR_ONLY_RULES)  # a header and a separator row, then one each


def _cpu_mlp() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "cpu-mlp.yaml").read_text())
    return document


def test_a_null_field_means_its_default_as_the_apiserver_reads_it() -> None:
    document = _cpu_mlp()
    document["spec"]["checkpoint"]["intervalMinutes"] = None
    document["spec"]["workers"]["terminationGracePeriodSeconds"] = None
    job = manifest.parse_object(document)
    assert isinstance(job, trainingjob.TrainingJob)
    assert job.spec.checkpoint.interval_minutes == 10.0  # not "no interval": the apiserver prunes the null
    assert job.spec.workers.termination_grace_period_seconds == 120


def test_a_whole_number_written_as_a_float_is_refused_in_a_request_body_naming_the_field_and_the_fix() -> (
    None
):
    """The apiserver refuses ``replicas: 2.0`` in a JSON body (the CRD's per-field rule; the real
    verdicts: tests/integration/test_whole_float_integers.py); a file is read as kubectl sends it."""
    document = _cpu_mlp()
    document["spec"]["workers"]["replicas"] = 2.0
    with pytest.raises(manifest.ManifestError) as refused:
        manifest.parse_object(document)
    assert [str(e) for e in refused.value.errors] == [
        "spec.workers.replicas: must be an integer written without a decimal point: write 2, not 2.0"
    ]
    document["spec"]["workers"]["replicas"] = 2.5
    with pytest.raises(manifest.ManifestError) as refused:
        manifest.parse_object(document)
    assert [str(e) for e in refused.value.errors] == ["spec.workers.replicas: must be a valid integer"]


def test_a_file_is_read_as_kubectl_sends_it_whole_floats_as_integers(tmp_path: pathlib.Path) -> None:
    document = _cpu_mlp()
    document["spec"]["workers"]["replicas"] = 2.0
    document["spec"]["hyperparameters"]["maxSteps"] = 600.0
    document["spec"]["workload"]["config"]["hiddenDim"] = 128.0  # free-form: kubectl sends 128 too
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(document))
    (job,) = manifest.load_file(path)
    assert isinstance(job, trainingjob.TrainingJob)
    assert job.spec.workers.replicas == 2 and job.spec.hyperparameters.max_steps == 600
    assert job.spec.workload.config["hiddenDim"] == 128 and isinstance(
        job.spec.workload.config["hiddenDim"], int
    )
    assert job.spec.hyperparameters.learning_rate == 0.05  # a fraction stays a float
    assert manifest.as_kubectl_sends({"a": [1.0, 0.5, True, "1.0"], "b": 1e30}) == {
        "a": [1, 0.5, True, "1.0"],
        "b": 1e30,  # beyond int64: Go writes 1e+30 and the apiserver reads a float
    }


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("workers", "replicas"), "2"),
        (("suspend",), "false"),
        (("network", "probe"), 1),
        (("hyperparameters", "learningRate"), "0.1"),
        (("workers", "nodeSelector"), {"pool": 1}),
    ],
    ids=["quoted-integer", "quoted-boolean", "integer-for-boolean", "quoted-number", "number-for-string"],
)
def test_validate_is_as_strict_about_types_as_the_crd_schema(path: tuple[str, ...], value: Any) -> None:
    """pydantic's lax mode would turn "2" into 2 and "false" into False; kubectl apply refuses both."""
    document = _cpu_mlp()
    node = document["spec"]
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    with pytest.raises(manifest.ManifestError) as refused:
        manifest.parse_object(document)
    assert any(e.path.startswith("spec." + ".".join(path)) for e in refused.value.errors), refused.value


def _example_text(**replacements: str) -> str:
    """examples/cpu-mlp.yaml with whole lines replaced: {"learningRate": "learningRate: 3e-4"}."""
    lines = (ROOT / "examples" / "cpu-mlp.yaml").read_text().splitlines()
    for key, line in replacements.items():
        (index,) = [i for i, text in enumerate(lines) if text.strip().startswith(key + ":")]
        lines[index] = lines[index][: len(lines[index]) - len(lines[index].lstrip())] + line
    return "\n".join(lines) + "\n"


def test_a_number_with_an_exponent_and_no_point_is_a_number_as_kubectl_reads_it(
    tmp_path: pathlib.Path,
) -> None:
    """PyYAML's YAML 1.1 rules read 3e-4 as a string; go-yaml (kubectl) reads a number."""
    path = tmp_path / "job.yaml"
    path.write_text(_example_text(learningRate="learningRate: 3e-4", maxSteps="maxSteps: 1e3"))
    (job,) = manifest.load_file(path)
    assert isinstance(job, trainingjob.TrainingJob)
    assert job.spec.hyperparameters.learning_rate == 3e-4
    assert job.spec.hyperparameters.max_steps == 1000  # a whole float goes out as an integer
    assert manifest.load_yaml_documents(b"a: 1e6\nb: -2.5E-3\nc: '3e-4'\nd: e5\ne: 12\nf: .5") == [
        {"a": 1e6, "b": -2.5e-3, "c": "3e-4", "d": "e5", "e": 12, "f": 0.5}
    ]


def test_a_quoted_number_is_refused_with_the_fix(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(_example_text(learningRate='learningRate: "3e-4"', maxSteps='maxSteps: "600"'))
    with pytest.raises(manifest.ManifestError) as refused:
        manifest.load_file(path)
    said = {e.path: e.message for e in refused.value.errors}
    assert said["spec.hyperparameters.learningRate"] == (
        "must be a number, not the string '3e-4': write it without quotes"
    )
    assert said["spec.hyperparameters.maxSteps"] == (
        "must be an integer, not the string '600': write it without quotes"
    )


def test_a_key_written_twice_is_refused_naming_it_and_both_lines(tmp_path: pathlib.Path) -> None:
    """kubectl refuses such a file; PyYAML alone would keep the last value without a word."""
    text = _example_text(learningRate="learningRate: 0.05\n    learningRate: 0.5")
    first = text.splitlines().index("    learningRate: 0.05") + 1
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(manifest.ManifestError) as refused:
        manifest.load_file(path)
    assert str(refused.value) == (
        f"{path}: not valid YAML: the key 'learningRate' is written twice in one mapping (lines {first} and "
        f"{first + 1}): keep one of them, as kubectl refuses such a file"
    )
    # A merge key's values may be overridden: that is no duplicate.
    assert manifest.load_yaml_documents(b"a: &x {b: 1}\nc:\n  <<: *x\n  b: 2\n") == [
        {"a": {"b": 1}, "c": {"b": 2}}
    ]


def test_a_utf16_file_is_read_and_a_file_that_is_not_text_gets_a_sentence(tmp_path: pathlib.Path) -> None:
    """PowerShell's ``>`` writes UTF-16 with a byte-order mark; a Latin-1 accent is not UTF-8."""
    text = (ROOT / "examples" / "cpu-mlp.yaml").read_text()
    utf16, latin1 = tmp_path / "utf16.yaml", tmp_path / "latin1.yaml"
    utf16.write_bytes(text.encode("utf-16"))
    latin1.write_bytes(("# caf\xe9\n" + text).encode("latin-1"))
    assert [r.metadata.name for r in manifest.load_file(utf16)] == ["cpu-mlp"]
    result = subprocess.run(
        [sys.executable, "-m", "trainop", "validate", str(latin1), str(utf16)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"{latin1}: not UTF-8 text (byte 5: invalid continuation byte): save the file as UTF-8" in (
        result.stderr
    )
    assert (
        f"{utf16}: TrainingJob/cpu-mlp is valid" in result.stdout + result.stderr
    )  # the next file still checked


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_every_invalid_manifest_fails_with_a_message_naming_the_offending_field(path: pathlib.Path) -> None:
    with pytest.raises(manifest.ManifestError) as caught:
        manifest.load_file(path)
    field = expected_field(path)
    paths = [e.path for e in caught.value.errors]
    assert field in paths, f"expected an error at {field}, got {caught.value.errors}"
    for error in caught.value.errors:
        assert error.message and "\n" not in error.message


@pytest.mark.parametrize("path", INVALID[:3], ids=lambda p: p.name)
def test_cli_validate_exits_non_zero_and_prints_the_field(path: pathlib.Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainop", "validate", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 1
    assert expected_field(path) in result.stderr


def test_validate_reports_a_missing_file_in_one_sentence(tmp_path: pathlib.Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainop", "validate", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "cannot read the file" in result.stderr
    assert "Traceback" not in result.stderr


def test_multi_document_files_yield_every_resource(tmp_path: pathlib.Path) -> None:
    docs = [yaml.safe_load(p.read_text()) for p in EXAMPLES]
    path = tmp_path / "all.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    assert [r.metadata.name for r in manifest.load_file(path)] == [d["metadata"]["name"] for d in docs]


def test_every_document_of_a_file_is_checked_and_each_error_names_its_document(
    tmp_path: pathlib.Path,
) -> None:
    """Before, the first bad document hid the others, and no error said which document it was."""
    first, second = _cpu_mlp(), _cpu_mlp()
    first["metadata"]["name"] = "a"
    first["spec"]["workers"]["replicas"] = 0
    second["metadata"]["name"] = "b"
    second["spec"]["hyperparameters"]["learningRate"] = 50
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump_all([first, second]))
    with pytest.raises(manifest.ManifestError) as refused:
        manifest.load_file(path)
    assert [str(e) for e in refused.value.errors] == [
        "document 1 (TrainingJob/a): spec.workers.replicas: must be greater than or equal to 1",
        "document 2 (TrainingJob/b): spec.hyperparameters.learningRate: must be less than or equal to 10",
    ]
    path.write_text(yaml.safe_dump(first))  # a single document needs no number
    with pytest.raises(manifest.ManifestError) as single:
        manifest.load_file(path)
    assert [str(e) for e in single.value.errors] == [
        "spec.workers.replicas: must be greater than or equal to 1"
    ]


def test_snake_case_field_names_are_refused_because_the_apiserver_would_prune_them() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "resnet50-multigpu.yaml").read_text())
    doc["spec"]["workers"]["gpus_per_worker"] = doc["spec"]["workers"].pop("gpusPerWorker")
    with pytest.raises(manifest.ManifestError) as caught:
        manifest.parse_object(doc)
    assert "spec.workers.gpus_per_worker" in [e.path for e in caught.value.errors]


def test_defaults_fill_an_almost_empty_spec() -> None:
    job = manifest.parse_object(
        {
            "apiVersion": "trainop.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "tiny"},
            "spec": {"workload": {"model": "mlp"}, "hyperparameters": {"epochs": 1}},
        }
    )
    assert isinstance(job, trainingjob.TrainingJob)
    assert job.spec.workers.replicas == 1
    assert job.spec.checkpoint.keep_last == 3
    assert job.spec.failure_policy.max_restarts is None  # unset: only the per-class budgets count
    assert job.spec.network.profile == trainingjob.NetworkProfile.AUTO


def test_trainer_config_round_trips_and_honours_environment_overrides(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (job,) = manifest.load_file(ROOT / "examples" / "resnet50-multigpu.yaml")
    assert isinstance(job, trainingjob.TrainingJob)
    config = trainer_config.for_job(job, storage_path="/checkpoints", attempt=3, in_cluster=True)
    path = tmp_path / "trainer.json"
    path.write_text(trainer_config.dumps(config))
    assert trainer_config.load(path) == config
    monkeypatch.setenv(trainer_config.CONFIG_ENV, str(path))
    monkeypatch.setenv(trainer_config.STORAGE_PATH_ENV, str(tmp_path / "ckpt"))
    loaded = trainer_config.load()
    assert loaded.storage_path == str(tmp_path / "ckpt")
    assert loaded.run_name == "resnet50-multigpu"
    assert loaded.status_target is not None and loaded.status_target.plural == "trainingjobs"


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_examples_trainer_config_round_trips(example: pathlib.Path) -> None:
    for resource in manifest.load_file(example):
        if isinstance(resource, trainingjob.TrainingJob):
            config: Any = trainer_config.for_job(resource, storage_path="/c", attempt=2, in_cluster=True)
            load = trainer_config.TrainerConfig
        else:
            config = trainer_config.for_sweep(resource, storage_path="/c", attempt=2, in_cluster=True)
            load = trainer_config.SweepConfig
        assert load.model_validate_json(trainer_config.dumps(config), by_alias=True, by_name=False) == config


def test_the_trainer_config_leaves_defaults_out_so_an_older_trainer_image_still_loads_it() -> None:
    """A field added to the API after a trainer image was built reaches that image only when a job sets
    it. Shown with ``workers.terminationGracePeriodSeconds`` (added after the first trainer release):
    models without it (the old image's) load the config of a job that leaves it at its default."""
    (job,) = manifest.load_file(ROOT / "examples" / "cpu-mlp.yaml")
    assert isinstance(job, trainingjob.TrainingJob)
    rendered = json.loads(
        trainer_config.dumps(trainer_config.for_job(job, storage_path="/c", attempt=1, in_cluster=True))
    )
    assert "terminationGracePeriodSeconds" not in rendered["spec"].get("workers", {})
    assert rendered["attempt"] == 1 and rendered["runName"] == "cpu-mlp"  # runtime facts: always written

    # The old image's Workers model: today's, without the new field, unknown keys refused as ever.
    old_fields = {
        name: (field.annotation, field)
        for name, field in trainingjob.Workers.model_fields.items()
        if name != "termination_grace_period_seconds"
    }
    old_workers: Any = pydantic.create_model("OldWorkers", __base__=base.ApiModel, **old_fields)  # type: ignore[call-overload]
    old_workers.model_validate(rendered["spec"].get("workers", {}))
    with pytest.raises(pydantic.ValidationError, match="terminationGracePeriodSeconds"):
        old_workers.model_validate(
            {**rendered["spec"].get("workers", {}), "terminationGracePeriodSeconds": 30}
        )
    workers = job.spec.workers.model_copy(update={"termination_grace_period_seconds": 30})
    custom = job.model_copy(update={"spec": job.spec.model_copy(update={"workers": workers})})
    again = json.loads(
        trainer_config.dumps(trainer_config.for_job(custom, storage_path="/c", attempt=1, in_cluster=True))
    )
    assert again["spec"]["workers"]["terminationGracePeriodSeconds"] == 30  # set: sent


@pytest.mark.parametrize(
    ("model", "kind", "refused"),
    [
        ("resnet18", "digits", "which trains on images: use synthetic, cifar10 or imagefolder"),
        ("gpt-tiny", "digits", "which trains on tokens: use synthetic or tokens"),
        ("mlp", "imagefolder", "which trains on feature vectors: use synthetic or digits"),
        ("bert-base", "cifar10", "which trains on tokens: use synthetic or tokens"),
        ("vit-b16", "tokens", "which trains on images: use synthetic, cifar10 or imagefolder"),
        ("resnet50", "imagefolder", None),
        ("gpt-small", "tokens", None),
        ("mlp", "digits", None),
        ("gpt-xl", "synthetic", None),
    ],
)
def test_a_dataset_that_does_not_fit_the_model_is_refused_before_the_job_runs(
    model: str, kind: str, refused: str | None
) -> None:
    """Before, resnet18 on digits passed validation and died in the workers on a bare assert."""
    document = _cpu_mlp()
    document["spec"]["workload"] = {"model": model, "dataset": {"kind": kind}}
    if kind not in ("synthetic", "digits"):
        document["spec"]["workload"]["dataset"]["path"] = "data/x"
    if refused is None:
        manifest.parse_object(document)
        return
    with pytest.raises(manifest.ManifestError) as error:
        manifest.parse_object(document)
    assert [(e.path, e.message) for e in error.value.errors] == [
        ("spec.workload", f"workload.dataset.kind {kind} does not fit model {model}, {refused}")
    ]
