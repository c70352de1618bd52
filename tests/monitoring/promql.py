"""Just enough PromQL reading for the monitoring tests: which metrics an expression selects, with which
label matchers, and Grafana's template variables replaced so promtool can parse dashboard queries.

promtool (the real parser) decides whether an expression is valid; this module only lists names. It
assumes a syntactically valid expression, which the tests check with promtool first.
"""

from __future__ import annotations

import re

KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "inf",
    "nan",
    "atan2",
    "start",
    "end",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_SELECTOR = re.compile(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}")
_IDENTIFIER = re.compile(r"(?<![\w.:$])([a-zA-Z_:][a-zA-Z0-9_:]*)")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")')

# Grafana's built-in variables, replaced by durations promtool accepts.
GRAFANA_BUILTINS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def substitute_grafana_variables(expr: str) -> str:
    for name, value in GRAFANA_BUILTINS.items():
        expr = expr.replace(name, value)
    # Dashboard variables only appear inside label-matcher strings: "$namespace" -> ".*".
    return re.sub(r"\$\{?[a-zA-Z_][a-zA-Z0-9_]*\}?", ".*", expr)


def selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """(metric name, {label: operator+value}) for every vector selector in ``expr``."""
    found: list[tuple[str, dict[str, str]]] = []
    body = _RANGE.sub("", expr)
    for match in _SELECTOR.finditer(body):
        name, matchers_text = match.group(1), match.group(2)
        matchers = {label: op + value for label, op, value in _MATCHER.findall(matchers_text)}
        if not name:
            name = matchers.pop("__name__", "=")[2:-1]
        found.append((name, matchers))
    # Bare names (no braces): strip strings, braces, ranges and grouping lists, then what remains and is
    # not a function call or a keyword is a metric name.
    stripped = _STRING.sub('""', body)
    stripped = re.sub(r"\{[^}]*\}", " ", stripped)
    stripped = _GROUPING.sub(" ", stripped)
    for match in _IDENTIFIER.finditer(stripped):
        name = match.group(1)
        rest = stripped[match.end() :].lstrip()
        if name.lower() in KEYWORDS or rest.startswith("("):
            continue
        if not any(existing == name for existing, _ in found):
            found.append((name, {}))
    return found


def metric_names(expr: str) -> set[str]:
    return {name for name, _ in selectors(expr)}
