"""A container's environment and command line, as the kubelet makes them: pure functions of dicts.

Owns ``$(VAR)`` expansion (the kubelet's ``third_party/forked/golang/expansion`` rules), downward-API
field and resource values (shared with downwardAPI volumes), the Docker-style service links, and the
order the kubelet applies: envFrom, then env (each value expanded against what came before plus the
service variables), then service variables not already defined. It reads no files and calls no API;
the pod worker passes in the ConfigMaps, Secrets and Services it fetched.
"""

from __future__ import annotations

import base64
import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity as _parse_quantity

JSON = dict[str, Any]


class EnvError(ValueError):
    """A reference the kubelet would refuse (missing key, unsupported field); the message names it.

    ``reason`` is the container waiting reason the kubelet reports for it.
    """

    reason = "CreateContainerConfigError"


def quantity(value: object) -> Decimal:
    """A resource quantity ("100m", "1Gi") as a Decimal (the kubernetes library's parser, typed)."""
    parsed: Decimal = _parse_quantity(str(value))  # type: ignore[no-untyped-call]
    return parsed


# -------------------------------------------------------------------------------------- expansion
def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    """Expand ``$(VAR)`` like the kubelet: ``$$`` is a literal ``$``, an unknown or unterminated
    reference stays as written, any other ``$x`` is kept verbatim."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "$" or i + 1 >= len(text):
            out.append(char)
            i += 1
            continue
        following = text[i + 1]
        if following == "$":
            out.append("$")
            i += 2
        elif following == "(":
            end = text.find(")", i + 2)
            if end == -1:  # unterminated: kept verbatim
                out.append(text[i:])
                break
            name = text[i + 2 : end]
            value = lookup(name) if name else None
            out.append(value if value is not None else text[i : end + 1])
            i = end + 1
        else:
            out.append(char)
            i += 1
    return "".join(out)


# ---------------------------------------------------------------------------------- downward API
def _format_map(values: Mapping[str, str]) -> str:
    """labels/annotations as the kubelet writes them: ``key="value"`` lines, sorted, value Go-quoted."""
    return "\n".join(f"{key}={_go_quote(values[key])}" for key in sorted(values))


def _go_quote(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped}"'


_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def field_value(pod: JSON, field_path: str) -> str:
    """The value of a ``fieldRef`` (env or downwardAPI volume) for ``pod``."""
    metadata, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    if match := _SUBSCRIPT.match(field_path):
        return str((metadata.get(match.group(1)) or {}).get(match.group(2), ""))
    simple: dict[str, Callable[[], str]] = {
        "metadata.name": lambda: str(metadata.get("name", "")),
        "metadata.namespace": lambda: str(metadata.get("namespace", "")),
        "metadata.uid": lambda: str(metadata.get("uid", "")),
        "metadata.labels": lambda: _format_map(metadata.get("labels") or {}),
        "metadata.annotations": lambda: _format_map(metadata.get("annotations") or {}),
        "spec.nodeName": lambda: str(spec.get("nodeName", "")),
        "spec.serviceAccountName": lambda: str(spec.get("serviceAccountName", "")),
        "status.hostIP": lambda: str(status.get("hostIP", "")),
        "status.hostIPs": lambda: ",".join(entry["ip"] for entry in status.get("hostIPs") or []),
        "status.podIP": lambda: str(status.get("podIP", "")),
        "status.podIPs": lambda: ",".join(entry["ip"] for entry in status.get("podIPs") or []),
    }
    if field_path not in simple:
        raise EnvError(f"fieldRef.fieldPath {field_path!r} is not supported by the kubelet")
    return simple[field_path]()


def resource_value(
    pod: JSON, ref: JSON, *, default_container: str | None, node_allocatable: Mapping[str, str]
) -> str:
    """The value of a ``resourceFieldRef``: limits fall back to the node's allocatable (as the kubelet
    does), the result is divided by ``divisor`` and rounded up (CPU in cores by default)."""
    container_name = ref.get("containerName") or default_container
    resource = str(ref["resource"])
    containers = [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]
    container = next((c for c in containers if c["name"] == container_name), None)
    if container is None:
        raise EnvError(f"resourceFieldRef.containerName {container_name!r}: no such container")
    kind, _, name = resource.partition(".")
    if kind not in ("limits", "requests") or name not in ("cpu", "memory", "ephemeral-storage"):
        raise EnvError(f"resourceFieldRef.resource {resource!r} is not supported")
    resources = container.get("resources") or {}
    raw = (resources.get(kind) or {}).get(name)
    if raw is None and kind == "requests":
        raw = (resources.get("limits") or {}).get(name)
    if raw is None:
        raw = node_allocatable.get(name, "0")
    divisor = quantity(ref.get("divisor") or "1")
    if divisor == 0:
        raise EnvError("resourceFieldRef.divisor must not be 0")
    value = quantity(raw) / divisor
    return str(math.ceil(value))


# ------------------------------------------------------------------------------------- services
@dataclasses.dataclass(frozen=True, kw_only=True)
class ServiceInfo:
    """What service links need of a Service: its name, ClusterIP and ports."""

    namespace: str
    name: str
    cluster_ip: str
    ports: tuple[tuple[str, int, str], ...]  # (name, port, protocol)

    @classmethod
    def from_object(cls, service: JSON) -> ServiceInfo:
        spec = service.get("spec") or {}
        return cls(
            namespace=service["metadata"]["namespace"],
            name=service["metadata"]["name"],
            cluster_ip=str(spec.get("clusterIP") or ""),
            ports=tuple(
                (str(port.get("name") or ""), int(port["port"]), str(port.get("protocol") or "TCP"))
                for port in spec.get("ports") or []
            ),
        )

    @property
    def has_cluster_ip(self) -> bool:
        return self.cluster_ip not in ("", "None")


def _service_env(service: ServiceInfo) -> dict[str, str]:
    prefix = service.name.upper().replace("-", "_")
    env: dict[str, str] = {}
    if not service.ports:
        return env
    env[f"{prefix}_SERVICE_HOST"] = service.cluster_ip
    _first_name, first_port, first_protocol = service.ports[0]
    env[f"{prefix}_SERVICE_PORT"] = str(first_port)
    for name, port, _ in service.ports:
        if name:
            env[f"{prefix}_SERVICE_PORT_{name.upper().replace('-', '_')}"] = str(port)
    env[f"{prefix}_PORT"] = f"{first_protocol.lower()}://{service.cluster_ip}:{first_port}"
    for _, port, protocol in service.ports:
        key = f"{prefix}_PORT_{port}_{protocol.upper()}"
        env[key] = f"{protocol.lower()}://{service.cluster_ip}:{port}"
        env[f"{key}_PROTO"] = protocol.lower()
        env[f"{key}_PORT"] = str(port)
        env[f"{key}_ADDR"] = service.cluster_ip
    return env


def service_env(
    services: Sequence[ServiceInfo], *, namespace: str, enable_service_links: bool, master_namespace: str
) -> dict[str, str]:
    """The kubelet's service variables: the ``kubernetes`` Service (always) and, with service links on,
    every Service with a ClusterIP in the pod's namespace."""
    env: dict[str, str] = {}
    for service in sorted(services, key=lambda s: (s.namespace, s.name)):
        if not service.has_cluster_ip:
            continue
        is_master = service.namespace == master_namespace and service.name == "kubernetes"
        if is_master or (enable_service_links and service.namespace == namespace):
            env.update(_service_env(service))
    return env


