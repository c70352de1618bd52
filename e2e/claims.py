"""Reading what a job left on its checkpoint claim, after the job is gone.

The Ray pods are deleted when the RayJob ends, so a short-lived pod mounts the claim read-only and lists
it, as a user would (image from ``E2E_TRAINER_IMAGE``, the trainer image, which has a shell and Python).
On the cluster bed the scheduler puts it on the claim's node (the volume's node affinity).
"""

from __future__ import annotations

import json
import os
import time
import uuid

from e2e import cluster as cluster_module

TRAINER_IMAGE_ENV = "E2E_TRAINER_IMAGE"


class ClaimFiles:
    """A pod that mounts the claim read-only and prints what is asked (Pod Security ``restricted``)."""

    def __init__(self, cluster: cluster_module.Cluster) -> None:
        self.cluster = cluster
        self.image = os.environ.get(TRAINER_IMAGE_ENV, "ghcr.io/trainop/trainer:0.1.0")

    def _run(self, namespace: str, claim: str, script: str) -> str:
        name = f"claim-reader-{uuid.uuid4().hex[:6]}"
        overrides = {
            "spec": {
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 1000,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [
                    {
                        "name": "reader",
                        "image": self.image,
                        "command": ["sh", "-c", script],
                        "volumeMounts": [{"name": "claim", "mountPath": "/claim", "readOnly": True}],
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }
                ],
                "volumes": [
                    {"name": "claim", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
                ],
            }
        }
        self.cluster.kubectl(
            "run",
            name,
            "-n",
            namespace,
            f"--image={self.image}",
            "--restart=Never",
            f"--overrides={json.dumps(overrides)}",
        )
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                phase = (
                    self.cluster.kubectl_json("get", "pod", name, "-n", namespace)
                    .get("status", {})
                    .get("phase")
                )
                if phase in ("Succeeded", "Failed"):
                    break
                time.sleep(2)
            return self.cluster.kubectl("logs", name, "-n", namespace).stdout
        finally:
            self.cluster.kubectl("delete", "pod", name, "-n", namespace, "--wait=false", check=False)

    def files(self, namespace: str, claim: str, under: str) -> list[str]:
        """Paths of every file below ``under`` on the claim, relative to ``under``, sorted."""
        out = self._run(namespace, claim, f"cd /claim/{under} && find . -type f | sed 's|^./||' | sort")
        return [line for line in out.splitlines() if line]

    def read(self, namespace: str, claim: str, path: str) -> str:
        return self._run(namespace, claim, f"cat /claim/{path}")
