"""The apiserver and ``trainop validate`` refuse the same manifests, with the same sentences.

Every file of tests/data/invalid/ records, in its third line, the real apiserver's verdict on it:

    # apiserver: refused at <what kubectl's error names>[; the same sentence as trainop validate]
    # apiserver: admitted (an operator-only rule, docs/api.md)

and each is sent with ``kubectl apply --dry-run=server`` (the real kubectl, as a user would) to the test
control plane, whose CRDs are crds/. A refusal must name the field; where the rule is a CEL twin of a
model validator, kubectl must show the model's own sentence. The admitted ones must be exactly the
examples of ``manifest.OPERATOR_ONLY_RULES`` (the list docs/api.md publishes; tests/unit/
test_api_manifests.py compares the two). Immutable fields are refused at apply time too (transition
rules), naming the old and the new value.
"""

from __future__ import annotations

import pathlib
import re
from typing import Any

import pytest
import yaml

from tests.controlplane import cluster
from trainop.api import manifest

pytestmark = pytest.mark.controlplane

ROOT = pathlib.Path(__file__).resolve().parents[2]
INVALID = sorted((ROOT / "tests" / "data" / "invalid").glob("*.yaml"))
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
VERDICT = re.compile(
    r"^# apiserver: (?:refused at (?P<where>.+?)(?P<same>; the same sentence as trainop validate)?"
    r"|(?P<admitted>admitted) \(an operator-only rule, docs/api\.md\))$"
)


def recorded_verdict(path: pathlib.Path) -> re.Match[str]:
    lines = path.read_text().splitlines()
    found = VERDICT.match(lines[2]) if len(lines) > 2 else None
    assert found, f"{path.name}: the third line must record the apiserver's verdict (see this module)"
    return found


def expected_field(path: pathlib.Path) -> str:
    return path.read_text().splitlines()[0].removeprefix("# expect-field: ").strip()


def model_messages(path: pathlib.Path) -> list[str]:
    with pytest.raises(manifest.ManifestError) as refused:
        manifest.load_file(path)
    return [e.message for e in refused.value.errors if e.path == expected_field(path)]


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_the_apiserver_gives_every_invalid_manifest_its_recorded_verdict(
    control_plane: cluster.ControlPlane, namespace: str, path: pathlib.Path
) -> None:
    verdict = recorded_verdict(path)
    result = control_plane.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path), check=False)
    said = result.stdout + result.stderr
    if verdict["admitted"]:
        assert result.returncode == 0, said
        assert "created (server dry run)" in said
        return
    assert result.returncode != 0, f"{path.name} was admitted: {said}"
    assert verdict["where"] in said, said
    if verdict["same"]:
        messages = model_messages(path)
        assert messages and all(message in said for message in messages), (messages, said)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_admitted_by_the_apiserver(
    control_plane: cluster.ControlPlane, namespace: str, path: pathlib.Path
) -> None:
    result = control_plane.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path), check=False)
    assert result.returncode == 0, result.stderr


def _edited(document: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    edited = yaml.safe_load(yaml.safe_dump(document))
    node = edited["spec"]
    for key in path[:-1]:
        node = node.setdefault(key, {})
    if value is None:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return edited


@pytest.mark.parametrize(
    ("example", "edits", "sentence"),
    [
        ("cpu-mlp.yaml", [(("workers", "replicas"), 3)], "spec.workers.replicas cannot change from 2 to 3"),
        (
            "cpu-mlp.yaml",
            [(("workers", "gpusPerWorker"), 1)],
            "spec.workers.gpusPerWorker cannot change from 0",
        ),
        ("cpu-mlp.yaml", [(("workload", "model"), "gpt-tiny")], "spec.workload.model cannot change from mlp"),
        (
            "cpu-mlp.yaml",  # swapping the built-in model for a user function: model disappears
            [(("workload", "model"), None), (("workload", "entrypoint"), "mypkg.train:main")],
            "spec.workload.model cannot change from mlp to unset",
        ),
        (
            "cpu-mlp.yaml",
            [(("checkpoint", "storage"), {"size": "1Gi"})],
            "spec.checkpoint.storage cannot change while the object exists",
        ),
        ("sweep-lr.yaml", [(("algorithm",), "optuna")], "spec.algorithm cannot change from random to optuna"),
    ],
    ids=["replicas", "gpus-per-worker", "model", "model-to-entrypoint", "storage", "sweep-algorithm"],
)
def test_an_immutable_field_edit_is_refused_at_apply_time_and_a_mutable_one_is_not(
    control_plane: cluster.ControlPlane,
    namespace: str,
    example: str,
    edits: list[tuple[tuple[str, ...], Any]],
    sentence: str,
) -> None:
    original = yaml.safe_load((ROOT / "examples" / example).read_text())
    control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(original))
    edited = original
    for path, value in edits:
        edited = _edited(edited, path, value)
    refused = control_plane.kubectl(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(edited), check=False
    )
    assert refused.returncode != 0 and sentence in refused.stderr, refused.stderr
    spec = original["spec"]
    mutable = (
        _edited(original, ("hyperparameters", "learningRate"), 0.01)
        if "template" not in spec
        else (_edited(original, ("numTrials",), spec.get("numTrials", 8) + 1))
    )
    control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(mutable))
