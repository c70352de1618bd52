"""What `trainop validate` and the operator's re-validation refuse in workload.config of a built-in model
(model_config.KEYS: one table for the API and the trainer), and integers Kubernetes cannot store."""

from __future__ import annotations

import copy
import datetime
import pathlib
from typing import Any

import pytest
import yaml

from trainop.api import manifest, model_config, trainer_config, trainingjob
from trainop.controller import acceptance, conditions, state_machine

ROOT = pathlib.Path(__file__).resolve().parents[2]


def job(**workload: Any) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "cpu-mlp.yaml").read_text())
    document["spec"]["workload"] = {**document["spec"]["workload"], **workload}
    return document


def refusals(document: dict[str, Any]) -> list[str]:
    with pytest.raises(manifest.ManifestError) as refused:
        manifest.parse_object(document)
    return [str(e) for e in refused.value.errors]


def test_a_misspelt_key_is_refused_naming_the_key_the_model_its_keys_and_the_closest_one() -> None:
    assert refusals(job(config={"inputDim": 32, "hidenDim": 512})) == [
        "spec.workload.config: model mlp does not read workload.config key 'hidenDim' (it reads inputDim, "
        "hiddenDim or numLayers): did you mean hiddenDim?"
    ]


@pytest.mark.parametrize(
    ("model", "dataset", "typed", "meant"),
    [
        ("gpt-tiny", "synthetic", "numLayer", "numLayers"),
        ("gpt-small", "synthetic", "embed_dim", "embedDim"),
        ("bert-base", "synthetic", "maskTokenID", "maskTokenId"),
        ("vit-b16", "synthetic", "patchsize", "patchSize"),
        ("mlp", "digits", "hiddendim", "hiddenDim"),
    ],
)
def test_every_model_suggests_its_own_key(model: str, dataset: str, typed: str, meant: str) -> None:
    (said,) = refusals(job(model=model, dataset={"kind": dataset}, config={typed: 2}))
    assert said.endswith(f"did you mean {meant}?"), said
    assert f"model {model} does not read workload.config key {typed!r}" in said


def test_a_key_like_none_of_the_models_says_to_remove_it() -> None:
    (said,) = refusals(job(config={"learningRate": 0.1}))
    assert said.endswith("(it reads inputDim, hiddenDim or numLayers): remove it or use one of those")


def test_a_model_that_reads_no_key_refuses_any() -> None:
    assert refusals(job(model="resnet18", config={"numLayers": 18})) == [
        "spec.workload.config: model resnet18 reads no workload.config keys, so 'numLayers' would be "
        "ignored: remove it"
    ]


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({"numLayers": "2"}, "numLayers must be a positive integer, not '2'"),
        ({"hiddenDim": 0}, "hiddenDim must be a positive integer, not 0"),
        ({"inputDim": -8}, "inputDim must be a positive integer, not -8"),
        ({"hiddenDim": 64.5}, "hiddenDim must be a positive integer, not 64.5"),
        ({"numLayers": True}, "numLayers must be a positive integer, not True"),
        ({"hiddenDim": 2**63}, f"hiddenDim must be a positive integer, not {2**63}"),
    ],
)
def test_a_value_of_the_wrong_type_or_range_is_refused_naming_the_key(
    config: dict[str, Any], said: str
) -> None:
    assert refusals(job(config=config)) == [f"spec.workload.config: {said}"]


@pytest.mark.parametrize("dropout", [1.0, -0.1, "0.1", None])
def test_dropout_must_be_a_number_from_zero_up_to_one(dropout: Any) -> None:
    (said,) = refusals(job(model="gpt-tiny", config={"dropout": dropout}))
    assert (
        said
        == f"spec.workload.config: dropout must be a number from 0 up to (not including) 1, not {dropout!r}"
    )


def test_the_keys_a_model_reads_with_good_values_are_admitted() -> None:
    spec = manifest.parse_object(
        job(
            model="gpt-tiny",
            config={"vocabSize": 97, "numLayers": 1, "numHeads": 2, "embedDim": 8, "dropout": 0},
        )
    ).spec
    assert isinstance(spec, trainingjob.TrainingJobSpec)
    assert spec.workload.config["vocabSize"] == 97


@pytest.mark.parametrize("workload", [{"entrypoint": "mypkg.train:main"}, {"rayTrain": "mypkg.train:loop"}])
def test_an_entrypoint_or_ray_train_config_stays_free_form(workload: dict[str, Any]) -> None:
    document = job(config={"hidenDim": "anything", "nested": {"numLayers": "two"}})
    del document["spec"]["workload"]["model"]
    document["spec"]["workload"].update(workload)
    parsed = manifest.parse_object(document)
    assert parsed.spec.workload.config["nested"] == {"numLayers": "two"}  # type: ignore[union-attr]


