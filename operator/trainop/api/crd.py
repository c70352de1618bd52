"""CustomResourceDefinitions generated from the pydantic models.

pydantic emits JSON Schema 2020-12 with ``$defs`` and ``$ref``; Kubernetes wants a *structural* OpenAPI
v3 schema: everything inlined, every node typed, no ``anyOf`` with null, defaults only where the
apiserver should fill them in. ``structural_schema`` does that translation and nothing else, so the
CRDs in crds/ are a pure function of the models (``make crds`` writes them; a test compares).

Design choices:
- Optional spec objects default to the object their fields' defaults make, so the apiserver fills in
  nested defaults and ``kubectl get -o yaml`` shows the effective spec; except those whose model default
  is None (``data``, ``checkpoint.storage.s3``, ``evaluation``, ``keepBest``, a Secret reference): absent
  means "not used", and a defaulted object would switch them on. Status carries no defaults: it is
  written, not filled.
- Free-form maps (``dict[str, Any]``) become ``x-kubernetes-preserve-unknown-fields``; nothing else does.
- Key patterns of maps (``propertyNames``) have no structural equivalent and become a CEL rule.
- Cross-field rules come from ``x-kubernetes-validations`` attached to the models themselves.
- Every integer field of a spec carries ``cel.integer_rule()``: a whole number written as a float
  (``maxSteps: 1.0`` in a JSON body) is refused naming the field, instead of failing whichever CEL rules
  happen to read it (cel.INTEGER_WITHOUT_DECIMAL_POINT says why). Status fields have none: the operator
  writes them.
- Immutable fields (each kind's ``IMMUTABLE_FIELDS``) become transition rules (``oldSelf``) on the spec,
  so the apiserver refuses the edit at apply time; the operator still checks them (controller/acceptance)
  for objects written before the rule existed.
- Every property carries the description of its field (the models' attribute docstrings), which is what
  ``kubectl explain`` prints; the envelope's (apiVersion, kind, spec, status) come from the fields of the
  kind's top-level model. ``metadata`` has none: the apiserver refuses anything but its type there.
  Line breaks of a docstring are folded (a blank line keeps a paragraph), so kubectl wraps the text to
  the terminal.
"""

from __future__ import annotations

import copy
from typing import Any

import pydantic

from trainop.api import base, cel, hints, trainingjob, tuningsweep

JsonSchema = dict[str, Any]

_DROP_KEYS = {"title", "$defs", "discriminator"}


