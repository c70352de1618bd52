"""Which spec the operator reconciles: the one in the object, or the last one it accepted.

The apiserver's CRD schema admits objects that the pydantic models refuse (cross-field rules without a
CEL twin), and it cannot compare a new spec with the old one. Both checks happen here, purely:

- the current spec is re-validated with ``manifest.parse_object``; errors name the field;
- the spec the operator last accepted lives in the owner's ``trainop.dev/applied-spec`` annotation
  (wire JSON). Not in its status: the spec's values (``network.ncclEnv`` among them) must not be copied
  into status (tests/security). A change to any of the kind's immutable fields is refused: the old spec
  keeps running and the conditions say which field changed and how to undo it;
- an invalid edit of a job that already runs is refused the same way (the job keeps its accepted spec);
  an invalid spec that was never accepted fails the job (InvalidSpec). The accepted spec is read with
  ``base.ACCEPTED``: a rule only the operator checks, added by an upgrade after the job was accepted,
  reports the current spec's error but does not fail a job that runs with it.

Mutable changes are accepted at once but reach the trainer only with the next attempt (a RayJob's spec
is fixed for its lifetime; see docs/operator.md).

This module must not talk to the API; it returns what to write, the caller writes it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import pydantic

from trainop.api import base, manifest
from trainop.controller import kinds


@dataclasses.dataclass(frozen=True)
class RefusedChange:
    path: str  # as a user writes it: spec.workers.replicas
    accepted: Any
    requested: Any

    def __str__(self) -> str:
        return f"{self.path} cannot change from {_show(self.accepted)} to {_show(self.requested)}"


@dataclasses.dataclass(frozen=True)
class Acceptance:
    kind: kinds.Kind
    # What to reconcile: the current object, or the current metadata with the last accepted spec.
    # None only when the spec is invalid and nothing was ever accepted.
    resource: manifest.Resource | None
    errors: tuple[manifest.FieldError, ...] = ()
    refused: tuple[RefusedChange, ...] = ()
    # The annotation value to write, when it differs from the stored one (None: leave it alone).
    applied_spec: str | None = None

    @property
    def keeps_previous_spec(self) -> bool:
        return self.resource is not None and bool(self.errors or self.refused)


def evaluate(body: Mapping[str, Any]) -> Acceptance:
    kind = kinds.BY_KIND[str(body.get("kind"))]
    stored = body.get("metadata", {}).get("annotations", {}).get(kinds.ANNOTATION_APPLIED_SPEC)
    try:
        current = kinds.parse(body)
    except manifest.ManifestError as error:
        previous = _previous_spec(body, stored)
        resource = None if previous is None else _with_spec(body, previous)
        return Acceptance(kind=kind, resource=resource, errors=tuple(error.errors))

    current_wire = current.spec.to_wire()
    serialised = serialise(current_wire)
    if serialised == stored:  # the accepted spec, unchanged (nearly every reconcile): nothing to compare
        return Acceptance(kind=kind, resource=current)
    previous = _previous_spec(body, stored)
    if previous is not None:
        previous_wire = previous.to_wire()
        refused = tuple(
            RefusedChange(path="spec." + ".".join(path), accepted=old, requested=new)
            for path in kind.immutable_fields
            if (old := _at(previous_wire, path)) != (new := _at(current_wire, path))
        )
        if refused:
            return Acceptance(kind=kind, resource=_with_spec(body, previous), refused=refused)
    return Acceptance(kind=kind, resource=current, applied_spec=serialised)


def serialise(spec_wire: Mapping[str, Any]) -> str:
    return json.dumps(spec_wire, sort_keys=True, separators=(",", ":"))


def _previous_spec(body: Mapping[str, Any], stored: object) -> base.ApiModel | None:
    """The accepted spec from the annotation; None when absent or unreadable (then the current one wins)."""
    if not isinstance(stored, str):
        return None
    model = manifest.KINDS[str(body.get("kind"))]
    spec_model = model.model_fields["spec"].annotation
    assert isinstance(spec_model, type) and issubclass(spec_model, base.ApiModel)
    try:
        accepted = base.ACCEPTED_BEFORE
        return spec_model.model_validate_json(stored, by_alias=True, by_name=False, context=accepted)
    except pydantic.ValidationError:
        return None


def _with_spec(body: Mapping[str, Any], spec: base.ApiModel) -> manifest.Resource:
    model = manifest.KINDS[str(body.get("kind"))]
    return model.model_validate(
        {
            "apiVersion": body.get("apiVersion"),
            "kind": body.get("kind"),
            "metadata": body.get("metadata", {}),
            "spec": spec.model_dump(mode="json", by_alias=True, exclude_none=True),
        },
        by_alias=True,
        by_name=False,
        context=base.ACCEPTED_BEFORE,
    )


def _at(wire: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = wire
    for part in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def _show(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)
