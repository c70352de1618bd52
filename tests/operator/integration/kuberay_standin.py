"""STAND-IN for KubeRay's Go controller, which cannot run in the test control plane (no kubelet, no Ray).

It is the only mock in the operator's tests, and it mocks exactly one thing: who writes a RayJob's
status. Each method makes the status-subresource change KubeRay v1.5 makes at that point of a RayJob's
life (see ray-operator/controllers/ray/rayjob_controller.go), with the same field names and values:

    initialize()   New -> Initializing         (KubeRay: initRayJobStatusIfNeed)
    run()          Initializing -> Running      jobStatus RUNNING (HTTPMode: submitted via the dashboard)
    succeed()      Running -> Complete          jobStatus SUCCEEDED, endTime
    fail()         Running -> Failed            jobStatus FAILED, reason AppFailed, message from Ray
    reject()       -> ValidationFailed          reason ValidationFailed (KubeRay refused the spec)

What it does not do: create a RayCluster or pods, add KubeRay's finalizer, or clean up after a deleted
RayJob (the garbage collector of the real control plane still removes RayJobs of deleted owners).
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from tests.controlplane import cluster


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
        return self._patch_status(
            namespace,
            name,
            {
                "jobDeploymentStatus": "Initializing",
                "jobStatus": "",
                "jobId": f"{name}-x7k2p",
                "rayClusterName": f"{name}-raycluster-q9v4c",
                "startTime": _now(),
                "failed": 0,
                "succeeded": 0,
            },
        )

    def run(self, namespace: str, name: str) -> dict[str, Any]:
        self.initialize(namespace, name)
        return self._patch_status(
            namespace,
            name,
            {
                "jobDeploymentStatus": "Running",
                "jobStatus": "RUNNING",
                "dashboardURL": f"{name}-head-svc.{namespace}.svc.cluster.local:8265",
                "rayJobInfo": {"startTime": _now()},
            },
        )

    def succeed(self, namespace: str, name: str) -> dict[str, Any]:
        return self._patch_status(
            namespace,
            name,
            {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "endTime": _now(), "succeeded": 1},
        )

    def fail(self, namespace: str, name: str, message: str = "", reason: str = "AppFailed") -> dict[str, Any]:
        return self._patch_status(
            namespace,
            name,
            {
                "jobDeploymentStatus": "Failed",
                "jobStatus": "FAILED",
                "reason": reason,
                "message": message or "Job entrypoint command failed with exit code 1",
                "endTime": _now(),
                "failed": 1,
            },
        )

    def reject(self, namespace: str, name: str, message: str) -> dict[str, Any]:
        return self._patch_status(
            namespace,
            name,
            {"jobDeploymentStatus": "ValidationFailed", "reason": "ValidationFailed", "message": message},
        )