# -------------------------------------------------------------------------------- the environment
@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvSources:
    """What the environment may refer to, already fetched: ``None`` for an object that does not exist."""

    config_maps: Mapping[str, JSON | None]
    secrets: Mapping[str, JSON | None]
    services: Sequence[ServiceInfo]
    node_allocatable: Mapping[str, str]
    master_namespace: str = "default"


def _config_map_data(obj: JSON) -> dict[str, str]:
    data = dict(obj.get("data") or {})
    for key, value in (obj.get("binaryData") or {}).items():
        data[key] = base64.b64decode(value).decode(errors="replace")
    return data


def _secret_data(obj: JSON) -> dict[str, str]:
    return {
        key: base64.b64decode(value).decode(errors="replace")
        for key, value in (obj.get("data") or {}).items()
    }


_VALID_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


def container_env(pod: JSON, container: JSON, sources: EnvSources) -> dict[str, str]:
    """The environment of ``container`` (without the image's own ENV, which the runtime puts first)."""
    namespace = pod["metadata"]["namespace"]
    services = service_env(
        sources.services,
        namespace=namespace,
        enable_service_links=pod["spec"].get("enableServiceLinks", True) is not False,
        master_namespace=sources.master_namespace,
    )
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = str(source.get("prefix") or "")
        if ref := source.get("configMapRef"):
            obj, what = sources.config_maps.get(ref["name"]), f"configmap {ref['name']!r}"
            data = _config_map_data(obj) if obj is not None else None
        else:
            ref = source["secretRef"]
            obj, what = sources.secrets.get(ref["name"]), f"secret {ref['name']!r}"
            data = _secret_data(obj) if obj is not None else None
        if data is None:
            if ref.get("optional"):
                continue
            raise EnvError(f"envFrom: {what} not found")
        for key, value in data.items():
            if _VALID_ENV_NAME.match(prefix + key):  # the kubelet skips invalid names (with an event)
                env[prefix + key] = value

    def lookup(name: str) -> str | None:
        return env.get(name, services.get(name))

    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(str(var.get("value") or ""), lookup)
            continue
        value_from = var["valueFrom"]
        if ref := value_from.get("fieldRef"):
            env[name] = field_value(pod, ref["fieldPath"])
        elif ref := value_from.get("resourceFieldRef"):
            env[name] = resource_value(
                pod, ref, default_container=container["name"], node_allocatable=sources.node_allocatable
            )
        elif ref := value_from.get("configMapKeyRef"):
            obj = sources.config_maps.get(ref["name"])
            found = _config_map_data(obj).get(ref["key"]) if obj is not None else None
            if found is None:
                if ref.get("optional"):
                    continue
                missing = "not found" if obj is None else f"has no key {ref['key']!r}"
                raise EnvError(f"env {name}: configmap {ref['name']!r} {missing}")
            env[name] = found
        elif ref := value_from.get("secretKeyRef"):
            obj = sources.secrets.get(ref["name"])
            found = _secret_data(obj).get(ref["key"]) if obj is not None else None
            if found is None:
                if ref.get("optional"):
                    continue
                missing = "not found" if obj is None else f"has no key {ref['key']!r}"
                raise EnvError(f"env {name}: secret {ref['name']!r} {missing}")
            env[name] = found
        else:
            raise EnvError(f"env {name}: unsupported valueFrom {sorted(value_from)}")
    for key, value in services.items():
        env.setdefault(key, value)
    return env


