"""The chart's RBAC is generated from ``rbac.GRANTS``: the committed template is byte-for-byte what the list
renders, and what it renders parses back to ``rbac.OPERATOR_RULES`` (tests/chart compares helm's output;
tests/security asks a real apiserver what the rendered ClusterRoles allow)."""

from __future__ import annotations

import pathlib
import re

import yaml

from trainop.controller import rbac

TEMPLATE = pathlib.Path(__file__).resolve().parents[2] / "charts" / "trainop" / "templates" / "_rbac.tpl"


def test_the_charts_rbac_template_is_exactly_what_operator_rules_render() -> None:
    assert TEMPLATE.read_text() == rbac.chart_template(), (
        "charts/trainop/templates/_rbac.tpl differs from trainop.controller.rbac.GRANTS: change the list "
        "and run `make crds`, never the template"
    )


def test_the_rendered_template_holds_exactly_the_operator_rules_split_by_scope() -> None:
    text = rbac.chart_template()
    blocks = dict(re.findall(r'\{\{- define "trainop\.rbac\.(\w+)" -\}\}\n(.*?)\{\{- end \}\}', text, re.S))
    assert set(blocks) == {"namespacedRules", "clusterRules"}
    namespaced, cluster = yaml.safe_load(blocks["namespacedRules"]), yaml.safe_load(blocks["clusterRules"])
    assert namespaced + cluster == rbac.OPERATOR_RULES
    assert {r["resources"][0] for r in cluster} == {"customresourcedefinitions", "namespaces"}
