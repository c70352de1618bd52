"""Reading manifests (YAML/JSON, one or many documents) into API models, with field-level errors.

Used by ``trainop validate``, by local mode and by the operator (which re-validates what the
apiserver admitted: objects written before a rule existed, and rules on OPERATOR_ONLY_RULES). Every
problem becomes a ``FieldError`` with the manifest path a user typed (``spec.workers.replicas``) and one
sentence.

A manifest is read as the apiserver reads it, so that ``trainop validate`` is never laxer than
``kubectl apply`` (nor stricter where the apiserver is lenient):

- types are strict, as in the CRD schema: ``replicas: "2"`` or ``suspend: "yes"`` is refused (pydantic's
  lax mode would have converted them);
- a whole number written with a decimal point (``maxSteps: 1.0``) in an integer field is refused by
  ``parse_object`` with cel.INTEGER_WITHOUT_DECIMAL_POINT, as the apiserver refuses such a JSON body (the
  CRD's per-field rule, crd.py). ``load_file`` first reads the file as kubectl sends it: kubectl re-encodes
  every whole number as an integer (``1.0`` goes out as ``1``, YAML or JSON file alike), so
  ``trainop validate job.yaml`` admits ``maxSteps: 1.0`` exactly when ``kubectl apply -f job.yaml`` does.
  What the apiserver stores never holds a whole float (Go writes ``1``), so the operator reads it;
- a ``null`` for a field the schema does not mark nullable is dropped before defaults apply, as the
  apiserver prunes it (``intervalMinutes: null`` means the default, not "no interval").

The YAML itself is read as kubectl's YAML library (go-yaml) reads it (``KubectlYamlLoader``): ``3e-4`` and
``1e6`` are numbers (PyYAML's YAML 1.1 rules would make them strings, and ``learningRate: 3e-4`` would be
refused where kubectl admits it); a key written twice in one mapping is refused, naming both lines, as
kubectl refuses it (PyYAML would keep the last value silently); a file in UTF-16 (with its byte-order mark)
is read, and one that is not text says so in a sentence.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import pathlib
import re
from typing import Any

import pydantic
import yaml

from trainop.api import base, cel, crd, hints, reference, trainingjob, tuningsweep

Resource = trainingjob.TrainingJob | tuningsweep.TuningSweep

KINDS: dict[str, type[trainingjob.TrainingJob] | type[tuningsweep.TuningSweep]] = {
    "TrainingJob": trainingjob.TrainingJob,
    "TuningSweep": tuningsweep.TuningSweep,
}


@dataclasses.dataclass(frozen=True)
class OperatorOnlyRule:
    """A rule the models enforce and the CRD cannot: the apiserver admits the manifest, ``trainop
    validate`` refuses it, and the operator fails the object with InvalidSpec naming the field."""

    rule: str
    why_not_in_the_crd: str
    #: The manifest of tests/data/invalid/ that breaks it (the apiserver must admit that one).
    example: str


#: docs/api.md publishes this list; tests/integration/test_api_verdicts.py checks it against the real
#: apiserver's verdict on every file of tests/data/invalid/. Keep it short: a rule CEL can express belongs
#: in the CRD (cel.py).
OPERATOR_ONLY_RULES: tuple[OperatorOnlyRule, ...] = (
    OperatorOnlyRule(
        rule="TuningSweep: a choice or grid entry of searchSpace needs a values list",
        why_not_in_the_crd="values holds untyped items (numbers, strings, booleans), and CEL cannot see "
        "a field of untyped items at all; an empty list is refused by the CRD (minItems)",
        example="53-sweep-choice-without-values.yaml",
    ),
    OperatorOnlyRule(
        rule="TuningSweep: with algorithm grid, numTrials equals the number of grid points",
        why_not_in_the_crd="the number of grid points is the product of the values lists' sizes, which "
        "CEL cannot see (untyped items)",
        example="41-sweep-grid-size-mismatch.yaml",
    ),
    OperatorOnlyRule(
        rule="TrainingJob and TuningSweep template: workload.config of a built-in model holds only the keys "
        "the model reads (model_config.KEYS)",
        why_not_in_the_crd="workload.config is free-form for an entrypoint or a Ray Train function, and CEL "
        "cannot see the keys of a free-form map (x-kubernetes-preserve-unknown-fields)",
        example="82-model-config-unknown-key.yaml",
    ),
    OperatorOnlyRule(
        rule="TrainingJob and TuningSweep template: each workload.config key of a built-in model is a "
        "positive integer (dropout: a number from 0 up to 1; maskTokenId: 0 or more)",
        why_not_in_the_crd="the values of a free-form map are invisible to CEL, and a schema for them would "
        "type an entrypoint's own keys of the same names too",
        example="83-model-config-wrong-type.yaml",
    ),
    OperatorOnlyRule(
        rule="TrainingJob and TuningSweep template: the mlp on dataset kind digits has inputDim 64",
        why_not_in_the_crd="inputDim is a key of the free-form workload.config, which CEL cannot see",
        example="84-digits-with-input-dim.yaml",
    ),
    OperatorOnlyRule(
        rule="TuningSweep: every value a searchSpace entry can draw fits the type and range of the template "
        "field it sets",
        why_not_in_the_crd="choice and grid values are untyped items, which CEL cannot see, and the fields' "
        "types and ranges would have to be copied into the rule for every parameter path",
        example="87-sweep-choice-value-wrong-type.yaml",
    ),
)


@dataclasses.dataclass(frozen=True)
class FieldError:
    path: str
    message: str
    # What the field is for (its description, as `kubectl explain` shows it, and the field it belongs to:
    # the path itself, or for an unknown field its parent): `trainop validate` prints it under the error.
    # Not part of str(): the operator's status messages stay one sentence.
    explanation: str = dataclasses.field(default="", compare=False)
    explained_field: str = dataclasses.field(default="", compare=False)
    # Which document of a multi-document file ("document 2 (TrainingJob/b)"); empty for a single one.
    document: str = dataclasses.field(default="", compare=False)

    def __str__(self) -> str:
        said = f"{self.path}: {self.message}" if self.path else self.message
        return f"{self.document}: {said}" if self.document else said


class ManifestError(ValueError):
    """A manifest that does not describe a valid trainop resource."""

    def __init__(self, errors: list[FieldError], *, source: str = "") -> None:
        self.errors = errors
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(where + "; ".join(str(e) for e in errors))


PATTERN_HINTS = hints.PATTERN_HINTS


def _reads_as_a_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _message(error: Any, *, suggestion: str | None = None) -> str:
    msg = str(error["msg"])
    kind = error["type"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix) :]
    if kind == "extra_forbidden":
        if suggestion:
            return f"unknown field: did you mean {suggestion}?"
        return "unknown field: remove it or check its spelling against `trainop crds`"
    if kind == "missing":
        return "required field is missing: add it"
    if kind == "string_pattern_mismatch":
        pattern = (error.get("ctx") or {}).get("pattern", "")
        hint = PATTERN_HINTS.get(pattern, f"must match {pattern}")
        value = error.get("input")
        return f"{value!r} {hint}" if isinstance(value, str) else hint
    value = error.get("input")
    if kind == "int_type" and isinstance(value, float) and value.is_integer():
        return cel.INTEGER_WITHOUT_DECIMAL_POINT.format(whole=int(value), written=value)
    if kind in ("int_type", "float_type") and isinstance(value, str) and _reads_as_a_number(value):
        what = "an integer" if kind == "int_type" else "a number"
        return f"must be {what}, not the string {value!r}: write it without quotes"
    if msg.startswith("Input should be "):
        msg = "must be " + msg[len("Input should be ") :]
    elif msg.startswith("String should have "):
        msg = "must have " + msg[len("String should have ") :]
    elif msg.startswith("Dictionary should have "):
        msg = "must have " + msg[len("Dictionary should have ") :]
    elif msg.startswith("List should have "):
        msg = "must have " + msg[len("List should have ") :]
    return msg


def errors_from(
    exc: pydantic.ValidationError, *, prefix: tuple[str, ...] = (), kind: str = ""
) -> list[FieldError]:
    """Field errors with the manifest path; with ``kind``, each carries its field's description."""
    out = []
    for error in exc.errors():
        path = base.error_path(prefix + tuple(error["loc"]))
        suggestion = None
        if kind and error["type"] == "extra_forbidden":
            parent, _, typed = path.rpartition(".")
            close = difflib.get_close_matches(typed, reference.field_names(kind, parent), n=1, cutoff=0.6)
            suggestion = close[0] if close else None
        described = reference.field_description(kind, path) if kind else None
        field, explanation = described or ("", "")
        out.append(FieldError(path, _message(error, suggestion=suggestion), explanation, field))
    return out


