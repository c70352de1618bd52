"""`trainop render` prints, object for object, what the operator creates: the example is applied to the real
apiserver, the operator (a real process) creates its children, and the command's output, given the owner's
uid, must be the same set of objects, each contained in its stored counterpart (the apiserver only adds
fields: defaults, metadata, status)."""

from __future__ import annotations

import difflib
import pathlib
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import pytest
import yaml
from cluster_api import Api, wait_for

pytestmark = pytest.mark.controlplane

ROOT = pathlib.Path(__file__).resolve().parents[3]


def path_of(api: Api, namespace: str, kind: str, name: str = "") -> str:
    return {
        "PersistentVolumeClaim": api.core(namespace, "persistentvolumeclaims", name),
        "ConfigMap": api.core(namespace, "configmaps", name),
        "ServiceAccount": api.core(namespace, "serviceaccounts", name),
        "Role": api.rbac(namespace, "roles", name),
        "RoleBinding": api.rbac(namespace, "rolebindings", name),
        "RayJob": api.ray_jobs(namespace, name),
    }[kind]


@pytest.mark.parametrize(
    ("example", "plural", "ray_job", "owner_label"),
    [
        ("cpu-mlp.yaml", "trainingjobs", "cpu-mlp-a1", "trainop.dev/job"),
        ("sweep-lr.yaml", "tuningsweeps", "sweep-lr-s1", "trainop.dev/sweep"),
    ],
)
def test_render_prints_exactly_the_objects_the_operator_creates_for_attempt_1(
    operator: Any,
    api: Api,
    apply: Any,
    namespace: str,
    tmp_path: pathlib.Path,
    example: str,
    plural: str,
    ray_job: str,
    owner_label: str,
) -> None:
    manifest = yaml.safe_load((ROOT / "examples" / example).read_text())
    name = manifest["metadata"]["name"]
    apply(manifest | {"metadata": {**manifest["metadata"], "namespace": namespace}})
    wait_for(lambda: api.get(api.ray_jobs(namespace, ray_job)), lambda r: r is not None, what=ray_job)
    owner = api.get(api.job(namespace, name, plural=plural))
    assert owner is not None

    # What a user runs before applying: the example file as is, the namespace and uid on the command line.
    printed = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainop",
            "render",
            str(ROOT / "examples" / example),
            "--namespace",
            namespace,
            "--uid",
            owner["metadata"]["uid"],
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rendered = [doc for doc in yaml.safe_load_all(printed) if doc]

    created = set()
    for kind in ("PersistentVolumeClaim", "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "RayJob"):
        for obj in api.list(path_of(api, namespace, kind), f"{owner_label}={name}"):
            created.add((kind, obj["metadata"]["name"]))
    assert {(o["kind"], o["metadata"]["name"]) for o in rendered} == created
    for obj in rendered:
        stored = api.get(path_of(api, namespace, obj["kind"], obj["metadata"]["name"]))
        assert stored is not None
        assert contains(stored, obj), difference(stored, obj)


def contains(existing: Any, desired: Any) -> bool:
    """Whether ``existing`` has every field of ``desired`` (the apiserver adds defaults, metadata and
    status, never removes); lists must match item by item."""
    if isinstance(desired, Mapping):
        return isinstance(existing, Mapping) and all(contains(existing.get(k), v) for k, v in desired.items())
    if isinstance(desired, list):
        return (
            isinstance(existing, list)
            and len(existing) == len(desired)
            and all(contains(e, d) for e, d in zip(existing, desired, strict=True))
        )
    return bool(existing == desired)


def difference(stored: dict[str, Any], rendered: dict[str, Any]) -> str:
    """A unified diff of the rendered object against the stored one cut down to the rendered fields."""

    def cut(have: Any, want: Any) -> Any:
        if isinstance(want, dict) and isinstance(have, dict):
            return {k: cut(have.get(k), v) for k, v in want.items()}
        if isinstance(want, list) and isinstance(have, list):
            return [cut(h, w) for h, w in zip(have, want, strict=False)]
        return have

    def lines(obj: Any) -> list[str]:
        text = yaml.safe_dump(obj, sort_keys=False)
        for key in ("trainer.json",):  # the trainer config is JSON in a string: diff it line by line
            if isinstance(obj, dict) and key in obj.get("data", {}):
                text += obj["data"][key]
        return text.splitlines()

    diff = difflib.unified_diff(
        lines(cut(stored, rendered)), lines(rendered), "operator", "render", lineterm=""
    )
    return f"{rendered['kind']} {rendered['metadata']['name']} differs:\n" + "\n".join(diff)
