"""Base model and shared field types of the trainop API.

Every API object is a pydantic model whose Python attribute names are snake_case and whose wire names
(YAML, JSON, the CRD schema) are the Kubernetes-style camelCase aliases. Unknown fields are refused
(``extra="forbid"``) so that a typo in a manifest fails with the field's name instead of being silently
dropped — the apiserver prunes unknown fields, so the CLI's validator is where a user learns about them.

This module must not import anything heavier than pydantic: the trainer image and the operator image
both import the API.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import pydantic
from pydantic import alias_generators

GROUP = "trainop.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# Kubernetes resource quantity, e.g. "16Gi", "500M", "2". The apiserver validates the same pattern.
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$"
# RFC 1123 DNS label: what Kubernetes demands of names that become label values and child-name prefixes.
# Job names are capped at 40 so that child names ("<job>-a<attempt>", KubeRay's own suffixes on the
# RayCluster and its pods) stay within KubeRay's 47-character RayJob name limit.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_LABEL_HINT = (
    "must be a lowercase DNS label (a-z, 0-9 and '-', starting and ending with a letter or digit), "
    "e.g. resnet-cifar"
)
MAX_NAME_LENGTH = 40
# A Kubernetes label key (also a taint's and a toleration's key): an optional DNS-subdomain prefix and '/',
# then a name of 1-63 characters. The prefix's own limit (253) is a separate check: RE2 cannot count it.
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
LABEL_KEY_PATTERN = rf"^({_DNS_SUBDOMAIN}/)?([A-Za-z0-9][-A-Za-z0-9_.]{{0,61}})?[A-Za-z0-9]$"
# The name of most Kubernetes objects (a PersistentVolumeClaim, a Secret): an RFC 1123 DNS subdomain.
DNS_SUBDOMAIN_PATTERN = rf"^{_DNS_SUBDOMAIN}$"
MAX_DNS_SUBDOMAIN = 253
# A key of a Secret or ConfigMap (what a pod's secretKeyRef may name).
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
DNS_SUBDOMAIN_HINT = (
    "must be the name of an object in the job's namespace: lowercase letters, digits, '-' and single dots, "
    "starting and ending with a letter or digit, at most 253 characters"
)
LABEL_KEY_HINT = (
    "must be a Kubernetes label key: an optional DNS-subdomain prefix and '/' (lowercase letters, digits, "
    "'-' and single dots), then 1-63 letters, digits, '-', '_' or '.' starting and ending with a letter or "
    "digit, e.g. nvidia.com/gpu.product"
)
MAX_LABEL_KEY_PREFIX = 253
MAX_LABEL_KEY_LENGTH = MAX_LABEL_KEY_PREFIX + 1 + 63


def label_key_prefix_rule(key: str) -> str:
    """CEL that holds when the label key ``key`` (a CEL expression) has a short enough prefix."""
    return f"{key}.indexOf('/') <= {MAX_LABEL_KEY_PREFIX}"


LABEL_KEY_PREFIX_TOO_LONG = (
    f"a label key's prefix (before '/') is at most {MAX_LABEL_KEY_PREFIX} characters: shorten it"
)


def check_label_key_prefix(key: str) -> str:
    """``key`` when its DNS-subdomain prefix fits Kubernetes' limit; the pattern checks the rest."""
    if "/" in key and key.index("/") > MAX_LABEL_KEY_PREFIX:
        raise ValueError(f"{key[:40]}...: {LABEL_KEY_PREFIX_TOO_LONG}")
    return key


LabelKey = Annotated[
    str, pydantic.Field(pattern=LABEL_KEY_PATTERN), pydantic.AfterValidator(check_label_key_prefix)
]
# A Kubernetes label value (also a toleration's value): empty, or 1-63 such characters.
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
LABEL_VALUE_HINT = (
    "must be a Kubernetes label value: empty, or at most 63 letters, digits, '-', '_' or '.' starting and "
    "ending with a letter or digit, e.g. NVIDIA-H100-80GB-HBM3"
)

