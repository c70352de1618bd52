"""The chart as `helm lint` and `helm template` (the real helm binary) see it: no cluster involved.

What a user gets from each values setting is asserted on the rendered objects: the operator's flags, the
hardened pod, RBAC scope, monitoring objects, NetworkPolicies; and bad values are refused by
values.schema.json with a message that names the value.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainop import cli
from trainop.api import manifest, trainingjob
from trainop.controller import options, rayjob, rbac

from .conftest import CHART_DIR, FULL_VALUES, REPO_ROOT, Helm, objects_of, one

RULES_SOURCE = REPO_ROOT / "monitoring" / "prometheus" / "trainop.rules.yaml"
DASHBOARD_SOURCES = sorted((REPO_ROOT / "monitoring" / "grafana").glob("*.json"))


def _leaf_paths(tree: dict[str, Any], prefix: str = "") -> set[str]:
    """Dotted paths of the values a user sets: scalars, lists and empty maps (non-empty maps recurse)."""
    paths: set[str] = set()
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            paths |= _leaf_paths(value, f"{path}.")
        else:
            paths.add(path)
    return paths


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return containers[0]


# ------------------------------------------------------------------------------------------------ lint
@pytest.mark.parametrize("values", [[], [FULL_VALUES]], ids=["default-values", "full-values"])
def test_helm_lint_strict_passes(helm: Helm, values: list[Path]) -> None:
    args = ["lint", "--strict", str(CHART_DIR)]
    for path in values:
        args += ["--values", str(path)]
    result = helm.run(*args, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_full_values_file_sets_every_value_the_chart_has() -> None:
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    full = yaml.safe_load(FULL_VALUES.read_text())
    full_paths = _leaf_paths(full)
    missing = {
        path
        for path in _leaf_paths(defaults)
        if path not in full_paths and not any(p.startswith(f"{path}.") for p in full_paths)
    }
    assert not missing, f"tests/chart/values-full.yaml does not set: {sorted(missing)}"


# ----------------------------------------------------------------------------------------- rendering
def test_default_install_renders_operator_rbac_and_metrics_service_only(helm: Helm) -> None:
    kinds = sorted(doc["kind"] for doc in helm.template())
    assert kinds == sorted(
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "Service",
            "Deployment",
        ]
    )


def test_full_values_render_every_optional_object(helm: Helm) -> None:
    docs = helm.template(values=[FULL_VALUES])
    counts: dict[str, int] = {}
    for doc in docs:
        counts[doc["kind"]] = counts.get(doc["kind"], 0) + 1
    assert counts == {
        "ServiceAccount": 1,
        "ClusterRole": 2,
        "ClusterRoleBinding": 1,  # the cluster-scoped rules only: namespaced rules are per namespace
        "RoleBinding": 2,  # team-a, team-b
        "ValidatingAdmissionPolicy": 1,
        "ValidatingAdmissionPolicyBinding": 1,
        "Service": 1,
        "Deployment": 1,
        "ServiceMonitor": 1,
        "PodMonitor": 1,
        "PrometheusRule": 1,
        "ConfigMap": 3,  # one per dashboard
        "NetworkPolicy": 4,  # team-a, team-b, team-c training pods + the operator
    }


def test_crds_ship_in_the_chart_crds_directory_and_render_with_include_crds(helm: Helm) -> None:
    rendered = helm.run(*helm.template_args(), "--include-crds").stdout
    crds = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "CustomResourceDefinition"]
    assert sorted(c["metadata"]["name"] for c in crds) == [
        "trainingjobs.trainop.dev",
        "tuningsweeps.trainop.dev",
    ]


# -------------------------------------------------------------------------------------- the operator
def test_operator_watches_every_namespace_by_default(helm: Helm) -> None:
    args = _container(helm.template())["args"]
    # No --namespace flag at all is how `trainop operator` serves every namespace.
    assert args == [
        "operator",
        "--metrics-port=9100",
        "--liveness-port=8080",
        "--log-format=plain",
        "--workers=16",
    ]
    parsed = cli.build_parser().parse_args(args)  # the real CLI takes what the chart renders
    assert parsed.namespaces is None and parsed.workers == options.DEFAULT_WORKERS


def test_operator_watches_only_the_listed_namespaces(helm: Helm) -> None:
    docs = helm.template(set_values=["watchNamespaces={team-a,team-b}", "operator.verbose=true"])
    args = _container(docs)["args"]
    assert args[:3] == ["operator", "--namespace=team-a", "--namespace=team-b"]
    assert sum(arg.startswith("--namespace") for arg in args) == 2
    assert "--verbose" in args


def test_operator_ports_follow_values_and_probes_hit_kopf_liveness_endpoint(helm: Helm) -> None:
    container = _container(helm.template(values=[FULL_VALUES]))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 9200, "health": 8081}
    assert "--metrics-port=9200" in container["args"] and "--liveness-port=8081" in container["args"]
    assert "--workers=8" in container["args"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe
    assert container["livenessProbe"]["periodSeconds"] == 15


def test_operator_runs_as_exactly_one_replica_replaced_not_rolled(helm: Helm) -> None:
    deployment = one(helm.template(), "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}


def test_operator_pod_is_hardened_by_default(helm: Helm) -> None:
    docs = helm.template()
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    container = _container(docs)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["privileged"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    # A read-only root needs a writable /tmp for Python and kopf.
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_image_defaults_to_app_version_and_digest_wins_over_tag(helm: Helm) -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert _container(helm.template())["image"] == f"ghcr.io/trainop/operator:{chart['appVersion']}"
    pinned = _container(helm.template(values=[FULL_VALUES]))["image"]
    assert pinned == (
        "registry.example.com/ml/trainop-operator@sha256:"
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    )


def test_notes_show_a_cpu_job_that_the_api_accepts(helm: Helm) -> None:
    result = helm.run(
        "install", "trainop", str(CHART_DIR), "--namespace", "trainop-system", "--dry-run=client"
    )
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "kubectl -n default get trainingjobs" in notes
    heredoc = re.search(r"<<'YAML'\n(.*?)\n\s*YAML\n", notes, re.DOTALL)
    assert heredoc, notes
    text = "\n".join(line[2:] for line in heredoc.group(1).splitlines())
    job = manifest.KINDS["TrainingJob"].model_validate(yaml.safe_load(text))
    assert isinstance(job, trainingjob.TrainingJob)
    assert job.spec.workers.gpus_per_worker == 0
    mentioned = re.findall(r"examples/[\w.-]+\.yaml", notes)
    assert mentioned and all((REPO_ROOT / path).is_file() for path in mentioned), mentioned


# ------------------------------------------------------------------------------------------- schema
INVALID_VALUES = [
    # (values, the fragment of helm's error a user needs to see)
    ({"watchNamespace": ["team-a"]}, "additional properties 'watchNamespace' not allowed"),
    ({"watchNamespaces": "team-a"}, "at '/watchNamespaces': got string, want array"),
    ({"watchNamespaces": ["Team_A"]}, "at '/watchNamespaces/0': 'Team_A' does not match pattern"),
    ({"watchNamespaces": ["a", "a"]}, "at '/watchNamespaces'"),
    ({"image": {"tag": 0.2}}, "at '/image/tag': got number, want string"),
    ({"image": {"digest": "latest"}}, "at '/image/digest': 'latest' does not match pattern"),
    ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy': value must be one of"),
    ({"operator": {"logFormat": "text"}}, "at '/operator/logFormat': value must be one of 'plain', 'json'"),
    ({"operator": {"logLevel": "debug"}}, "at '/operator': additional properties 'logLevel' not allowed"),
    ({"operator": {"metricsPort": 70000}}, "at '/operator/metricsPort': maximum"),
    ({"operator": {"extraArgs": ["standalone"]}}, "at '/operator/extraArgs/0': 'standalone' does not match"),
    ({"metrics": {"serviceMonitor": {"interval": 30}}}, "at '/metrics/serviceMonitor/interval': got number"),
    ({"resources": {"limits": {"memory": "lots"}}}, "at '/resources/limits/memory'"),
    ({"livenessProbe": {"exec": {"command": ["true"]}}}, "at '/livenessProbe': additional properties 'exec'"),
    (
        {"networkPolicy": {"portRanges": [{"port": 10002}]}},
        "at '/networkPolicy/portRanges/0': missing property 'endPort'",
    ),
    ({"replicaCount": 2}, "additional properties 'replicaCount' not allowed"),
]


@pytest.mark.parametrize(
    ("values", "expected"), INVALID_VALUES, ids=[re.sub(r"\W+", "-", e)[:60] for _, e in INVALID_VALUES]
)
def test_schema_refuses_bad_values_naming_the_value(
    helm: Helm, tmp_path: Path, values: dict[str, Any], expected: str
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    result = helm.run(*helm.template_args(values=[path]), check=False)
    assert result.returncode != 0, f"helm accepted {values}"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert expected in result.stderr, result.stderr


def test_service_monitor_without_its_service_fails_with_a_reason(helm: Helm) -> None:
    result = helm.run(
        *helm.template_args(
            set_values=["metrics.serviceMonitor.enabled=true", "metrics.service.enabled=false"]
        ),
        check=False,
    )
    assert result.returncode != 0
    assert "metrics.serviceMonitor.enabled needs metrics.service.enabled" in result.stderr


# -------------------------------------------------------------------------------------- monitoring
def test_prometheus_rule_carries_the_monitoring_rules_unchanged(helm: Helm) -> None:
    rule = one(helm.template(set_values=["prometheusRule.enabled=true"]), "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES_SOURCE.read_text())


def test_dashboards_ship_as_configmaps_for_the_grafana_sidecar(helm: Helm) -> None:
    docs = helm.template(values=[FULL_VALUES])
    config_maps = objects_of(docs, "ConfigMap")
    shipped: dict[str, str] = {}
    for config_map in config_maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["namespace"] == "grafana"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "trainop"}
        shipped.update(config_map["data"])
    assert {name: yaml.safe_load(text) for name, text in shipped.items()} == {
        path.name: yaml.safe_load(path.read_text()) for path in DASHBOARD_SOURCES
    }


def test_service_monitor_scrapes_the_operator_as_job_trainop_operator(helm: Helm) -> None:
    docs = helm.template(set_values=["metrics.serviceMonitor.enabled=true"])
    monitor = one(docs, "ServiceMonitor")
    service = one(docs, "Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    assert endpoint["honorLabels"] is True
    assert {"action": "replace", "targetLabel": "job", "replacement": "trainop-operator"} in endpoint[
        "relabelings"
    ]
    # ...which is the job the TrainopOperatorDown alert looks for.
    assert 'up{job="trainop-operator"}' in RULES_SOURCE.read_text()


@pytest.mark.parametrize(
    ("set_values", "namespace_selector"),
    [([], {"any": True}), (["watchNamespaces={team-a,team-b}"], {"matchNames": ["team-a", "team-b"]})],
    ids=["cluster-wide", "watched-namespaces"],
)
def test_pod_monitor_scrapes_trainer_pods_where_the_operator_runs_jobs(
    helm: Helm, set_values: list[str], namespace_selector: dict[str, Any]
) -> None:
    monitor = one(helm.template(set_values=["metrics.podMonitor.enabled=true", *set_values]), "PodMonitor")
    assert monitor["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/managed-by": "trainop"}}
    assert monitor["spec"]["namespaceSelector"] == namespace_selector
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    # One endpoint per local rank's port, as many as a worker pod can have GPUs.
    max_gpus = trainingjob.Workers.model_json_schema(by_alias=True)["properties"]["gpusPerWorker"]["maximum"]
    assert [e["port"] for e in endpoints] == [rayjob.metrics_port_name(rank) for rank in range(max_gpus)]
    assert all(e["honorLabels"] is True and e["path"] == "/metrics" for e in endpoints)


# ---------------------------------------------------------------------------------- network policy
def test_network_policy_opens_ray_and_nccl_ports_between_job_pods_only(helm: Helm) -> None:
    docs = helm.template(set_values=["networkPolicy.enabled=true", "watchNamespaces={team-a}"])
    policies = {
        (p["metadata"]["namespace"], p["metadata"]["name"]): p for p in objects_of(docs, "NetworkPolicy")
    }
    assert set(policies) == {("team-a", "trainop-training-pods"), ("trainop-system", "trainop-operator")}
    spec = policies[("team-a", "trainop-training-pods")]["spec"]
    assert spec["podSelector"] == {"matchLabels": {"app.kubernetes.io/managed-by": "trainop"}}
    assert spec["policyTypes"] == ["Ingress"]
    between_pods, dashboard, metrics = spec["ingress"]
    assert between_pods["from"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/managed-by": "trainop"}}}
    ]
    single = {p["port"] for p in between_pods["ports"] if "endPort" not in p}
    ranges = {(p["port"], p["endPort"]) for p in between_pods["ports"] if "endPort" in p}
    assert single == {6379, 8265, 10001, 52365, 8080, 9090}  # GCS, dashboard, client, agent, metrics
    assert ranges == {(10002, 19999), (32768, 60999)}  # Ray workers; raylet/object manager/NCCL sockets
    assert dashboard["ports"] == [{"protocol": "TCP", "port": 8265}]
    assert [p["port"] for p in metrics["ports"]] == [
        *(rayjob.metrics_port_name(rank) for rank in range(16)),
        8080,
    ]


def test_network_policies_default_to_the_release_namespace_when_nothing_is_watched(helm: Helm) -> None:
    docs = helm.template(set_values=["networkPolicy.enabled=true"])
    assert {p["metadata"]["namespace"] for p in objects_of(docs, "NetworkPolicy")} == {"trainop-system"}


# ---------------------------------------------------------------------------------------------- RBAC
def _rules(docs: list[dict[str, Any]], name_suffix: str) -> list[dict[str, Any]]:
    (role,) = [d for d in objects_of(docs, "ClusterRole") if d["metadata"]["name"].endswith(name_suffix)]
    rules: list[dict[str, Any]] = role["rules"]
    return rules


def _grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_rbac_rules_do_not_depend_on_values(helm: Helm) -> None:
    default = helm.template()
    full = helm.template(values=[FULL_VALUES])
    for suffix in ("-operator", "-operator-cluster"):
        assert _rules(default, suffix) == _rules(full, suffix)


def test_the_rendered_cluster_roles_are_exactly_operator_rules(helm: Helm) -> None:
    """What `helm install` creates is the Python list the operator's tests run under (one source)."""
    docs = helm.template()
    assert _rules(docs, "-operator") + _rules(docs, "-operator-cluster") == rbac.OPERATOR_RULES


