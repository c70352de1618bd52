"""crds/ is exactly what the models generate, and the generated schemas are structural."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
import yaml

from trainop.api import crd, reference, trainingjob, tuningsweep

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("filename", sorted(crd.all_crds()))
def test_crds_directory_matches_the_models(filename: str) -> None:
    committed = (ROOT / "crds" / filename).read_text()
    assert committed == crd.render_yaml(crd.all_crds()[filename]), "crds/ is stale: run `make crds`"


def test_crds_directory_holds_nothing_the_models_do_not_generate() -> None:
    assert sorted(p.name for p in (ROOT / "crds").glob("*.yaml")) == sorted(crd.all_crds())


def _walk(node: dict[str, Any], path: str) -> list[str]:
    """Paths of schema nodes that break the structural rules the apiserver enforces."""
    problems: list[str] = []
    typed = (
        "type" in node
        or node.get("x-kubernetes-int-or-string")
        or node.get("x-kubernetes-preserve-unknown-fields")
    )
    if not typed:
        problems.append(f"{path}: no type")
    for forbidden in ("anyOf", "oneOf", "allOf", "$ref", "$defs", "const", "title", "patternProperties"):
        if forbidden in node:
            problems.append(f"{path}: has {forbidden}")
    if node.get("default", 0) is None:
        problems.append(f"{path}: null default")
    for name, sub in node.get("properties", {}).items():
        problems.extend(_walk(sub, f"{path}.{name}"))
    if isinstance(node.get("additionalProperties"), dict):
        problems.extend(_walk(node["additionalProperties"], f"{path}.*"))
    if "items" in node:
        problems.extend(_walk(node["items"], f"{path}[]"))
    return problems


@pytest.mark.parametrize("filename", sorted(crd.all_crds()))
def test_generated_schemas_are_structural(filename: str) -> None:
    schema = crd.all_crds()[filename]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _walk(schema, "") == []


def test_only_free_form_fields_preserve_unknown_fields() -> None:
    found: list[str] = []

    def visit(node: dict[str, Any], path: str) -> None:
        if node.get("x-kubernetes-preserve-unknown-fields"):
            found.append(path)
        for name, sub in node.get("properties", {}).items():
            visit(sub, f"{path}.{name}")
        if isinstance(node.get("additionalProperties"), dict):
            visit(node["additionalProperties"], f"{path}.*")
        if "items" in node:
            visit(node["items"], f"{path}[]")

    for obj in crd.all_crds().values():
        visit(obj["spec"]["versions"][0]["schema"]["openAPIV3Schema"], obj["spec"]["names"]["kind"])
    assert sorted(found) == sorted(
        [
            "TrainingJob.spec.workload.config",
            "TuningSweep.spec.template.workload.config",
            "TuningSweep.spec.searchSpace.*.values[]",
            "TuningSweep.status.bestTrial.parameters",
        ]
    )


@pytest.mark.parametrize(
    ("kind", "columns"),
    [
        ("TrainingJob", ["Phase", "Workers", "GPUs", "Step", "Checkpoint", "Restarts", "Age"]),
        ("TuningSweep", ["Phase", "Trials", "Running", "Best", "Age"]),
    ],
)
def test_printer_columns_are_the_ones_users_see(kind: str, columns: list[str]) -> None:
    obj = next(c for c in crd.all_crds().values() if c["spec"]["names"]["kind"] == kind)
    version = obj["spec"]["versions"][0]
    shown = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert shown == columns
    assert version["subresources"] == {"status": {}}


@pytest.mark.parametrize("filename", sorted(crd.all_crds()))
def test_every_printer_column_points_at_a_field_of_the_schema(filename: str) -> None:
    """A renamed field must take its column along: kubectl shows an empty column, never an error."""
    version = crd.all_crds()[filename]["spec"]["versions"][0]
    for column in version["additionalPrinterColumns"]:
        if column["jsonPath"].startswith(".metadata."):
            continue
        node = version["schema"]["openAPIV3Schema"]
        for part in column["jsonPath"].lstrip(".").split("."):
            assert part in node.get("properties", {}), (column["name"], column["jsonPath"])
            node = node["properties"][part]


def test_bus_bandwidth_status_field_spells_its_unit_gigabytes_per_second() -> None:
    network = trainingjob.NetworkStatus(profile="tcp", all_reduce_bus_bandwidth_gb_per_second=1.5)
    assert network.to_wire() == {"profile": "tcp", "allReduceBusBandwidthGBPerSecond": 1.5}
    wire = {"profile": "tcp", "allReduceBusBandwidthGBPerSecond": 1.5}
    parsed = trainingjob.NetworkStatus.model_validate(wire, by_alias=True, by_name=False)
    assert parsed.all_reduce_bus_bandwidth_gb_per_second == 1.5
    column = next(
        c
        for c in crd.trainingjob_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
        if "allReduceBusBandwidth" in c["jsonPath"]
    )
    assert column["jsonPath"] == ".status.network.allReduceBusBandwidthGBPerSecond"
    assert "GB/s" in column["name"]


def test_cross_field_rules_are_cel_validations_in_the_schema() -> None:
    text = json.dumps(crd.trainingjob_crd())  # not YAML: its line folding would split the rules
    assert "[has(self.model), has(self.entrypoint), has(self.rayTrain)].filter(set, set).size() == 1" in text
    assert "has(self.epochs) || has(self.maxSteps)" in text
    assert "has(self.intervalSteps) || has(self.intervalMinutes)" in text
    assert "self.precision != 'fp16' || self.workers.gpusPerWorker >= 1" in text
    assert "self.kind in ['synthetic', 'digits'] || (has(self.path) && self.path != '')" in text
    sweep = json.dumps(crd.tuningsweep_crd())
    assert "self.type != 'asha' || self.gracePeriod <= self.maxT" in sweep


@pytest.mark.parametrize("filename", sorted(crd.all_crds()))
def test_every_immutable_field_has_a_transition_rule_on_the_spec(filename: str) -> None:
    obj = crd.all_crds()[filename]
    spec = obj["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    transitions = [r["rule"] for r in spec["x-kubernetes-validations"] if "oldSelf" in r["rule"]]
    immutable = {"TrainingJob": trainingjob.IMMUTABLE_FIELDS, "TuningSweep": tuningsweep.IMMUTABLE_FIELDS}
    paths = immutable[obj["spec"]["names"]["kind"]]
    assert len(transitions) == len(paths)
    for path, rule in zip(paths, transitions, strict=True):
        assert f"self.{'.'.join(path)} == oldSelf.{'.'.join(path)}" in rule


def test_status_schema_carries_no_defaults() -> None:
    status = crd.trainingjob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert "default" not in yaml.safe_dump(status)


def test_api_reference_in_docs_matches_the_models() -> None:
    assert (ROOT / "docs" / "api.md").read_text() == reference.render(), (
        "docs/api.md is stale: run `make crds`"
    )


def _undescribed(node: dict[str, Any], path: str) -> list[str]:
    """Paths of schema properties (nested objects, array items and map values included) without a
    description: what `kubectl explain` would print as <no description>."""
    missing = []
    for name, sub in node.get("properties", {}).items():
        if not str(sub.get("description", "")).strip():
            missing.append(f"{path}.{name}")
        missing.extend(_undescribed(sub, f"{path}.{name}"))
    if isinstance(node.get("additionalProperties"), dict):
        missing.extend(_undescribed(node["additionalProperties"], f"{path}.<key>"))
    if "items" in node:
        missing.extend(_undescribed(node["items"], f"{path}[]"))
    return missing


@pytest.mark.parametrize("filename", sorted(crd.all_crds()))
def test_every_field_of_spec_and_status_has_a_description_for_kubectl_explain(filename: str) -> None:
    obj = crd.all_crds()[filename]
    schema = obj["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["description"]
    kind = obj["spec"]["names"]["kind"]
    # metadata is ObjectMeta, documented by Kubernetes; the apiserver refuses a description on it, and takes
    # only the constraints on its name (length, DNS label), which are described.
    assert _undescribed(schema, kind) == [f"{kind}.metadata"]
    metadata = schema["properties"]["metadata"]
    assert set(metadata) == {"type", "properties"} and set(metadata["properties"]) == {"name"}


def test_the_description_walk_finds_an_undescribed_field_nested_in_array_items_and_map_values() -> None:
    """The check above could pass by not looking: here it must find the two holes."""
    schema = {
        "properties": {
            "a": {
                "description": "x",
                "type": "array",
                "items": {"properties": {"b": {"type": "string"}}},
            },
            "m": {
                "description": "y",
                "type": "object",
                "additionalProperties": {"properties": {"c": {"type": "string"}}},
            },
        }
    }
    assert _undescribed(schema, "T") == ["T.a[].b", "T.m.<key>.c"]


def test_descriptions_are_the_models_attribute_docstrings_folded_into_one_paragraph() -> None:
    workers = crd.trainingjob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["workers"]["properties"]
    docstring = trainingjob.Workers.model_fields["replicas"].description
    assert docstring is not None and "\n" in docstring  # written over several lines in the model
    assert workers["replicas"]["description"] == " ".join(docstring.split())


@pytest.mark.parametrize(
    "field", ["cpusPerWorker", "memoryPerWorker", "sharedMemory"], ids=lambda f: f"workers.{f}"
)
def test_a_size_fitted_to_the_job_has_no_static_default_and_says_how_it_is_sized(field: str) -> None:
    workers = crd.trainingjob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["workers"]
    assert field not in workers["default"]
    assert "default" not in workers["properties"][field]
    assert "Unset (the default)" in workers["properties"][field]["description"]


def _defaults_not_stated(node: dict[str, Any], path: str) -> list[str]:
    """Fields with a static default whose description does not state it (kubectl explain shows no
    defaults of its own, so the description is where a user learns them)."""

    def shown(value: Any) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        return f"{value:g}" if isinstance(value, float) else str(value)

    missing = []
    for name, sub in node.get("properties", {}).items():
        default, description = sub.get("default"), str(sub.get("description", ""))
        stated = "default" in description.lower() and shown(default) in description
        if default is not None and not isinstance(default, (dict, list)) and not stated:
            missing.append(f"{path}.{name} (default {default!r})")
        missing.extend(_defaults_not_stated(sub, f"{path}.{name}"))
    if isinstance(node.get("additionalProperties"), dict):
        missing.extend(_defaults_not_stated(node["additionalProperties"], f"{path}.<key>"))
    if "items" in node:
        missing.extend(_defaults_not_stated(node["items"], f"{path}[]"))
    return missing


@pytest.mark.parametrize("filename", sorted(crd.all_crds()))
def test_every_static_default_is_stated_in_its_fields_description(filename: str) -> None:
    obj = crd.all_crds()[filename]
    schema = obj["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _defaults_not_stated(schema, obj["spec"]["names"]["kind"]) == []
