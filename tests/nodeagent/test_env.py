"""The kubelet's environment rules (``env.py``): expansion, downward API, service links, precedence."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from tests.nodeagent import env

JSON = dict[str, Any]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)", "a"),
        ("x-$(A)-$(B)", "x-a-b"),
        ("$$(A)", "$(A)"),  # escaped reference
        ("$$", "$"),
        ("$(MISSING)", "$(MISSING)"),  # unknown references stay as written
        ("$(A", "$(A"),  # unterminated
        ("$A", "$A"),  # shell syntax is not expanded
        ("a$", "a$"),
        ("$()", "$()"),
    ],
)
def test_expand_follows_the_kubelets_rules(text: str, expected: str) -> None:
    assert env.expand(text, {"A": "a", "B": "b"}.get) == expected


def _pod(**spec: Any) -> JSON:
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u-1",
            "labels": {"b": "2", "a": 'x"y'},
            "annotations": {"note": "n"},
        },
        "spec": {"nodeName": "node-a", "serviceAccountName": "sa", "containers": [], **spec},
        "status": {"podIP": "10.244.1.5", "podIPs": [{"ip": "10.244.1.5"}], "hostIP": "172.29.1.2"},
    }


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("metadata.name", "p"),
        ("metadata.namespace", "ns"),
        ("metadata.uid", "u-1"),
        ("metadata.labels", 'a="x\\"y"\nb="2"'),
        ("metadata.labels['b']", "2"),
        ("metadata.annotations['note']", "n"),
        ("spec.nodeName", "node-a"),
        ("spec.serviceAccountName", "sa"),
        ("status.podIP", "10.244.1.5"),
        ("status.podIPs", "10.244.1.5"),
        ("status.hostIP", "172.29.1.2"),
    ],
)
def test_field_values_are_the_downward_apis(field: str, value: str) -> None:
    assert env.field_value(_pod(), field) == value


def test_unsupported_field_path_is_a_config_error() -> None:
    with pytest.raises(env.EnvError, match=r"spec\.hostname"):
        env.field_value(_pod(), "spec.hostname")


def test_resource_values_round_up_by_divisor_and_fall_back_to_node_allocatable() -> None:
    container = {"name": "c", "resources": {"limits": {"cpu": "1500m", "memory": "1Gi"}}}
    pod = _pod(containers=[container])
    allocatable = {"cpu": "4", "memory": "8Gi"}

    def value(ref: JSON) -> str:
        return env.resource_value(pod, ref, default_container="c", node_allocatable=allocatable)

    assert value({"resource": "limits.cpu"}) == "2"  # 1.5 cores rounded up
    assert value({"resource": "limits.cpu", "divisor": "1m"}) == "1500"
    assert value({"resource": "limits.memory", "divisor": "1Mi"}) == "1024"
    assert value({"resource": "requests.cpu", "divisor": "1m"}) == "1500"  # requests default to limits
    pod["spec"]["containers"] = [{"name": "c"}]
    assert value({"resource": "limits.cpu"}) == "4"  # no limit: the node's allocatable


def _service(name: str, namespace: str, ip: str, ports: list[JSON]) -> env.ServiceInfo:
    return env.ServiceInfo.from_object(
        {"metadata": {"name": name, "namespace": namespace}, "spec": {"clusterIP": ip, "ports": ports}}
    )


def test_service_links_follow_dockers_naming_and_the_kubernetes_service_is_always_there() -> None:
    services = [
        _service("kubernetes", "default", "10.0.0.1", [{"name": "https", "port": 443, "protocol": "TCP"}]),
        _service(
            "ray-head",
            "ns",
            "10.0.0.20",
            [{"name": "gcs", "port": 6379}, {"name": "dash-board", "port": 8265}],
        ),
        _service("headless", "ns", "None", [{"port": 80}]),
        _service("elsewhere", "other", "10.0.0.30", [{"port": 80}]),
    ]
    linked = env.service_env(services, namespace="ns", enable_service_links=True, master_namespace="default")
    assert linked["KUBERNETES_SERVICE_HOST"] == "10.0.0.1"
    assert linked["KUBERNETES_SERVICE_PORT"] == "443"
    assert linked["KUBERNETES_SERVICE_PORT_HTTPS"] == "443"
    assert linked["RAY_HEAD_SERVICE_HOST"] == "10.0.0.20"
    assert linked["RAY_HEAD_SERVICE_PORT"] == "6379"
    assert linked["RAY_HEAD_SERVICE_PORT_DASH_BOARD"] == "8265"
    assert linked["RAY_HEAD_PORT"] == "tcp://10.0.0.20:6379"
    assert linked["RAY_HEAD_PORT_8265_TCP_ADDR"] == "10.0.0.20"
    assert linked["RAY_HEAD_PORT_8265_TCP_PROTO"] == "tcp"
    assert not any(key.startswith(("HEADLESS_", "ELSEWHERE_")) for key in linked)
    unlinked = env.service_env(
        services, namespace="ns", enable_service_links=False, master_namespace="default"
    )
    assert set(unlinked) == {key for key in linked if key.startswith("KUBERNETES_")}


def _sources(**kwargs: Any) -> env.EnvSources:
    defaults: JSON = {"config_maps": {}, "secrets": {}, "services": [], "node_allocatable": {"cpu": "2"}}
    return env.EnvSources(**{**defaults, **kwargs})


def test_container_env_applies_envfrom_then_env_with_expansion_then_services() -> None:
    config_map = {"data": {"MODE": "fast", "SHARED": "from-configmap"}}
    secret = {"data": {"password": base64.b64encode(b"s3cret").decode()}}
    container = {
        "name": "c",
        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}, {"configMapRef": {"name": "cfg"}}],
        "env": [
            {"name": "SHARED", "value": "from-env"},  # env wins over envFrom
            {"name": "GREETING", "value": "mode=$(MODE) on $(KUBERNETES_SERVICE_HOST) $(LATER)"},
            {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
            {
                "name": "MISSING_OK",
                "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": True}},
            },
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "LATER", "value": "late"},
            {"name": "KUBERNETES_SERVICE_HOST", "value": "overridden"},
        ],
    }
    kubernetes_service = _service("kubernetes", "default", "10.0.0.1", [{"name": "https", "port": 443}])
    result = env.container_env(
        _pod(containers=[container]),
        container,
        _sources(config_maps={"cfg": config_map}, secrets={"creds": secret}, services=[kubernetes_service]),
    )
    assert result["CFG_MODE"] == "fast"
    assert result["SHARED"] == "from-env"
    # Expansion sees what came before (and service variables), not what comes later.
    assert result["GREETING"] == "mode=fast on 10.0.0.1 $(LATER)"
    assert result["PASSWORD"] == "s3cret"
    assert "MISSING_OK" not in result
    assert result["POD_IP"] == "10.244.1.5"
    assert result["KUBERNETES_SERVICE_HOST"] == "overridden"  # an explicit env entry beats the service
    assert result["KUBERNETES_SERVICE_PORT"] == "443"


@pytest.mark.parametrize(
    ("value_from", "message"),
    [
        ({"configMapKeyRef": {"name": "absent", "key": "k"}}, "configmap 'absent' not found"),
        ({"configMapKeyRef": {"name": "cfg", "key": "absent"}}, "has no key 'absent'"),
        ({"secretKeyRef": {"name": "absent", "key": "k"}}, "secret 'absent' not found"),
    ],
)
def test_missing_required_references_are_config_errors_naming_them(value_from: JSON, message: str) -> None:
    container = {"name": "c", "env": [{"name": "X", "valueFrom": value_from}]}
    with pytest.raises(env.EnvError, match=message):
        env.container_env(_pod(), container, _sources(config_maps={"cfg": {"data": {"k": "v"}}}))


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        ({}, ["/entry", "--flag", "default-cmd"]),
        ({"args": ["a", "$(V)"]}, ["/entry", "--flag", "a", "v"]),
        ({"command": ["sh", "-c"], "args": ["echo $(V)"]}, ["sh", "-c", "echo v"]),
        ({"command": ["run"]}, ["run"]),  # a command drops the image's CMD too
    ],
)
def test_command_line_follows_docker_with_pod_words_expanded(container: JSON, expected: list[str]) -> None:
    argv = env.command_line(
        container, image_entrypoint=["/entry", "--flag"], image_cmd=["default-cmd"], env={"V": "v"}
    )
    assert argv == expected