def structural_schema(model: type[pydantic.BaseModel], *, apply_defaults: bool = True) -> JsonSchema:
    """The model's schema, translated to a structural OpenAPI v3 schema."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs: dict[str, JsonSchema] = raw.get("$defs", {})
    return _convert(raw, defs, apply_defaults=apply_defaults)


def _convert(node: JsonSchema, defs: dict[str, JsonSchema], *, apply_defaults: bool) -> JsonSchema:
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").split("/")[-1]]
        merged = {**target, **node}
        return _convert(merged, defs, apply_defaults=apply_defaults)

    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        types = sorted(o.get("type", "") for o in options)
        if types == ["integer", "string"]:
            node["x-kubernetes-int-or-string"] = True
        elif len(options) == 1:
            inner = _convert(options[0], defs, apply_defaults=apply_defaults)
            # The outer node's description/default win: they belong to the field, not the type.
            outer = {k: v for k, v in node.items() if k not in _DROP_KEYS}
            return _finish({**inner, **outer}, apply_defaults=apply_defaults)
        else:
            raise ValueError(f"cannot express anyOf {options!r} structurally")

    if "const" in node:
        node["enum"] = [node.pop("const")]
        node.setdefault("type", "string")

    out: JsonSchema = {}
    # Optional objects whose model default is None (an absent evaluation, keepBest, Secret reference) stay
    # absent: defaulting them to an object would switch the feature on for every job.
    absent_by_default: set[str] = set()
    for key, value in node.items():
        if key in _DROP_KEYS:
            continue
        if key == "properties":
            absent_by_default = {name for name, sub in value.items() if sub.get("default", 0) is None}
            out["properties"] = {
                name: _convert(sub, defs, apply_defaults=apply_defaults) for name, sub in value.items()
            }
        elif key == "items":
            out["items"] = _convert(value, defs, apply_defaults=apply_defaults)
        elif key == "additionalProperties":
            if value is False:
                continue  # extra="forbid": the apiserver prunes unknown fields anyway
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
            else:
                out["additionalProperties"] = _convert(value, defs, apply_defaults=apply_defaults)
        elif key == "patternProperties":
            # dict[constrained key, V]: one value schema for every key, the key pattern as a CEL rule.
            ((pattern, value_schema),) = value.items()
            out["additionalProperties"] = _convert(value_schema, defs, apply_defaults=apply_defaults)
            out.setdefault("x-kubernetes-validations", []).append(_key_rule(pattern))
        elif key == "propertyNames":
            pattern = value.get("pattern")
            if pattern:
                out.setdefault("x-kubernetes-validations", []).append(_key_rule(pattern))
        elif key == "x-kubernetes-validations":
            out.setdefault("x-kubernetes-validations", []).extend(copy.deepcopy(value))
        elif key == "exclusiveMinimum":
            out["minimum"] = value
            out["exclusiveMinimum"] = True
        elif key == "exclusiveMaximum":
            out["maximum"] = value
            out["exclusiveMaximum"] = True
        else:
            out[key] = copy.deepcopy(value)

    if "type" not in out and not out.get("x-kubernetes-int-or-string") and "properties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "properties" in out:
        out.setdefault("type", "object")
        if apply_defaults:
            required = set(out.get("required", []))
            for name, sub in out["properties"].items():
                if name in absent_by_default:
                    continue
                if sub.get("type") == "object" and "properties" in sub and name not in required:
                    # The default is the object its own field defaults make, not {}: the apiserver checks
                    # a default against the CEL rules without defaulting inside it first.
                    sub.setdefault(
                        "default", {k: v["default"] for k, v in sub["properties"].items() if "default" in v}
                    )
    return _finish(out, apply_defaults=apply_defaults)


def _finish(node: JsonSchema, *, apply_defaults: bool) -> JsonSchema:
    if "description" in node:
        node["description"] = _fold(node["description"])
    if node.get("default", 0) is None or not apply_defaults:
        node.pop("default", None)
    if node.get("type") == "object" and "x-kubernetes-preserve-unknown-fields" in node and "default" in node:
        # A free-form map defaulting to {} adds nothing but noise to every object.
        node.pop("default")
    if node.get("type") == "array" and node.get("default") == []:
        node.pop("default")
    return node


def _fold(text: str) -> str:
    """A docstring as one paragraph per blank-line-separated block."""
    return "\n\n".join(" ".join(block.split()) for block in text.split("\n\n") if block.strip())


def _key_rule(pattern: str) -> dict[str, str]:
    return {
        "rule": f"self.all(k, k.matches({_cel_string(pattern)}))",
        "message": hints.key_rule_message(pattern),
    }


def _cel_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _immutable_rule(path: tuple[str, ...]) -> cel.Rule:
    """A transition rule: the field at ``path`` (under spec) keeps its value, presence included."""
    whole = ".".join(path)
    presence = " && ".join(
        f"has(self.{'.'.join(path[:d])}) == has(oldSelf.{'.'.join(path[:d])})"
        for d in range(1, len(path) + 1)
    )
    expression = f"{presence} && (!has(self.{whole}) || self.{whole} == oldSelf.{whole})"
    shown = f"spec.{whole}"
    message = f"{shown} cannot change while the object exists: delete and recreate it to change {shown}"
    scalar = path[-1] not in ("storage", "searchSpace", "objective")
    if not scalar:
        return cel.rule(expression, message)

    def show(root: str) -> str:
        return f"(has({root}.{whole}) ? string({root}.{whole}) : 'unset')"

    return cel.rule(
        expression,
        message,
        cel.format(
            f"{shown} cannot change from %s to %s: delete and recreate the object to change it",
            show("oldSelf"),
            show("self"),
        ),
    )


def _with_integer_rules(node: JsonSchema) -> None:
    """Give every integer field under ``node`` (free-form maps aside) the rule that refuses ``1.0``."""
    if node.get("type") == "integer":
        node.setdefault("x-kubernetes-validations", []).append(cel.integer_rule())
    for sub in node.get("properties", {}).values():
        _with_integer_rules(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            _with_integer_rules(node[key])


def _object_schema(
    model: type[pydantic.BaseModel],
    *,
    spec_model: type[pydantic.BaseModel],
    status_model: type[pydantic.BaseModel],
    immutable_fields: tuple[tuple[str, ...], ...],
) -> JsonSchema:
    spec = structural_schema(spec_model, apply_defaults=True)
    _with_integer_rules(spec)
    spec.setdefault("x-kubernetes-validations", []).extend(_immutable_rule(path) for path in immutable_fields)

    # The envelope is written by hand (apiVersion/kind/metadata are the apiserver's); its descriptions are
    # the top-level model's.
    def described(name: str, schema: JsonSchema) -> JsonSchema:
        description = model.model_fields[name].description
        return {**schema, "description": _fold(description)} if description else schema

    return {
        "type": "object",
        "description": _fold(model.__doc__ or ""),
        "required": ["spec"],
        "properties": {
            "apiVersion": described("api_version", {"type": "string"}),
            "kind": described("kind", {"type": "string"}),
            # The metadata constraints a CRD may state (child names add suffixes to the owner's and must be
            # DNS labels), as schema properties so that a refusal names the field (a root CEL rule's says
            # "<nil>"). No description: the apiserver refuses anything else on metadata (kubectl explain
            # shows ObjectMeta's own documentation there).
            "metadata": {
                "type": "object",
                "properties": {
                    "name": {
                        "type": "string",
                        "maxLength": base.MAX_NAME_LENGTH,
                        "pattern": base.DNS_LABEL_PATTERN,
                        "description": "The object's name: a lowercase DNS label (a-z, 0-9 and '-', starting "
                        f"and ending with a letter or digit) of at most {base.MAX_NAME_LENGTH} characters, "
                        "because the children's names add suffixes to it.",
                    }
                },
            },
            "spec": described("spec", spec),
            "status": described("status", structural_schema(status_model, apply_defaults=False)),
        },
    }


def _crd(
    *,
    kind: str,
    plural: str,
    short_names: list[str],
    schema: JsonSchema,
    columns: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{base.GROUP}",
            "labels": {"app.kubernetes.io/name": "trainop", "app.kubernetes.io/part-of": "trainop"},
        },
        "spec": {
            "group": base.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": ["trainop", "all"],
            },
            "versions": [
                {
                    "name": base.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def _column(
    name: str, json_path: str, type_: str = "string", priority: int = 0, description: str = ""
) -> dict[str, Any]:
    column: dict[str, Any] = {"name": name, "type": type_, "jsonPath": json_path}
    if description:
        column["description"] = description
    if priority:
        column["priority"] = priority
    return column


def trainingjob_crd() -> dict[str, Any]:
    return _crd(
        kind="TrainingJob",
        plural="trainingjobs",
        short_names=["tj", "tjob"],
        schema=_object_schema(
            trainingjob.TrainingJob,
            spec_model=trainingjob.TrainingJobSpec,
            status_model=trainingjob.TrainingJobStatus,
            immutable_fields=trainingjob.IMMUTABLE_FIELDS,
        ),
        columns=[
            _column("Phase", ".status.phase"),
            _column("Workers", ".spec.workers.replicas", "integer"),
            _column("GPUs", ".status.gpus", "integer"),
            _column("Step", ".status.progress.step", "integer"),
            _column("Checkpoint", ".status.checkpoint.step", "integer"),
            _column("Restarts", ".status.restarts", "integer"),
            _column("Age", ".metadata.creationTimestamp", "date"),
            _column("Loss", ".status.progress.loss", "number", priority=1),
            _column("Samples/s", ".status.progress.samplesPerSecond", "number", priority=1),
            _column(
                "Bus-GB/s",
                ".status.network.allReduceBusBandwidthGBPerSecond",
                "number",
                priority=1,
                description="All-reduce bus bandwidth at start-up, GB/s (gigabytes per second).",
            ),
        ],
    )


def tuningsweep_crd() -> dict[str, Any]:
    return _crd(
        kind="TuningSweep",
        plural="tuningsweeps",
        short_names=["ts", "sweep"],
        schema=_object_schema(
            tuningsweep.TuningSweep,
            spec_model=tuningsweep.TuningSweepSpec,
            status_model=tuningsweep.TuningSweepStatus,
            immutable_fields=tuningsweep.IMMUTABLE_FIELDS,
        ),
        columns=[
            _column("Phase", ".status.phase"),
            _column("Trials", ".status.trials.total", "integer"),
            _column("Running", ".status.trials.running", "integer"),
            _column("Best", ".status.bestTrial.value", "number"),
            _column("Age", ".metadata.creationTimestamp", "date"),
            _column("Succeeded", ".status.trials.succeeded", "integer", priority=1),
            _column("Failed", ".status.trials.failed", "integer", priority=1),
            _column("Stopped", ".status.trials.earlyStopped", "integer", priority=1),
        ],
    )


def all_crds() -> dict[str, dict[str, Any]]:
    """File name in crds/ -> CRD object."""
    return {
        f"{base.GROUP}_trainingjobs.yaml": trainingjob_crd(),
        f"{base.GROUP}_tuningsweeps.yaml": tuningsweep_crd(),
    }


def render_yaml(crd: dict[str, Any]) -> str:
    import yaml

    header = "# Generated from the pydantic models in operator/trainop/api by `make crds`. Do not edit.\n"
    return header + yaml.safe_dump(crd, sort_keys=False, width=100)
