"""``trainop render FILE``: the objects the operator would create for a manifest, offline (like
``helm template``).

The objects come from the operator's own pure builders (``trainop.controller.children.desired_children``)
for attempt 1, from the manifest validated by the same models, so what is printed is what the operator
creates -- a test compares the two object for object against a real apiserver. The operator builds from
the object as the apiserver stored it, so the manifest first takes the same way here:

- the namespace (the manifest's, else ``--namespace``, else ``default``) and the owner's uid, which the
  apiserver assigns (``--uid``, else ``PLACEHOLDER_UID``, which owner references then carry);
- numbers as the apiserver's JSON gives them back: a whole number written as a float (``0.0``) comes back
  as an integer (``0``). Typed fields turn it into a float again; free-form values (a searchSpace's
  ``values``, ``workload.config``) keep the integer, and so does the trainer config the operator renders.

A leading comment sums up the pods the RayJob asks KubeRay for, with their requests: what the cluster must
find room for. This module must not talk to the API.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

from trainop.api import manifest, resources
from trainop.controller import children, kinds, rayjob

#: A syntactically valid uid that says it is not a real one.
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"
DEFAULT_NAMESPACE = "default"


def with_cluster_facts(
    resource: manifest.Resource, *, namespace: str | None, uid: str | None
) -> manifest.Resource:
    """The resource as the operator reads it back from the apiserver: in a namespace, with a uid, its
    numbers as JSON from the apiserver has them."""
    wire = _as_apiserver_numbers(resource.to_wire())
    wire["metadata"]["namespace"] = resource.metadata.namespace or namespace or DEFAULT_NAMESPACE
    wire["metadata"]["uid"] = uid or PLACEHOLDER_UID
    return manifest.parse_object(wire, source=f"{resource.kind}/{resource.metadata.name}")


def _as_apiserver_numbers(value: Any) -> Any:
    """Whole floats as integers, as the apiserver (Go's JSON, float64) writes them back."""
    if isinstance(value, dict):
        return {k: _as_apiserver_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_apiserver_numbers(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    return value


def objects(resource: manifest.Resource, *, attempt: int = 1) -> list[dict[str, Any]]:
    """Every child the operator creates for ``resource`` in ``attempt``, in creation order."""
    return children.desired_children(resource, attempt)


def pod_summary(resource: manifest.Resource, rendered: Iterable[dict[str, Any]]) -> list[str]:
    """Comment lines: every Ray pod group with its count and requests, and the total."""
    (ray_job,) = [o for o in rendered if o["kind"] == "RayJob"]
    cluster = ray_job["spec"]["rayClusterSpec"]
    groups = [("head", 1, cluster["headGroupSpec"]["template"])]
    groups += [(g["groupName"], g["replicas"], g["template"]) for g in cluster["workerGroupSpecs"]]
    lines = [f"{kinds.kind_of(resource).kind} {resource.metadata.name}, attempt 1: the Ray pods it asks for"]
    total_cpu = 0.0
    total_memory = 0
    total_gpus = 0
    for name, count, template in groups:
        pod = rayjob.pod_requests(template["spec"])
        (shm,) = [
            v["emptyDir"]["sizeLimit"] for v in template["spec"]["volumes"] if v["name"] == rayjob.VOLUME_SHM
        ]
        gpu_text = f", {pod.gpus} GPU" if pod.gpus else ""
        memory = resources.format_bytes(pod.memory_bytes)
        sizes = f"cpu {pod.cpu:g}, memory {memory}{gpu_text}; /dev/shm {shm}"
        lines.append(f"  {name}: {count} x ({sizes})")
        total_cpu += count * pod.cpu
        total_memory += count * pod.memory_bytes
        total_gpus += count * pod.gpus
    gpu_total = f", {total_gpus} GPU" if total_gpus else ""
    lines.append(
        f"  requests in all: cpu {total_cpu:g}, memory {resources.format_bytes(total_memory)}{gpu_total}"
    )
    return lines


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the trainer config's JSON) as literal blocks, readable as the file it is."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render_text(resources_: Iterable[manifest.Resource], *, namespace: str | None, uid: str | None) -> str:
    """YAML documents of every child of every resource, each group led by its pod summary."""
    documents: list[str] = []
    for resource in resources_:
        stored = with_cluster_facts(resource, namespace=namespace, uid=uid)
        rendered = objects(stored)
        header = "".join(f"# {line}\n" for line in pod_summary(stored, rendered))
        for i, obj in enumerate(rendered):
            text = yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=110)
            documents.append((header if i == 0 else "") + text)
    return "---\n".join(documents)
