"""Manifest builders for the operator's tests: a small valid TrainingJob/TuningSweep, with overrides."""

from __future__ import annotations

import copy
from typing import Any

API_VERSION = "trainop.dev/v1alpha1"

# Small and CPU-only, with short backoffs: what the integration tests apply, and the unit tests' base.
JOB_SPEC: dict[str, Any] = {
    "workload": {"model": "mlp", "dataset": {"kind": "synthetic", "numSamples": 256, "numClasses": 10}},
    "hyperparameters": {"maxSteps": 50, "batchSizePerWorker": 8, "learningRate": 0.05},
    "precision": "fp32",
    "workers": {
        "replicas": 2,
        "gpusPerWorker": 0,
        "cpusPerWorker": 1,
        "memoryPerWorker": "2Gi",
        "sharedMemory": "256Mi",
    },
    "checkpoint": {"intervalSteps": 10, "keepLast": 2, "storage": {"size": "1Gi"}},
    "failurePolicy": {"maxRestarts": 2, "backoffSeconds": 1, "maxBackoffSeconds": 2},
}

SWEEP_SPEC: dict[str, Any] = {
    "template": copy.deepcopy(JOB_SPEC),
    "searchSpace": {"hyperparameters.learningRate": {"type": "loguniform", "lower": 0.001, "upper": 0.5}},
    "numTrials": 4,
    "maxConcurrentTrials": 2,
}


# A sweep the apiserver admits but the models refuse (manifest.OPERATOR_ONLY_RULES: with algorithm grid,
# numTrials must equal the number of grid points, here 2): how the operator's InvalidSpec path is reached
# now that every TrainingJob rule is also a CEL rule of the CRD.
GRID_SIZE_MISMATCH: dict[str, Any] = {
    "searchSpace": {"hyperparameters.learningRate": {"type": "grid", "values": [0.1, 0.05]}},
    "algorithm": "grid",
    "numTrials": 3,
}
GRID_SIZE_FIXED: dict[str, Any] = {**GRID_SIZE_MISMATCH, "numTrials": 2}


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """A deep merge (override wins; a None value removes the key)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def job(
    name: str = "mlp",
    namespace: str = "team-a",
    *,
    spec: dict[str, Any] | None = None,
    uid: str | None = "0f0e0d0c-0000-4000-8000-000000000001",
    generation: int = 1,
    status: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    kind: str = "TrainingJob",
) -> dict[str, Any]:
    base = JOB_SPEC if kind == "TrainingJob" else SWEEP_SPEC
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace, "generation": generation},
        "spec": merge(base, spec or {}),
    }
    if uid is not None:
        body["metadata"]["uid"] = uid
    if annotations:
        body["metadata"]["annotations"] = dict(annotations)
    if status is not None:
        body["status"] = status
    return body


def sweep(name: str = "lr", namespace: str = "team-a", **kwargs: Any) -> dict[str, Any]:
    return job(name, namespace, kind="TuningSweep", **kwargs)


def manifest(
    name: str, namespace: str, *, kind: str = "TrainingJob", spec: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What a user applies: no uid, generation or status."""
    body = job(name, namespace, spec=spec, uid=None, kind=kind)
    del body["metadata"]["generation"]
    return body


def held_ray_pod(
    name: str, job: str, attempt: int, *, owner_uid: str | None = None, grace_s: int = 120
) -> dict[str, Any]:
    """A Ray worker pod as KubeRay would make one for ``job``'s attempt, held by a finalizer once deleted
    (no kubelet runs in the operator tier to confirm it stopped): deleting it leaves it Terminating for its
    grace period, as a worker whose preStop hook is still checkpointing. ``owner_uid``: the owner
    incarnation's label (``trainop.dev/owner-uid``)."""
    labels = {
        "app.kubernetes.io/managed-by": "trainop",
        "trainop.dev/job": job,
        "trainop.dev/attempt": str(attempt),
        "ray.io/node-type": "worker",
    }
    if owner_uid is not None:
        labels["trainop.dev/owner-uid"] = owner_uid
    return {
        "metadata": {"name": name, "labels": labels, "finalizers": ["trainop.test/hold"]},
        "spec": {
            "containers": [{"name": "ray-worker", "image": "ghcr.io/trainop/trainer:0.1.0"}],
            "terminationGracePeriodSeconds": grace_s,
            # Bound to a node: the apiserver deletes an unbound pod at once, without its grace period.
            "nodeName": "node-gone",
        },
    }
