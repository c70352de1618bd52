"""Failure injection, the same two failures on both kinds of cluster.

- **kill a worker**: SIGKILL to one Ray Train worker process (the highest rank), as an OOM kill would do.
  Ray Train restarts the worker group inside the attempt (failure layer 1).
- **kill the driver**: SIGKILL to the RayJob's entrypoint process, as losing the head pod would do. The
  RayJob fails and the operator starts the next attempt (failure layer 2).

With the KubeRay stand-in a scenario asks for them the way a chaos tool would, by annotating the RayJob
(``kuberay_standin.ANNOTATION_KILL_*``); the stand-in answers with a Warning Event naming the request. On a
real cluster, ``kubectl exec`` into the Ray pods KubeRay created (labels ``ray.io/cluster`` and
``ray.io/node-type``) does the same.
"""

from __future__ import annotations

import uuid

from e2e import cluster as cluster_module
from e2e import kuberay_standin
from e2e import watch as watch_module

# Runs inside the head pod: SIGKILL the trainer's entrypoint (started by Ray's job supervisor).
_KILL_DRIVER = (
    "import os, signal\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    try:\n"
    "        argv = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')\n"
    "    except OSError:\n"
    "        continue\n"
    "    if b'trainop_trainer' in argv and b'--config' in argv:\n"
    "        os.kill(int(pid), signal.SIGKILL); print('killed', pid, b' '.join(argv).decode())\n"
)
# Runs inside a worker pod: SIGKILL the Ray Train worker that registered its pid there.
_KILL_WORKER = (
    'for f in "${TRAINOP_PID_DIR:-/tmp/trainop/pids}"/*.pid; do '
    'kill -9 "$(cat "$f")" && echo "killed $(cat "$f") ($f)" && exit 0; done; exit 1'
)


class Faults:
    """Injects a failure into the RayJob ``ray_job`` of ``namespace``; returns what was done, in words."""

    def __init__(self, cluster: cluster_module.Cluster) -> None:
        self.cluster = cluster

    def kill_worker(self, namespace: str, ray_job: str, events: watch_module.KubectlWatch) -> str:
        raise NotImplementedError

    def kill_driver(self, namespace: str, ray_job: str, events: watch_module.KubectlWatch) -> str:
        raise NotImplementedError


class StandInFaults(Faults):
    def kill_worker(self, namespace: str, ray_job: str, events: watch_module.KubectlWatch) -> str:
        return self._request(
            namespace, ray_job, kuberay_standin.ANNOTATION_KILL_WORKER, "WorkerKilled", events
        )

    def kill_driver(self, namespace: str, ray_job: str, events: watch_module.KubectlWatch) -> str:
        return self._request(
            namespace, ray_job, kuberay_standin.ANNOTATION_KILL_DRIVER, "DriverKilled", events
        )

    def _request(
        self, namespace: str, ray_job: str, annotation: str, reason: str, events: watch_module.KubectlWatch
    ) -> str:
        nonce = uuid.uuid4().hex[:8]
        self.cluster.kubectl(
            "annotate", "rayjob", ray_job, "-n", namespace, f"{annotation}={nonce}", "--overwrite"
        )
        request = f"{annotation}={nonce}"
        answer = events.wait_for(
            lambda event: (
                (event.get("involvedObject") or {}).get("name") == ray_job
                and request in str(event.get("message", ""))
            ),
            timeout_s=60,
            what=f"the stand-in's answer to {request}",
        )
        assert answer["reason"] == reason, answer
        return str(answer["message"])


class ClusterFaults(Faults):
    def kill_worker(self, namespace: str, ray_job: str, events: watch_module.KubectlWatch) -> str:
        pod = self._pods(namespace, ray_job, "worker")[-1]
        result = self.cluster.kubectl("exec", "-n", namespace, pod, "--", "sh", "-c", _KILL_WORKER)
        return f"pod {pod}: {result.stdout.strip()}"

    def kill_driver(self, namespace: str, ray_job: str, events: watch_module.KubectlWatch) -> str:
        pod = self._pods(namespace, ray_job, "head")[0]
        result = self.cluster.kubectl("exec", "-n", namespace, pod, "--", "python", "-c", _KILL_DRIVER)
        assert "killed" in result.stdout, f"no trainer entrypoint found in pod {pod}: {result.stdout}"
        return f"pod {pod}: {result.stdout.strip()}"

    def _pods(self, namespace: str, ray_job: str, node_type: str) -> list[str]:
        status = self.cluster.kubectl_json("get", "rayjob", ray_job, "-n", namespace).get("status") or {}
        cluster_name = status["rayClusterName"]
        pods = self.cluster.kubectl_json(
            "get",
            "pods",
            "-n",
            namespace,
            "-l",
            f"ray.io/cluster={cluster_name},ray.io/node-type={node_type}",
        )["items"]
        names = sorted(
            p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") == "Running"
        )
        assert names, f"no running {node_type} pod of RayCluster {cluster_name}"
        return names