def test_the_admission_policy_is_rendered_for_the_operators_account_and_can_be_switched_off(
    helm: Helm,
) -> None:
    policy = one(helm.template(), "ValidatingAdmissionPolicy")
    (condition,) = policy["spec"]["matchConditions"]
    assert (
        condition["expression"]
        == 'request.userInfo.username == "system:serviceaccount:trainop-system:trainop"'
    )
    binding = one(helm.template(), "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    for off in ("rbac.admissionPolicy=false", "rbac.create=false"):
        assert not objects_of(helm.template(set_values=[off]), "ValidatingAdmissionPolicy")


def test_rbac_rules_are_exactly_the_table_in_the_chart_readme(helm: Helm) -> None:
    docs = helm.template()
    rendered = {("namespaced", *g) for g in _grants(_rules(docs, "-operator"))}
    rendered |= {("cluster", *g) for g in _grants(_rules(docs, "-operator-cluster"))}
    readme = (CHART_DIR / "README.md").read_text()
    table = readme.split("<!-- rbac-table:start -->", 1)[1].split("<!-- rbac-table:end -->", 1)[0]
    documented: set[tuple[str, str, str, str]] = set()
    for line in table.strip().splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        scope, group, resources, verbs = cells[0], cells[1].strip("`"), cells[2], cells[3]
        group = "" if group == "(core)" else group
        for resource in re.findall(r"`([^`]+)`", resources):
            for verb in (v.strip() for v in verbs.split(",")):
                documented.add((scope, group, resource, verb))
    assert documented == rendered


def test_rbac_never_grants_secrets_wildcards_or_privilege_escalation(helm: Helm) -> None:
    docs = helm.template()
    grants = _grants(_rules(docs, "-operator")) | _grants(_rules(docs, "-operator-cluster"))
    resources = {resource for _, resource, _ in grants}
    verbs = {verb for _, _, verb in grants}
    assert "secrets" not in resources
    assert "*" not in resources and "*" not in verbs
    assert not {"escalate", "bind", "impersonate"} & verbs
    assert not {"pods/exec", "pods/attach", "pods/portforward", "nodes", "clusterroles"} & resources
    assert {verb for _, resource, verb in grants if resource == "pods"} <= {"get", "list", "watch"}
    assert "update" not in {verb for _, resource, verb in grants if "/" not in resource}


def test_watched_namespaces_get_rolebindings_and_no_cluster_wide_grant_of_namespaced_rules(
    helm: Helm,
) -> None:
    docs = helm.template(set_values=["watchNamespaces={team-a,team-b}"])
    bindings = objects_of(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "trainop-operator",
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "trainop", "namespace": "trainop-system"}
        ]
    (cluster_binding,) = objects_of(docs, "ClusterRoleBinding")
    assert cluster_binding["roleRef"]["name"] == "trainop-operator-cluster"


