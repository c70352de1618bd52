"""The KubeRay RayJob (ray.io/v1) of one attempt, and the pod templates of its Ray cluster. Pure.

Choices, each for a reason:

- ``submissionMode: HTTPMode``: KubeRay submits the entrypoint through the Ray dashboard API, so no
  submitter pod exists. The default K8sJobMode would add a pod built by KubeRay without our security
  context, which Pod Security ``restricted`` rejects.
- ``backoffLimit: 0`` and ``shutdownAfterJobFinishes: true``: KubeRay never retries (restarts are ours:
  a new attempt resumes from the checkpoint) and frees the Ray cluster as soon as the Ray job ends; the
  RayJob object stays as the attempt's record.
- One head group on CPU (``num-cpus: 0``, so Ray schedules no training work there; the entrypoint and
  Ray Train's controller run on it) and one worker group of ``replicas`` pods with the requested CPUs,
  memory and ``nvidia.com/gpu``. KubeRay derives Ray's resources from the container limits.
- Every pod passes Pod Security ``restricted``: non-root uid 1000, no privilege escalation, all
  capabilities dropped, RuntimeDefault seccomp. KubeRay copies the Ray container's securityContext into
  the init container it injects into workers, so those pass too.
- Volumes: the checkpoint claim at ``trainer_config.CHECKPOINT_MOUNT_PATH`` and the trainer ConfigMap at
  /etc/trainop in head and workers (Ray Train's controller on the head reads checkpoint state from the
  same storage path the workers write), and a memory-backed /dev/shm sized by ``workers.sharedMemory``.
- NCCL env from ``trainop.api.nccl.env_for(spec.network)`` on every Ray container.
- The trainer's metrics port is declared as container port ``metrics`` on workers, for a PodMonitor.

This module must not talk to the API or read the clock.
"""

from __future__ import annotations

from typing import Any

from trainop.api import manifest, nccl, trainer_config, trainingjob
from trainop.controller import kinds, meta

RAY_API_VERSION = "ray.io/v1"
HEAD_CONTAINER = "ray-head"
WORKER_CONTAINER = "ray-worker"
WORKER_GROUP = "workers"
CONFIG_DIR = "/etc/trainop"
# The Ray head runs the entrypoint, the dashboard, GCS and Ray Train's controller, no training.
HEAD_CPU = "1"
HEAD_MEMORY = "4Gi"
RUN_AS_USER = 1000
RAY_METRICS_PORT = 8080  # KubeRay's default metrics-export-port for Ray's own metrics
VOLUME_CHECKPOINTS = "checkpoints"
VOLUME_CONFIG = "trainer-config"
VOLUME_SHM = "dshm"


def desired_rayjob(resource: manifest.Resource, attempt: int) -> dict[str, Any]:
    kind = kinds.kind_of(resource)
    spec = kinds.training_spec(resource)
    name = kind.ray_job_name(resource.metadata.name, attempt)
    replicas = kinds.worker_replicas(resource)
    return {
        "apiVersion": RAY_API_VERSION,
        "kind": "RayJob",
        "metadata": meta.object_metadata(resource, name, attempt=attempt),
        "spec": {
            "entrypoint": kind.entrypoint,
            "submissionMode": "HTTPMode",
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 0,
            "backoffLimit": 0,
            "rayClusterSpec": {
                "rayVersion": spec.ray_version,
                "enableInTreeAutoscaling": False,
                "headGroupSpec": {
                    "rayStartParams": {"num-cpus": "0"},
                    "template": pod_template(resource, attempt, head=True),
                },
                "workerGroupSpecs": [
                    {
                        "groupName": WORKER_GROUP,
                        "replicas": replicas,
                        "minReplicas": replicas,
                        "maxReplicas": replicas,
                        "rayStartParams": {},
                        "template": pod_template(resource, attempt, head=False),
                    }
                ],
            },
        },
    }


def pod_template(resource: manifest.Resource, attempt: int, *, head: bool) -> dict[str, Any]:
    spec = kinds.training_spec(resource)
    kind = kinds.kind_of(resource)
    workers = spec.workers
    pod: dict[str, Any] = {
        "serviceAccountName": kind.service_account_name(resource.metadata.name),
        "automountServiceAccountToken": True,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(resource, spec, head=head)],
        "volumes": [
            {"name": VOLUME_CHECKPOINTS, "persistentVolumeClaim": {"claimName": kinds.claim_name(resource)}},
            {
                "name": VOLUME_CONFIG,
                "configMap": {
                    "name": kind.config_map_name(resource.metadata.name),
                    "items": [{"key": trainer_config.CONFIG_KEY, "path": trainer_config.CONFIG_KEY}],
                },
            },
            {"name": VOLUME_SHM, "emptyDir": {"medium": "Memory", "sizeLimit": workers.shared_memory}},
        ],
    }
    if not head:
        if workers.node_selector:
            pod["nodeSelector"] = dict(workers.node_selector)
        if workers.tolerations:
            pod["tolerations"] = [t.to_wire() for t in workers.tolerations]
        if workers.priority_class_name:
            pod["priorityClassName"] = workers.priority_class_name
    return {"metadata": {"labels": meta.attempt_labels(resource, attempt)}, "spec": pod}


def _container(
    resource: manifest.Resource, spec: trainingjob.TrainingJobSpec, *, head: bool
) -> dict[str, Any]:
    workers = spec.workers
    env = {trainer_config.CONFIG_ENV: trainer_config.DEFAULT_CONFIG_PATH, **nccl.env_for(spec.network)}
    if head:
        resources: dict[str, Any] = {
            "requests": {"cpu": HEAD_CPU, "memory": HEAD_MEMORY},
            "limits": {"memory": HEAD_MEMORY},
        }
        ports: list[dict[str, Any]] = []
    else:
        cpu = _cpu(workers.cpus_per_worker)
        limits: dict[str, Any] = {"cpu": cpu, "memory": workers.memory_per_worker}
        if workers.gpus_per_worker:
            limits["nvidia.com/gpu"] = str(workers.gpus_per_worker)
        resources = {"requests": {"cpu": cpu, "memory": workers.memory_per_worker}, "limits": limits}
        ports = [{"name": "metrics", "containerPort": spec.reporting.metrics_port, "protocol": "TCP"}]
        if spec.reporting.metrics_port != RAY_METRICS_PORT:
            # Naming our port "metrics" stops KubeRay from adding Ray's own; declare that one explicitly.
            ports.append({"name": "ray-metrics", "containerPort": RAY_METRICS_PORT, "protocol": "TCP"})
    container: dict[str, Any] = {
        "name": HEAD_CONTAINER if head else WORKER_CONTAINER,
        "image": spec.image,
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "resources": resources,
        "volumeMounts": [
            {"name": VOLUME_CHECKPOINTS, "mountPath": trainer_config.CHECKPOINT_MOUNT_PATH},
            {"name": VOLUME_CONFIG, "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": VOLUME_SHM, "mountPath": "/dev/shm"},
        ],
        "securityContext": {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if ports:
        container["ports"] = ports
    return container


def _cpu(cpus: float) -> str:
    """A CPU quantity: whole numbers as "4", fractions in millicores ("1500m")."""
    if float(cpus).is_integer():
        return str(int(cpus))
    return f"{round(cpus * 1000)}m"