def test_the_mlp_on_digits_refuses_an_input_dim_the_trainer_would_replace_by_64() -> None:
    assert refusals(job(dataset={"kind": "digits"}, config={"inputDim": 32})) == [
        "spec.workload.config: workload.config.inputDim is 64 with dataset kind digits (8x8 images), not 32: "
        "remove it"
    ]
    manifest.parse_object(job(dataset={"kind": "digits"}, config={"inputDim": 64, "hiddenDim": 128}))


def test_the_table_names_every_built_in_model() -> None:
    assert set(model_config.KEYS) == {m.value for m in trainingjob.BuiltinModel}


# -------------------------------------------------------------- the operator, for what the apiserver admits
NOW = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)


def test_the_operator_fails_a_job_the_apiserver_admitted_naming_the_key_on_its_status_and_in_an_event() -> (
    None
):
    """CEL cannot see a free-form map's keys (manifest.OPERATOR_ONLY_RULES): the apiserver admits the typo and
    the operator's re-validation fails the job, InvalidSpec, with the same sentence."""
    body = job(config={"hidenDim": 512})
    body["metadata"].update(namespace="default", uid="u-1", generation=1)
    verdict = acceptance.evaluate(body)
    assert verdict.resource is None
    expected = (
        "spec.workload.config: model mlp does not read workload.config key 'hidenDim' (it reads inputDim, "
        "hiddenDim or numLayers): did you mean hiddenDim?"
    )
    valid = [c for c in conditions.spec(verdict, 1) if c.type == conditions.SPEC_VALID]
    assert [(c.status, c.reason) for c in valid] == [("False", "InvalidSpec")]
    assert valid[0].message.startswith(expected)
    transition = state_machine.next_status(
        verdict,
        verdict.kind.operator_status.from_stored(None),
        state_machine.Observed(now=NOW, generation=1, ray_jobs={}, claim=None),
    )
    assert transition.status.phase == trainingjob.Phase.FAILED
    events = [(e.type, e.reason) for e in transition.events if expected in e.message]
    assert ("Warning", "InvalidSpec") in events


def test_a_job_accepted_before_the_rule_existed_keeps_running_and_is_told_why_its_spec_is_invalid(
    tmp_path: pathlib.Path,
) -> None:
    """An operator upgrade brings the rule; a job that has run with the typo since before it keeps running
    with its accepted spec (the applied-spec annotation, base.ACCEPTED), and its status names the key."""
    body = job(config={"hidenDim": 512})
    wire = copy.deepcopy(body["spec"])
    body["metadata"].update(namespace="default", uid="u-1", generation=1)
    body["metadata"]["annotations"] = {"trainop.dev/applied-spec": acceptance.serialise(wire)}
    verdict = acceptance.evaluate(body)
    assert verdict.resource is not None and verdict.keeps_previous_spec
    assert "did you mean hiddenDim?" in str(verdict.errors[0])
    running = {"phase": "Running", "attempt": 1, "startTime": "2024-12-31T23:00:00Z"}
    transition = state_machine.next_status(
        verdict,
        verdict.kind.operator_status.from_stored(running),
        state_machine.Observed(now=NOW, generation=1, ray_jobs={}, claim=None),
    )
    assert transition.status.phase != trainingjob.Phase.FAILED
    # The trainer reads its config, rendered from that spec, the same way.
    assert isinstance(verdict.resource, trainingjob.TrainingJob)
    config = trainer_config.for_job(verdict.resource, storage_path="/ckpt", attempt=2, in_cluster=False)
    (tmp_path / "config.json").write_text(trainer_config.dumps(config))
    assert trainer_config.load(tmp_path / "config.json").spec.workload.config == {"hidenDim": 512}


# ---------------------------------------------------------------------------------------- int64
@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("hyperparameters", "maxSteps"), 99999999999999999999),
        (("hyperparameters", "epochs"), 2**63),
        (("checkpoint", "intervalSteps"), 2**64 + 1),
    ],
)
def test_an_integer_beyond_int64_is_refused_naming_the_field(path: tuple[str, ...], value: int) -> None:
    document = job()
    node = document["spec"]
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    assert refusals(document) == [
        f"spec.{'.'.join(path)}: {value} is beyond the integers Kubernetes stores (int64, "
        "-9223372036854775808 to 9223372036854775807): use a smaller number"
    ]


def test_the_largest_int64_is_admitted() -> None:
    document = job()
    document["spec"]["hyperparameters"]["maxSteps"] = 2**63 - 1
    parsed = manifest.parse_object(copy.deepcopy(document))
    assert parsed.spec.hyperparameters.max_steps == 2**63 - 1  # type: ignore[union-attr]


def test_a_mask_token_id_may_be_0_but_not_negative() -> None:
    """0 is a token id like any other (many vocabularies put a special token there); a dimension is not."""
    assert model_config.value_problem(model_config.Key.MASK_TOKEN_ID, 0) is None
    assert model_config.value_problem(model_config.Key.MASK_TOKEN_ID, -1) == (
        "maskTokenId must be an integer of 0 or more, not -1"
    )
    embed = model_config.value_problem(model_config.Key.EMBED_DIM, 0)
    assert embed == "embedDim must be a positive integer, not 0"
