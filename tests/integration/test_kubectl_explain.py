"""`kubectl explain` documents both kinds: the installed CRDs (crds/, from the models' docstrings) as the
real apiserver publishes them and the real kubectl prints them (issue #22: it printed <no description>
for 100 of 127 TrainingJob fields)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.controlplane import cluster

pytestmark = pytest.mark.controlplane


def published_schema(plane: cluster.ControlPlane, kind: str) -> dict[str, Any]:
    """The kind's schema from the apiserver's OpenAPI v3 document: what kubectl explain reads."""
    document = json.loads(plane.kubectl("get", "--raw", "/openapi/v3/apis/trainop.dev/v1alpha1").stdout)
    schema: dict[str, Any] = document["components"]["schemas"][f"dev.trainop.v1alpha1.{kind}"]
    return schema


def undescribed(node: dict[str, Any], path: str) -> list[str]:
    missing = []
    for name, sub in node.get("properties", {}).items():
        if not sub.get("description") and not sub.get("allOf"):  # allOf: a reference to ObjectMeta
            missing.append(f"{path}.{name}")
        missing.extend(undescribed(sub, f"{path}.{name}"))
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            missing.extend(undescribed(node[key], f"{path}.{key}"))
    return missing


@pytest.mark.parametrize("kind", ["TrainingJob", "TuningSweep"])
def test_the_published_schema_describes_every_field_of_spec_and_status(
    control_plane: cluster.ControlPlane, kind: str
) -> None:
    schema = published_schema(control_plane, kind)
    assert set(schema["properties"]) >= {"spec", "status"}
    assert schema["description"]
    assert undescribed(schema, kind) == []


def test_kubectl_explain_workers_describes_every_field_the_issue_found_undescribed(
    control_plane: cluster.ControlPlane,
) -> None:
    out = control_plane.kubectl("explain", "trainingjob.spec.workers").stdout
    assert "<no description>" not in out
    for field in ("replicas", "cpusPerWorker", "memoryPerWorker", "nodeSelector", "priorityClassName"):
        assert f"  {field}\t" in out, field
    # The sizes fitted to the job say how, where a user looks.
    memory = control_plane.kubectl("explain", "trainingjob.spec.workers.memoryPerWorker").stdout
    assert "Unset (the default): sized for the job" in " ".join(memory.split())


@pytest.mark.parametrize(
    "path",
    [
        "trainingjob.spec",
        "trainingjob.spec.checkpoint.storage",
        "trainingjob.spec.workers.tolerations",
        "trainingjob.status",
        "trainingjob.status.progress",
        "tuningsweep.spec",
        "tuningsweep.spec.searchSpace",
        "tuningsweep.status.trials",
    ],
)
def test_kubectl_explain_prints_a_description_for_every_field_it_lists(
    control_plane: cluster.ControlPlane, path: str
) -> None:
    out = control_plane.kubectl("explain", path).stdout
    assert "FIELDS:" in out or "FIELD:" in out
    assert "<no description>" not in out, out
