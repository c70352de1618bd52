"""Writing CEL validation rules (``x-kubernetes-validations``) from Python, next to their pydantic twins.

A cross-field rule of the API exists twice: a pydantic validator (``trainop validate``, local mode, the
operator's re-validation) and a CEL rule in the CRD (the apiserver refuses the manifest at apply time).
The helpers here keep the CEL side short and correct: quoting string literals and the rule dict itself,
whose ``message`` is the pydantic sentence and whose ``messageExpression`` fills in the values where the
sentence names them. Message expressions use the strings library's ``format`` (Kubernetes >= 1.29):
concatenating ``string(int)`` with ``+`` is estimated as unbounded by the apiserver's cost estimator,
which then refuses the whole CRD.

Rules read fields that have a default without ``has()``: the apiserver fills defaults in (nested objects
included, crd.py) before it evaluates any rule. Fields without a default are guarded with ``has()``.

This module must not import the API models: they import it.
"""

from __future__ import annotations

import json
from typing import Any

Rule = dict[str, Any]  # Any: pydantic types json_schema_extra as JsonDict, invariant in its values


def string(value: str) -> str:
    """A CEL string literal (double-quoted; JSON's escapes are CEL's)."""
    return json.dumps(value)


def format(template: str, *arguments: str) -> str:
    """CEL: ``template`` (``%s``, ``%d`` placeholders) filled with the CEL ``arguments``."""
    return f"{string(template)}.format([{', '.join(arguments)}])"


def rule(expression: str, message: str, message_expression: str = "") -> Rule:
    out = {"rule": expression, "message": message}
    if message_expression:
        out["messageExpression"] = message_expression
    return out