def parse_object(obj: Any, *, source: str = "") -> Resource:
    """Validate one decoded manifest (a dict) and return its model."""
    if not isinstance(obj, dict):
        raise ManifestError([FieldError("", "a manifest must be a YAML mapping")], source=source)
    kind = obj.get("kind")
    if kind not in KINDS:
        raise ManifestError(
            [FieldError("kind", f"unknown kind {kind!r}: expected one of {', '.join(KINDS)}")], source=source
        )
    api_version = obj.get("apiVersion")
    if api_version != base.API_VERSION:
        raise ManifestError(
            [FieldError("apiVersion", f"must be {base.API_VERSION} (got {api_version!r})")], source=source
        )
    # Server-populated metadata (managedFields, resourceVersion...) and status are not the user's input.
    obj = {k: v for k, v in obj.items() if k != "status"}
    wire = json.dumps(_as_the_apiserver_reads(obj, _schema(kind)), default=str)
    try:
        return KINDS[kind].model_validate_json(wire, strict=True, by_alias=True, by_name=False)
    except pydantic.ValidationError as exc:
        raise ManifestError(errors_from(exc, kind=kind), source=source) from None


@functools.cache
def _schema(kind: str) -> dict[str, Any]:
    (found,) = [c for c in crd.all_crds().values() if c["spec"]["names"]["kind"] == kind]
    schema: dict[str, Any] = found["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _as_the_apiserver_reads(value: Any, node: dict[str, Any] | None) -> Any:
    """``value`` with non-nullable nulls pruned (whole floats stay floats: the apiserver refuses them in
    integer fields, see the module docstring)."""
    if node is None or (node.get("x-kubernetes-preserve-unknown-fields") and "properties" not in node):
        return value  # unknown to the schema (the models name it) or free-form (kept verbatim)
    if isinstance(value, dict):
        properties: dict[str, Any] = node.get("properties", {})
        others = node.get("additionalProperties")
        out = {}
        for key, item in value.items():
            child = properties.get(key, others if isinstance(others, dict) else None)
            if item is None and child is not None and not child.get("nullable"):
                continue
            out[key] = _as_the_apiserver_reads(item, child)
        return out
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        return [_as_the_apiserver_reads(item, node["items"]) for item in value]
    return value


#: Go's JSON encoder writes a float64 below 1e21 without an exponent; a whole one beyond int64 would come
#: back to the apiserver as a float, so it stays one here too.
_INT64_LIMIT = 2**63


def as_kubectl_sends(value: Any) -> Any:
    """A decoded manifest file as kubectl sends it: every whole float (``1.0``) an integer, free-form
    fields included (kubectl decodes the file into an unstructured object and Go re-encodes ``1.0`` as
    ``1``)."""
    if isinstance(value, dict):
        return {key: as_kubectl_sends(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_kubectl_sends(item) for item in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < _INT64_LIMIT:
        return int(value)
    return value


class DuplicateKeyError(yaml.YAMLError):
    """A key written twice in one mapping of a manifest."""


class KubectlYamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading scalars and mappings as go-yaml (kubectl) does where they differ in a
    way a manifest meets: a float needs no decimal point (``3e-4``, ``1e6``: go-yaml's float rule), and a
    key may appear once per mapping."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<:`` merges may be overridden
                    continue
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, (str, int, float, bool)):
                    continue
                line = key_node.start_mark.line + 1
                if key in first_line:
                    raise DuplicateKeyError(
                        f"the key {key!r} is written twice in one mapping (lines {first_line[key]} and "
                        f"{line}): keep one of them, as kubectl refuses such a file"
                    )
                first_line[key] = line
        return super().construct_mapping(node, deep=deep)  # type: ignore[arg-type]


KubectlYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$"),
    list("-+0123456789."),
)


def load_yaml_documents(data: bytes) -> list[Any]:
    """The non-empty documents of a YAML (or JSON) file's bytes, read as kubectl reads them."""
    return [d for d in yaml.load_all(data, Loader=KubectlYamlLoader) if d is not None]


def load_file(path: str | pathlib.Path) -> list[Resource]:
    """Every trainop resource in a YAML file (``---``-separated documents; empty ones are skipped), read
    as ``kubectl apply -f`` sends it (``KubectlYamlLoader``, ``as_kubectl_sends``)."""
    path = pathlib.Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ManifestError(
            [FieldError("", f"cannot read the file: {exc.strerror}")], source=str(path)
        ) from None
    try:
        documents = load_yaml_documents(data)
    except yaml.reader.ReaderError as exc:
        raise ManifestError(
            [FieldError("", f"not UTF-8 text (byte {exc.position}: {exc.reason}): save the file as UTF-8")],
            source=str(path),
        ) from None
    except yaml.YAMLError as exc:
        raise ManifestError([FieldError("", f"not valid YAML: {exc}")], source=str(path)) from None
    if not documents:
        raise ManifestError([FieldError("", "the file holds no manifest")], source=str(path))
    # Every document is checked; with several, each error names its document.
    resources: list[Resource] = []
    errors: list[FieldError] = []
    for number, doc in enumerate(documents, start=1):
        try:
            resources.append(parse_object(as_kubectl_sends(doc), source=str(path)))
        except ManifestError as exc:
            where = f"document {number}{_named(doc)}" if len(documents) > 1 else ""
            errors += [dataclasses.replace(e, document=where) for e in exc.errors]
    if errors:
        raise ManifestError(errors, source=str(path))
    return resources


def _named(document: Any) -> str:
    """' (TrainingJob/name)' for a document that says its kind and name, else ''."""
    if not isinstance(document, dict):
        return ""
    kind, name = document.get("kind"), (document.get("metadata") or {}).get("name")
    return f" ({kind}/{name})" if isinstance(kind, str) and isinstance(name, str) else ""
