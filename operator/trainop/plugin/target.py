"""NAME on the command line to the object it means, and the Ray pods of its current attempt.

A TrainingJob and a TuningSweep may share a name; without ``--sweep`` a TrainingJob is looked up first,
then a TuningSweep. The Ray pods are found by the labels the operator puts on the pod templates (owner
label and ``trainop.dev/attempt``, which KubeRay copies onto the pods) and KubeRay's ``ray.io/node-type``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainop.controller import kinds
from trainop.plugin import kubectl as kubectl_module

RAY_NODE_TYPE_LABEL = "ray.io/node-type"


class TargetError(Exception):
    """A sentence for the user: what is missing and what to do."""


@dataclasses.dataclass(frozen=True)
class Target:
    kind: kinds.Kind
    body: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"].get("namespace") or "default")

    @property
    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.body.get("status") or {}
        return status

    @property
    def attempt(self) -> int:
        return int(self.status.get("attempt") or 0)

    @property
    def phase(self) -> str:
        return str(self.status.get("phase") or "Pending")

    @property
    def resource(self) -> str:
        """The name kubectl knows the kind by: ``trainingjob.trainop.dev``."""
        return f"{self.kind.kind.lower()}.{self.kind.api_version.split('/')[0]}"

    def describe(self) -> str:
        return f"{self.kind.kind} {self.namespace}/{self.name}"


def resolve(client: kubectl_module.Kubectl, name: str, *, sweep: bool = False) -> Target:
    candidates = [kinds.TUNING_SWEEP] if sweep else [kinds.TRAINING_JOB, kinds.TUNING_SWEEP]
    for kind in candidates:
        resource = f"{kind.kind.lower()}.{kind.api_version.split('/')[0]}"
        body = client.get(resource, name)
        if body is not None:
            return Target(kind=kind, body=body)
    what = "TuningSweep" if sweep else "TrainingJob or TuningSweep"
    where = f"namespace {client.namespace}" if client.namespace else "the current namespace"
    raise TargetError(f"no {what} named {name} in {where}: check the name, or pass -n NAMESPACE")


def ray_pods(
    client: kubectl_module.Kubectl, target: Target, *, node_type: str | None = None
) -> list[dict[str, Any]]:
    """The Ray pods of the target's current attempt (head and workers, or one ``node_type``)."""
    selector = f"{target.kind.owner_label}={target.name},{kinds.LABEL_ATTEMPT}={target.attempt}"
    if node_type:
        selector += f",{RAY_NODE_TYPE_LABEL}={node_type}"
    return client.list("pods", selector=selector)


def running(pod: dict[str, Any], container: str) -> bool:
    """Whether the pod runs and its container ``container`` is up."""
    if (pod.get("status") or {}).get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
        return False
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            return "running" in (status.get("state") or {})
    return False
