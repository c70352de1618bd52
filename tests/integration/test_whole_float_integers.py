"""A whole number written with a decimal point (``maxSteps: 1.0``) in an integer field: the apiserver's
verdict and ``trainop validate``'s agree, whether a cross-field CEL rule reads the field or not.

What the real apiserver does (found with this test bed, Kubernetes 1.37): its schema check takes ``1.0``
for ``type: integer``, but the value reaches CEL as a double, so any rule that reads it (directly, or
through the object holding it) fails with "invalid data, expected int, got float64 evaluating rule:
<that rule's message>". Before every integer field had its own rule (crd.py, ``cel.integer_rule``), the
verdict depended on which rules happened to look (``maxSteps: 1.0`` refused, ``replicas: 2.0`` admitted,
``epochs: 1.0`` admitted only while maxSteps was set). Now a JSON body with a whole float in any integer
field is refused naming the field, and ``manifest.parse_object`` refuses it with the same sentence.

kubectl never sends ``1.0``: it decodes a YAML or JSON file into an unstructured object and Go writes
``1.0`` back as ``1``, so ``kubectl apply -f`` admits the file, and so does ``trainop validate`` on it.

Each case is checked on the real apiserver (a JSON body, as a client library sends it, and the real
kubectl on a YAML file) against the models and the real CLI.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest
import yaml

from tests.controlplane import cluster
from trainop.api import cel, manifest

pytestmark = pytest.mark.controlplane

ROOT = pathlib.Path(__file__).resolve().parents[2]
SENTENCE = cel.INTEGER_WITHOUT_DECIMAL_POINT.split(":")[0]  # the values it names come after the colon

# (field under spec, a whole float): maxSteps is read by the hyperparameters rule "set epochs or
# maxSteps" (the apiserver refused it even before the per-field rule); keepLast by no cross-field rule
# (the apiserver admitted it before).
CASES = [(("hyperparameters", "maxSteps"), 600.0), (("checkpoint", "keepLast"), 3.0)]
IDS = ["maxSteps-read-by-a-cel-rule", "keepLast-read-by-none"]


def _job(path: tuple[str, ...], value: Any, name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "cpu-mlp.yaml").read_text())
    document["metadata"]["name"] = name
    node = document["spec"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return document


def _apiserver_json_verdict(
    control_plane: cluster.ControlPlane, namespace: str, document: dict[str, Any]
) -> tuple[int, str]:
    """The apiserver's verdict on the document sent as JSON (``1.0`` stays ``1.0``), as kubectl's
    fieldValidation=Strict dry run would give it."""
    status, answer = control_plane.request(
        "POST",
        f"/apis/trainop.dev/v1alpha1/namespaces/{namespace}/trainingjobs?fieldValidation=Strict&dryRun=All",
        body=json.dumps(document).encode(),
    )
    return status, str(answer.get("message", ""))


def _cli(path: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainop", "validate", str(path)], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize(("path", "value"), CASES, ids=IDS)
def test_a_whole_float_in_an_integer_field_is_refused_in_a_request_body_by_both_naming_the_field(
    control_plane: cluster.ControlPlane, namespace: str, path: tuple[str, ...], value: float
) -> None:
    field = "spec." + ".".join(path)
    document = _job(path, value, "whole-float")
    assert f'"{path[-1]}": {value}' in json.dumps(document)  # the body really carries the decimal point

    status, said = _apiserver_json_verdict(control_plane, namespace, document)
    assert status == 422, said
    assert f"{field}: Invalid value" in said and SENTENCE in said, said

    with pytest.raises(manifest.ManifestError) as refused:
        manifest.parse_object(document)
    (error,) = refused.value.errors
    assert error.path == field
    assert error.message == cel.INTEGER_WITHOUT_DECIMAL_POINT.format(whole=int(value), written=value)
    assert error.message.startswith(SENTENCE)

    # The same value written as an integer: both admit it.
    whole = _job(path, int(value), "whole-int")
    status, said = _apiserver_json_verdict(control_plane, namespace, whole)
    assert status == 201, said
    manifest.parse_object(whole)


@pytest.mark.parametrize(("path", "value"), CASES, ids=IDS)
def test_a_whole_float_in_a_yaml_file_is_admitted_by_kubectl_apply_and_by_trainop_validate(
    control_plane: cluster.ControlPlane,
    namespace: str,
    tmp_path: pathlib.Path,
    path: tuple[str, ...],
    value: float,
) -> None:
    file = tmp_path / "job.yaml"
    file.write_text(yaml.safe_dump(_job(path, value, "whole-float-file")))
    assert f"{path[-1]}: {value}" in file.read_text()

    applied = control_plane.kubectl("apply", "-n", namespace, "-f", str(file), check=False)
    assert applied.returncode == 0, applied.stderr
    stored = control_plane.kubectl("get", "-n", namespace, "trainingjob", "whole-float-file", "-o", "json")
    node = json.loads(stored.stdout)["spec"]
    for key in path:
        node = node[key]
    assert node == int(value) and isinstance(node, int)  # stored as an integer: JSON 600, not 600.0

    validated = _cli(file)
    assert validated.returncode == 0, validated.stderr
    assert "is valid" in validated.stdout
