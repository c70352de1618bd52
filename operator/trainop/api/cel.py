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
from collections.abc import Iterable
from typing import Any

Rule = dict[str, Any]  # Any: pydantic types json_schema_extra as JsonDict, invariant in its values

#: The sentence for a whole number written with a decimal point (``maxSteps: 1.0``) in an integer field,
#: sent to the apiserver as a JSON body (kubectl itself sends ``1``). The apiserver's schema check takes
#: such a value, but the value reaches CEL as a double, and every rule that reads the field (or the object
#: holding it) then fails with "invalid data, expected int, got float64", so the verdict depended on which
#: rules happened to look. crd.py gives every integer field of a spec this rule, so the apiserver always
#: refuses it, naming the field; the models refuse it with the same sentence (manifest.py).
INTEGER_WITHOUT_DECIMAL_POINT = (
    "must be an integer written without a decimal point: write {whole}, not {written}"
)


def string(value: str) -> str:
    """A CEL string literal (double-quoted; JSON's escapes are CEL's)."""
    return json.dumps(value)


def strings(values: Iterable[str]) -> str:
    """A CEL list literal of strings: ``["a", "b"]``."""
    return "[" + ", ".join(string(value) for value in values) + "]"


def format(template: str, *arguments: str) -> str:
    """CEL: ``template`` (``%s``, ``%d`` placeholders) filled with the CEL ``arguments``."""
    return f"{string(template)}.format([{', '.join(arguments)}])"


def integer_rule() -> Rule:
    """The rule of every integer field: a whole double (``1.0``) errors before it is evaluated, with this
    message; an int passes."""
    return rule("type(self) == int", INTEGER_WITHOUT_DECIMAL_POINT.format(whole=1, written="1.0"))


def rule(expression: str, message: str, message_expression: str = "") -> Rule:
    out = {"rule": expression, "message": message}
    if message_expression:
        out["messageExpression"] = message_expression
    return out