def test_cluster_wide_install_binds_the_namespaced_rules_cluster_wide(helm: Helm) -> None:
    bindings = objects_of(helm.template(), "ClusterRoleBinding")
    assert sorted(b["roleRef"]["name"] for b in bindings) == ["trainop-operator", "trainop-operator-cluster"]
    assert not objects_of(helm.template(), "RoleBinding")


def test_existing_service_account_needs_a_name(helm: Helm) -> None:
    result = helm.run(*helm.template_args(set_values=["serviceAccount.create=false"]), check=False)
    assert result.returncode != 0
    assert "serviceAccount.name is required when serviceAccount.create is false" in result.stderr
    docs = helm.template(set_values=["serviceAccount.create=false", "serviceAccount.name=platform-sa"])
    assert not objects_of(docs, "ServiceAccount")
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "platform-sa"


def test_rendered_output_is_valid_yaml_for_kubectl(helm: Helm) -> None:
    """Every document has apiVersion/kind/metadata.name and every namespaced object a namespace."""
    cluster_scoped = {
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for doc in helm.template(values=[FULL_VALUES]):
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"]
        assert len(doc["metadata"]["name"]) <= 63
        if doc["kind"] not in cluster_scoped:
            assert doc["metadata"].get("namespace"), (
                f"{doc['kind']}/{doc['metadata']['name']} has no namespace"
            )


def test_helm_template_fails_on_a_broken_chart_copy(helm: Helm, tmp_path: Path) -> None:
    """Guards the guard: a template error must surface as a failed render, not an empty one."""
    broken = tmp_path / "trainop"
    subprocess.run(["cp", "-r", str(CHART_DIR), str(broken)], check=True)
    (broken / "templates" / "deployment.yaml").write_text("{{ .Values.nope.nested }}\n")
    result = helm.run("template", "t", str(broken), check=False)
    assert result.returncode != 0
    assert "nil pointer evaluating interface {}.nested" in result.stderr


def test_the_price_per_gpu_hour_reaches_the_operators_environment(helm: Helm) -> None:
    def env(*set_values: str) -> dict[str, str]:
        deployment = next(d for d in helm.template(set_values=set_values) if d["kind"] == "Deployment")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in container["env"]}

    priced = env("cost.pricePerGpuHour=2.5", "cost.currency=EUR")
    assert (priced["TRAINOP_PRICE_PER_GPU_HOUR"], priced["TRAINOP_CURRENCY"]) == ("2.5", "EUR")
    unpriced = env()
    assert "TRAINOP_PRICE_PER_GPU_HOUR" not in unpriced and unpriced["TRAINOP_CURRENCY"] == "USD"
