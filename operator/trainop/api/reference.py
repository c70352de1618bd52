"""The API reference (docs/api.md), generated from the same structural schema as the CRDs.

One table per object: field path, type, default, constraints, description. ``make crds`` rewrites the
file and a test fails when it is stale, so the docs cannot drift from the models. ``field_description``
looks one field's description up by the path a user typed, for ``trainop validate``.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from trainop.api import cel, crd, manifest

_CONSTRAINTS = (
    ("minimum", ">= {}"),
    ("maximum", "<= {}"),
    ("minLength", "len >= {}"),
    ("maxLength", "len <= {}"),
    ("minItems", "items >= {}"),
    ("maxItems", "items <= {}"),
    ("minProperties", "keys >= {}"),
    ("maxProperties", "keys <= {}"),
    ("pattern", "matches `{}`"),
)


def _type_of(node: dict[str, Any]) -> str:
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    if node.get("type") == "array":
        return f"list of {_type_of(node.get('items', {}))}"
    if node.get("type") == "object" and "additionalProperties" in node:
        return f"map of {_type_of(node['additionalProperties'])}"
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return "any (free-form)"
    return str(node.get("type", "any"))


def _constraints(node: dict[str, Any]) -> str:
    parts = []
    for key, fmt in _CONSTRAINTS:
        if key in node:
            value = node[key]
            if key == "minimum" and node.get("exclusiveMinimum"):
                parts.append(f"> {value}")
            elif key == "maximum" and node.get("exclusiveMaximum"):
                parts.append(f"< {value}")
            else:
                parts.append(fmt.format(str(value).replace("|", "\\|")))
    for rule in node.get("x-kubernetes-validations", []):
        if rule != cel.integer_rule():  # every integer field has it: the introduction says it once
            parts.append(rule["message"].replace("|", "\\|"))
    return "; ".join(parts)


def _rows(node: dict[str, Any], path: str, required: bool) -> list[str]:
    default = node.get("default")
    shown_default = "" if default is None or isinstance(default, dict) else f"`{json.dumps(default)}`"
    description = " ".join(str(node.get("description", "")).split()).replace("|", "\\|").replace("``", "`")
    rows = [
        f"| `{path}` | {_type_of(node)} | {'yes' if required else ''} | {shown_default} | "
        f"{_constraints(node)} | {description} |"
    ]
    children = node.get("properties", {})
    if node.get("type") == "object" and isinstance(node.get("additionalProperties"), dict):
        children = node["additionalProperties"].get("properties", {})
        path = f"{path}.<key>"
        node = node["additionalProperties"]
    if node.get("type") == "array":
        children = node.get("items", {}).get("properties", {})
        path = f"{path}[]"
        node = node.get("items", {})
    needed = set(node.get("required", []))
    for name, sub in children.items():
        rows.extend(_rows(sub, f"{path}.{name}", name in needed))
    return rows


def render() -> str:
    out = [
        "# API reference (trainop.dev/v1alpha1)",
        "",
        "Generated from the pydantic models in `operator/trainop/api` by `make crds`. Do not edit.",
        "",
        "Every rule below is enforced twice: by the apiserver when a manifest is applied (the CRD's schema",
        "and CEL rules; Kubernetes >= 1.30) and by `trainop validate` (the models, read as the apiserver",
        "reads a manifest: strict types, `null` meaning the default), with the same sentence — except the",
        "few rules listed under [Refused by the operator, not at apply time](#refused-by-the-operator-not-at-"
        "apply-time). tests/integration/test_api_verdicts.py checks this against a real apiserver.",
        "",
        "An integer field takes an integer only: a whole number with a decimal point (`maxSteps: 1.0`) in a",
        'request body is refused with "spec.hyperparameters.maxSteps: ... '
        + cel.integer_rule()["message"]
        + '". `kubectl apply -f` and',
        "`trainop validate` read a YAML or JSON file's `1.0` as `1` (kubectl sends it so), and admit it.",
        "",
    ]
    for obj in crd.all_crds().values():
        kind = obj["spec"]["names"]["kind"]
        schema = obj["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
        for part in ("spec", "status"):
            out += [
                f"## {kind} {part}",
                "",
                "| field | type | required | default | constraints | description |",
                "| --- | --- | --- | --- | --- | --- |",
            ]
            for name, sub in schema[part].get("properties", {}).items():
                out.extend(_rows(sub, name, name in set(schema[part].get("required", []))))
            out.append("")
        out += [f"## {kind}: rules across fields", ""]
        out += [
            f"- {rule['message']}"
            for node in (obj["spec"]["versions"][0]["schema"]["openAPIV3Schema"], schema["spec"])
            for rule in node.get("x-kubernetes-validations", [])
        ]
        out.append("")
    out += [
        "## Refused by the operator, not at apply time",
        "",
        "The apiserver admits a manifest that breaks one of these; `trainop validate` refuses it, and the",
        "operator fails the object (phase Failed, condition `SpecValid=False`, reason `InvalidSpec`, an",
        "Event) naming the field.",
        "",
        "| rule | why the CRD cannot check it |",
        "| --- | --- |",
        *(f"| {rule.rule} | {rule.why_not_in_the_crd} |" for rule in manifest.OPERATOR_ONLY_RULES),
        "",
    ]
    return "\n".join(out)


@functools.cache
def _schemas() -> dict[str, dict[str, Any]]:
    return {
        obj["spec"]["names"]["kind"]: obj["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for obj in crd.all_crds().values()
    }


def field_description(kind: str, path: str) -> tuple[str, str] | None:
    """``(field, description)`` of the field a manifest path names (``spec.workers.replicas``,
    ``spec.workers.tolerations[0].key``, ``spec.searchSpace.<your key>.lower``), as ``kubectl explain``
    shows it. For a path below the schema (an unknown field, a key of a map of plain values) it is the
    nearest described field above, and ``field`` says which. None for an unknown kind, the whole spec or
    status, and paths that leave the schema at once."""
    node = _schemas().get(kind)
    if node is None:
        return None
    segments = re.findall(r"[^.\[\]]+|\[\d+\]", path)
    if [s for s in segments if not s.startswith("[")] in ([], ["spec"], ["status"]):
        return None
    found: tuple[str, str] | None = None
    walked = ""
    while segments:
        segment = segments.pop(0)
        if segment.startswith("["):
            if node.get("type") != "array":
                break
            node = node.get("items", {})
            walked += segment
            continue
        if segment in node.get("properties", {}):
            node = node["properties"][segment]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]  # a map: the segment is the user's key
            # A key may hold dots (searchSpace's hyperparameters.learningRate): it runs up to the next
            # field of the map's values, or to the end.
            while segments and segments[0] not in node.get("properties", {}):
                segment += "." + segments.pop(0)
        else:
            break
        walked += ("." if walked else "") + segment
        if node.get("description"):
            found = (walked, node["description"])
    return found


def field_names(kind: str, path: str) -> list[str]:
    """The fields the object at ``path`` has (for suggesting the one a misspelt field meant)."""
    node = _schemas().get(kind, {})
    for segment in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        if segment.startswith("["):
            node = node.get("items", {})
        elif segment in node.get("properties", {}):
            node = node["properties"][segment]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return []
    return list(node.get("properties", {}))