#: Validation context key: the spec was accepted before -- the operator's own record of what runs (the
#: applied-spec annotation) or a trainer config rendered from it. Rules that only the operator checks (no
#: CEL twin: the apiserver admitted the object) and that were added after a job was accepted skip such a
#: spec: an operator upgrade must not fail a running job for what it has been running with (the current
#: spec is still checked, and its errors are reported while the accepted one keeps running).
ACCEPTED = "trainop.accepted"
ACCEPTED_BEFORE = {ACCEPTED: True}


def accepted_before(info: pydantic.ValidationInfo) -> bool:
    """Whether this validation reads a spec accepted before (``ACCEPTED``)."""
    return bool(info.context and info.context.get(ACCEPTED))


# Kubernetes stores integers as int64: the apiserver reads a larger number as a float, which an integer field
# refuses. Every integer field of the models is held to it (ApiModel).
MIN_INT64 = -(2**63)
MAX_INT64 = 2**63 - 1
BEYOND_INT64 = (
    f"{{value}} is beyond the integers Kubernetes stores (int64, {MIN_INT64} to {MAX_INT64}): use a "
    "smaller number"
)

Quantity = Annotated[str, pydantic.Field(pattern=QUANTITY_PATTERN)]
LabelValue = Annotated[str, pydantic.Field(pattern=LABEL_VALUE_PATTERN)]


class ApiModel(pydantic.BaseModel):
    """A fragment of the API: camelCase on the wire, unknown fields refused, validated on assignment."""

    model_config = pydantic.ConfigDict(
        alias_generator=alias_generators.to_camel,
        # A field's description is the docstring on the line after it: one source for the CRD
        # (`kubectl explain`), docs/api.md and `trainop validate`.
        use_attribute_docstrings=True,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
        use_enum_values=False,
    )

    @pydantic.field_validator("*", mode="after")
    @classmethod
    def _within_int64(cls, value: Any) -> Any:
        # Every integer field of every model, one rule: the apiserver keeps integers as int64 and reads a
        # larger one as a float, which it refuses in an integer field (its own message, naming the field).
        # Fields with a narrower range refuse such a value first, with their own bound.
        if isinstance(value, int) and not isinstance(value, bool) and not MIN_INT64 <= value <= MAX_INT64:
            raise ValueError(BEYOND_INT64.format(value=value))
        return value

    def to_wire(self) -> dict[str, Any]:
        """Serialise with camelCase names and without unset optional fields (what goes to the API)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class ObjectMeta(pydantic.BaseModel):
    """The part of Kubernetes ObjectMeta the API cares about; everything else passes through."""

    model_config = pydantic.ConfigDict(extra="allow", populate_by_name=True)

    name: Annotated[str, pydantic.Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=DNS_LABEL_PATTERN)]
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = pydantic.Field(default_factory=dict)
    annotations: dict[str, str] = pydantic.Field(default_factory=dict)


class Condition(ApiModel):
    """A Kubernetes-style condition (metav1.Condition)."""

    type: str
    """The condition's name: SpecValid, SpecApplied, StorageReady, RayClusterReady, Running, Suspended,
    Complete or Failed."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds: True, False, or Unknown when the operator cannot tell yet."""
    reason: str
    """Why, in one CamelCase word (e.g. Bound, ClaimNotFound, ImagePullBackOff, AppFailed)."""
    message: str = ""
    """What happened and, for a problem, what to do about it, in a sentence."""
    last_transition_time: str | None = None
    """When status last changed (RFC 3339, UTC)."""
    observed_generation: int | None = None
    """The metadata.generation of the spec this condition was computed for."""


def error_path(loc: tuple[int | str, ...]) -> str:
    """Turn a pydantic error location into the manifest path a user typed, e.g. spec.workers.replicas.

    Validation runs by alias, so field segments already are the camelCase wire names and map keys are
    the user's own keys (kept verbatim). Segments pydantic adds for validators (``function-after[...]``)
    and for map-key errors (``[key]``) are dropped.
    """
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item == "[key]" or re.match(r"^[a-z-]+\[", item):
            continue
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts)