def referenced_objects(pod: JSON) -> tuple[set[str], set[str]]:
    """Names of the ConfigMaps and Secrets the pod's env and envFrom refer to (to fetch them first)."""
    config_maps: set[str] = set()
    secrets: set[str] = set()
    for container in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]:
        for source in container.get("envFrom") or []:
            if ref := source.get("configMapRef"):
                config_maps.add(ref["name"])
            if ref := source.get("secretRef"):
                secrets.add(ref["name"])
        for var in container.get("env") or []:
            value_from = var.get("valueFrom") or {}
            if ref := value_from.get("configMapKeyRef"):
                config_maps.add(ref["name"])
            if ref := value_from.get("secretKeyRef"):
                secrets.add(ref["name"])
    return config_maps, secrets


def command_line(
    container: JSON, *, image_entrypoint: Sequence[str], image_cmd: Sequence[str], env: Mapping[str, str]
) -> list[str]:
    """Docker's rule for command/args over ENTRYPOINT/CMD, with ``$(VAR)`` expanded in what the pod
    gives (never in the image's own words)."""

    def lookup(name: str) -> str | None:
        return env.get(name)

    command = [expand(word, lookup) for word in container.get("command") or []]
    args = [expand(word, lookup) for word in container.get("args") or []]
    if command:
        return [*command, *args]
    if args:
        return [*image_entrypoint, *args]
    return [*image_entrypoint, *image_cmd]
