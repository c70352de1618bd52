"""STAND-IN for KubeRay's Go controller in the operator tier (no pods run here): a test-driven writer of the
RayJob statuses that KubeRay v1.5 writes, taken from ``tests/kuberay_lifecycle.py`` -- the one definition of
them, held to recordings of the real controller (see that module).

It is the only mock in the operator's tests, and it mocks exactly one thing: who writes a RayJob's
status. Each method makes the status-subresource changes KubeRay makes at that point of a RayJob's life:

    initialize()   New -> Initializing                 (KubeRay: initRayJobStatusIfNeed)
    run()          -> Running (cluster ready) -> Running/PENDING (submitted) -> Running/RUNNING
    succeed()      Running -> Complete/SUCCEEDED
    fail()         Running -> Failed/FAILED, reason AppFailed, message from Ray
    reject()       -> ValidationFailed                  (KubeRay refused the spec)

What it does not do: create a RayCluster or pods, add KubeRay's finalizer, or clean up after a deleted
RayJob (the garbage collector of the real control plane still removes RayJobs of deleted owners).
"""

from __future__ import annotations

import json
from typing import Any

from tests import kuberay_lifecycle
from tests.controlplane import cluster


class KubeRayStandIn:
    def __init__(self, plane: cluster.ControlPlane) -> None:
        self._plane = plane

    def _patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        code, body = self._plane.request(
            "PATCH",
            f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/{name}/status",
            body=json.dumps({"status": status}).encode(),
            content_type="application/merge-patch+json",
        )
        assert code == 200, (code, body)
        return body

    def initialize(self, namespace: str, name: str) -> dict[str, Any]:
        return self._patch_status(namespace, name, kuberay_lifecycle.initializing(name))

    def run(self, namespace: str, name: str) -> dict[str, Any]:
        self.initialize(namespace, name)
        self._patch_status(namespace, name, kuberay_lifecycle.cluster_ready(name, namespace))
        self._patch_status(namespace, name, kuberay_lifecycle.submitted())
        return self._patch_status(namespace, name, kuberay_lifecycle.running())

    def succeed(self, namespace: str, name: str) -> dict[str, Any]:
        return self._patch_status(namespace, name, kuberay_lifecycle.succeeded())

    def fail(self, namespace: str, name: str, message: str = "", reason: str = "AppFailed") -> dict[str, Any]:
        return self._patch_status(namespace, name, kuberay_lifecycle.failed(message, reason))

    def reject(self, namespace: str, name: str, message: str) -> dict[str, Any]:
        return self._patch_status(namespace, name, kuberay_lifecycle.validation_failed(message))
