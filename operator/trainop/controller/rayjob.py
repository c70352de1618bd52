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
- Sizes: a worker pod's CPUs, memory and /dev/shm are the spec's, or, where it leaves them unset, sized
  for the job by ``trainop.api.resources`` (small for CPU workers, per GPU and per DataLoader worker for
  GPU workers). The head of a TrainingJob requests ``HEAD_MEMORY_REQUEST`` (what its processes measured
  on the CPU demo, about 2.9 GiB: the entrypoint, Ray Train's controller and its helper actors, GCS,
  dashboard, agents) and may use up to ``HEAD_MEMORY`` (the limit Ray sees); every pod's /dev/shm is half
  of its memory unless the spec sizes the workers' (Ray's object store, 30 % of the pod's memory, must fit
  in it or Ray falls back to disk with a warning).
- Every pod passes Pod Security ``restricted``: non-root uid 1000, no privilege escalation, all
  capabilities dropped, RuntimeDefault seccomp. KubeRay copies the Ray container's securityContext into
  the init container it injects into workers, so those pass too.
- Volumes: the checkpoint claim at ``trainer_config.CHECKPOINT_MOUNT_PATH`` and the trainer ConfigMap at
  /etc/trainop in head and workers (Ray Train's controller on the head reads checkpoint state from the
  same storage path the workers write), and a memory-backed /dev/shm sized by ``workers.sharedMemory``.
- Checkpoints in a bucket (``checkpoint.storage.s3``): no claim is mounted anywhere, so nothing ties the
  pods to a node (an RWO claim pins every pod of a job to the node its volume is on). The credentials
  Secret's keys reach every Ray container as ``secretKeyRef`` environment variables
  (``trainer_config.s3_env``), marked optional: a missing Secret or key then does not leave the pods in
  CreateContainerConfigError, the trainer's start-up check names it instead (status.storage, and the
  StorageReady condition from it). Only the Secret's name is in the pod spec, never a key.
- Data (``spec.data``): an existing claim mounted read-only at ``trainer_config.DATA_MOUNT_PATH`` in every
  worker (``subPath`` when set), or, for an S3 prefix, an emptyDir there that the trainer fills before
  training, with that bucket's credentials under their own names. Workers only: the head trains nothing.
- NCCL env from ``trainop.api.nccl.env_for(spec.network)`` on every Ray container, and
  ``trainer_config.RAY_TRAIN_ENV`` (Ray Train's preemption watcher off: the trainer never asks it, and its
  start logs an error-level line in every job's log).
- The trainer's metrics ports, one per local rank (GPU), are declared on workers as container ports
  ``metrics``, ``metrics-1``, ... (``metrics_port_name``), for a PodMonitor.
- Graceful preemption: a pod's SIGTERM goes to ``ray start``, not to the training processes, so every
  worker container gets a preStop hook running the trainer's helper (``python -m trainop_trainer.preempt
  --timeout T``): it SIGTERMs the pod's training processes, which checkpoint at their next step and exit,
  and waits for them. The worker pods' ``terminationGracePeriodSeconds`` is set explicitly
  (``workers.terminationGracePeriodSeconds``) and ``T`` is that less ``PRESTOP_MARGIN_SECONDS``, kept for
  the helper's start-up and for ``ray start`` to stop after it. The head gets neither: it runs no training
  process (``num-cpus: 0`` while every Train worker asks for CPUs), so the helper would find nothing to
  signal there; losing the head ends the attempt, and the next one resumes from the latest checkpoint.
- The job's log on the pods' log subresource: the driver's output (every rank's lines, forwarded by Ray)
  goes to a file under Ray's temp dir on the head, not to a container's stdout. The head pod therefore
  has a second, small container ``trainer-log`` (``python -m trainop_trainer.logtail``) that prints that
  file, sharing Ray's temp dir (``/tmp/ray``, an emptyDir) with the Ray container: ``kubectl logs <head> -c
  trainer-log`` and ``kubectl trainop logs`` read it. Ray's log deduplication is off on the head
  (``RAY_DEDUP_LOGS=0``): it would fold identical lines of different ranks into one.
- A TuningSweep's head also hosts the trial drivers and their Train controllers (docs/sweep.md, about
  2 GiB per concurrent trial, measured): its memory is ``2 GiB + maxConcurrentTrials x 2 GiB`` and it
  advertises ``maxConcurrentTrials`` units of the custom Ray resource ``trainop_trial_driver``, which each
  trial driver asks for when the cluster has it, so trial drivers stay on the head rather than on worker
  pods sized for one Train worker.

This module must not talk to the API or read the clock.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

from trainop.api import manifest, nccl, resources, trainer_config, trainingjob
from trainop.controller import kinds, meta

RAY_API_VERSION = "ray.io/v1"
HEAD_CONTAINER = "ray-head"
# The head's log follower (trainop_trainer.logtail) and what it needs: Ray's temp dir shared with it.
LOG_CONTAINER = "trainer-log"
LOG_COMMAND = ("python", "-m", "trainop_trainer.logtail", "/tmp/ray")
RAY_TEMP_DIR = "/tmp/ray"
LOG_CONTAINER_RESOURCES = {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}}
WORKER_CONTAINER = "ray-worker"
WORKER_GROUP = "workers"
CONFIG_DIR = "/etc/trainop"
# spec.tracking.mlflow.trackingUriSecret reaches the trainer as this variable (trainop_trainer.tracking).
MLFLOW_TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
# The Ray head runs the entrypoint, the dashboard, GCS and Ray Train's controller, no training. Its memory
# request is what those processes used at their peak on the CPU demo (about 2.9 GiB, docs/operator.md);
# the limit, which Ray sees as the node's memory, leaves room for larger jobs' controller state.
HEAD_CPU = "1"
HEAD_MEMORY_REQUEST = "3Gi"
HEAD_MEMORY = "4Gi"
RUN_AS_USER = 1000
RAY_METRICS_PORT = 8080  # KubeRay's default metrics-export-port for Ray's own metrics
# A sweep's head: the driver's own share, plus one share per concurrent trial (trial driver, its Train
# controller and Train's per-run helpers: about 2 GB measured on CPU, docs/sweep.md).
SWEEP_HEAD_BASE_MEMORY_GIB = 2
SWEEP_HEAD_MEMORY_PER_TRIAL_GIB = 2
# The custom Ray resource a trial driver asks for when the cluster advertises it; the trainer's name for
# it is trainop_trainer.sweep.trial.TRIAL_DRIVER_RESOURCE (a unit test holds the two together).
TRIAL_DRIVER_RESOURCE = "trainop_trial_driver"
# The worker containers' preStop hook: the trainer's helper, which SIGTERMs the pod's training processes
# and waits up to --timeout seconds for them to checkpoint and exit.
PRESTOP_COMMAND = ("python", "-m", "trainop_trainer.preempt", "--timeout")
# Seconds of the grace period the helper leaves over: its own start-up (Python, imports) before it signals,
# and time for the kubelet's SIGTERM to stop `ray start` before the SIGKILL at the end of the period.
PRESTOP_MARGIN_SECONDS = 5
# Seconds a Ray worker keeps trying to reach a lost head's GCS before it exits (its pod then restarts it
# and it joins the new head); KubeRay sets 600 on workers unless the container already sets it.
GCS_RECONNECT_TIMEOUT_ENV = "RAY_GCS_RPC_SERVER_RECONNECT_TIMEOUT_S"
WORKER_GCS_RECONNECT_TIMEOUT_S = 60
VOLUME_CHECKPOINTS = "checkpoints"
VOLUME_DATA = "data"
VOLUME_CONFIG = "trainer-config"
VOLUME_SHM = "dshm"
VOLUME_RAY_TEMP = "ray-tmp"


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
                    "rayStartParams": head_start_params(resource),
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


def metrics_port_name(local_rank: int) -> str:
    """The container port of the trainer's metrics for one local rank (one Train worker per GPU shares a
    pod, each serving on ``metricsPort + local_rank``): ``metrics``, then ``metrics-1`` ... ``metrics-15``.
    The PodMonitor and scrape configs in charts/ and monitoring/ scrape every one of these names."""
    return "metrics" if local_rank == 0 else f"metrics-{local_rank}"


def head_start_params(resource: manifest.Resource) -> dict[str, str]:
    """The head's ``ray start`` flags. KubeRay writes each as ``--<key>=<value>`` into a bash command line,
    so the resources JSON is single-quoted for the shell, the form KubeRay itself writes there."""
    params = {"num-cpus": "0"}
    drivers = kinds.trial_drivers(resource)
    if drivers:
        params["resources"] = "'" + json.dumps({TRIAL_DRIVER_RESOURCE: drivers}, separators=(",", ":")) + "'"
    return params


def head_memory(resource: manifest.Resource) -> str:
    """The head container's memory limit (KubeRay gives Ray the limit): a TrainingJob's fixed size, or for a
    sweep the base plus one share per concurrent trial."""
    drivers = kinds.trial_drivers(resource)
    if not drivers:
        return HEAD_MEMORY
    return f"{SWEEP_HEAD_BASE_MEMORY_GIB + drivers * SWEEP_HEAD_MEMORY_PER_TRIAL_GIB}Gi"


def head_memory_request(resource: manifest.Resource) -> str:
    """The head container's memory request: a TrainingJob's measured size; a sweep's head requests its
    whole limit (sized per trial driver, docs/sweep.md)."""
    if kinds.trial_drivers(resource):
        return head_memory(resource)
    return HEAD_MEMORY_REQUEST


def prestop_timeout_seconds(termination_grace_period_seconds: int) -> int:
    """How long the preStop helper waits for the checkpoint: the grace period less the margin (at least
    5 s, as the API's floor for the grace period is 10 s)."""
    return termination_grace_period_seconds - PRESTOP_MARGIN_SECONDS


def pod_template(resource: manifest.Resource, attempt: int, *, head: bool) -> dict[str, Any]:
    spec = kinds.training_spec(resource)
    kind = kinds.kind_of(resource)
    workers = spec.workers
    shm = resources.half_of(head_memory(resource)) if head else resources.worker_shared_memory(spec)
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
        "containers": [_container(resource, spec, head=head), *([_log_container(spec)] if head else [])],
        "volumes": [
            *_checkpoint_volumes(resource),
            {
                "name": VOLUME_CONFIG,
                "configMap": {
                    "name": kind.config_map_name(resource.metadata.name),
                    "items": [{"key": trainer_config.CONFIG_KEY, "path": trainer_config.CONFIG_KEY}],
                },
            },
            {"name": VOLUME_SHM, "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
            *([{"name": VOLUME_RAY_TEMP, "emptyDir": {}}] if head else _data_volumes(spec)),
        ],
    }
    if not head:
        if workers.node_selector:
            pod["nodeSelector"] = dict(workers.node_selector)
        if workers.tolerations:
            pod["tolerations"] = [t.to_wire() for t in workers.tolerations]
        if workers.priority_class_name:
            pod["priorityClassName"] = workers.priority_class_name
        pod["terminationGracePeriodSeconds"] = workers.termination_grace_period_seconds
    return {"metadata": {"labels": meta.attempt_labels(resource, attempt)}, "spec": pod}


def _container(
    resource: manifest.Resource, spec: trainingjob.TrainingJobSpec, *, head: bool
) -> dict[str, Any]:
    workers = spec.workers
    env = {
        trainer_config.CONFIG_ENV: trainer_config.DEFAULT_CONFIG_PATH,
        # On every Ray container: the Train controllers of the job's driver and of a sweep's trial drivers
        # (Ray workers started by the raylet) all see it.
        **trainer_config.RAY_TRAIN_ENV,
        **nccl.env_for(spec.network),
    }
    if kinds.trial_drivers(resource) == 0 and resources.warm_spares(spec):
        # A TrainingJob's own Ray cluster with room for them: warm spare workers for in-attempt restarts (the
        # driver on the head reads the switch; the workers' raylets preload what a spare imports).
        env[trainer_config.WARM_SPARES_ENV] = "1"
        if not head:
            env.update(trainer_config.spare_raylet_env())
    if head:
        env["RAY_DEDUP_LOGS"] = "0"  # every rank's lines, as they were written (see the module docstring)
        requests_limits: dict[str, Any] = {
            "requests": {"cpu": HEAD_CPU, "memory": head_memory_request(resource)},
            "limits": {"memory": head_memory(resource)},
        }
        ports: list[dict[str, Any]] = []
    else:
        # A lost head (its pod deleted, its node gone): KubeRay recreates the head and, in HTTPMode, submits
        # the job again to the new one, which resumes from the newest checkpoint. The workers must leave the
        # dead head's GCS to join the new one: they exit once they cannot reach it for this long, and their
        # pods restart them. KubeRay's own default for workers is 600 s, ten minutes of idle GPUs per lost
        # head (measured on the cluster bed: the job sat still until then); a training job cannot outlive a
        # minute without its GCS anyway.
        env[GCS_RECONNECT_TIMEOUT_ENV] = str(WORKER_GCS_RECONNECT_TIMEOUT_S)
        cpu = _cpu(resources.worker_cpus(spec))
        memory = resources.worker_memory(spec)
        limits: dict[str, Any] = {"cpu": cpu, "memory": memory}
        if workers.gpus_per_worker:
            limits["nvidia.com/gpu"] = str(workers.gpus_per_worker)
        requests_limits = {"requests": {"cpu": cpu, "memory": memory}, "limits": limits}
        ports = [
            {
                "name": metrics_port_name(rank),
                "containerPort": spec.reporting.metrics_port + rank,
                "protocol": "TCP",
            }
            for rank in range(max(1, workers.gpus_per_worker))
        ]
        if spec.reporting.metrics_port != RAY_METRICS_PORT:
            # Naming our port "metrics" stops KubeRay from adding Ray's own; declare that one explicitly.
            ports.append({"name": "ray-metrics", "containerPort": RAY_METRICS_PORT, "protocol": "TCP"})
    secrets = _s3_credentials(spec.checkpoint.storage.s3, trainer_config.S3_CHECKPOINT)
    if not head and spec.data is not None:
        env[trainer_config.DATA_DIR_ENV] = trainer_config.DATA_MOUNT_PATH
        secrets += _s3_credentials(spec.data.s3, trainer_config.S3_DATA)
    env_list: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(env.items())]
    mlflow = spec.tracking.mlflow
    if mlflow is not None and mlflow.tracking_uri_secret is not None:
        # The tracking URI may hold credentials: read from the Secret by the kubelet, never in the spec.
        secret = mlflow.tracking_uri_secret
        env_list.append(
            {
                "name": MLFLOW_TRACKING_URI_ENV,
                "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}},
            }
        )
    env_list += secrets
    container: dict[str, Any] = {
        "name": HEAD_CONTAINER if head else WORKER_CONTAINER,
        "image": spec.image,
        "env": env_list,
        "resources": requests_limits,
        "volumeMounts": [
            *(
                [{"name": VOLUME_CHECKPOINTS, "mountPath": trainer_config.CHECKPOINT_MOUNT_PATH}]
                if kinds.claim_name(resource) is not None
                else []
            ),
            {"name": VOLUME_CONFIG, "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": VOLUME_SHM, "mountPath": "/dev/shm"},
            *([{"name": VOLUME_RAY_TEMP, "mountPath": RAY_TEMP_DIR}] if head else _data_mounts(spec)),
        ],
        "securityContext": _container_security(),
    }
    if ports:
        container["ports"] = ports
    if not head:
        timeout = prestop_timeout_seconds(workers.termination_grace_period_seconds)
        container["lifecycle"] = {"preStop": {"exec": {"command": [*PRESTOP_COMMAND, str(timeout)]}}}
    return container


def _checkpoint_volumes(resource: manifest.Resource) -> list[dict[str, Any]]:
    """The checkpoint claim as a volume; none when checkpoints go to a bucket."""
    claim = kinds.claim_name(resource)
    if claim is None:
        return []
    return [{"name": VOLUME_CHECKPOINTS, "persistentVolumeClaim": {"claimName": claim}}]


def _data_volumes(spec: trainingjob.TrainingJobSpec) -> list[dict[str, Any]]:
    """spec.data on a worker: the claim, read-only; or the emptyDir the trainer copies an S3 prefix into."""
    data = spec.data
    if data is None:
        return []
    if data.existing_claim is not None:
        return [
            {
                "name": VOLUME_DATA,
                "persistentVolumeClaim": {"claimName": data.existing_claim, "readOnly": True},
            }
        ]
    return [{"name": VOLUME_DATA, "emptyDir": {}}]


def _data_mounts(spec: trainingjob.TrainingJobSpec) -> list[dict[str, Any]]:
    data = spec.data
    if data is None:
        return []
    mount: dict[str, Any] = {"name": VOLUME_DATA, "mountPath": trainer_config.DATA_MOUNT_PATH}
    if data.existing_claim is not None:
        mount["readOnly"] = True
        if data.sub_path is not None:
            mount["subPath"] = data.sub_path
    return [mount]


def _s3_credentials(bucket: trainingjob.S3Bucket | None, use: trainer_config.S3Use) -> list[dict[str, Any]]:
    """The credentials Secret's keys as environment variables for one use of a bucket (optional refs: the
    trainer reports a missing Secret or key), and the Secret's name; nothing without a Secret."""
    if bucket is None or bucket.credentials_secret is None:
        return []
    secret = bucket.credentials_secret
    return [
        {"name": trainer_config.s3_secret_name_env(use), "value": secret},
        *(
            {
                "name": trainer_config.s3_env(use, key),
                "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}},
            }
            for key in trainer_config.S3_SECRET_KEYS
        ),
    ]


def _container_security() -> dict[str, Any]:
    """Pod Security ``restricted`` for a container (a new dict each time: manifests share nothing)."""
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _log_container(spec: trainingjob.TrainingJobSpec) -> dict[str, Any]:
    """The head's log follower: the job driver's log (every rank's lines) on this container's stdout."""
    return {
        "name": LOG_CONTAINER,
        "image": spec.image,
        "command": list(LOG_COMMAND),
        "resources": copy.deepcopy(LOG_CONTAINER_RESOURCES),
        "volumeMounts": [{"name": VOLUME_RAY_TEMP, "mountPath": RAY_TEMP_DIR, "readOnly": True}],
        "securityContext": _container_security(),
    }


@dataclasses.dataclass(frozen=True)
class PodRequests:
    """What one pod asks the scheduler for: the sum over its containers."""

    cpu: float
    memory_bytes: int
    gpus: int


def pod_requests(pod_spec: dict[str, Any]) -> PodRequests:
    """The requests of a pod template's spec, every container counted (the head's log follower too)."""
    cpu, memory, gpus = 0.0, 0, 0
    for container in pod_spec["containers"]:
        requests = container.get("resources", {}).get("requests", {})
        quantity = str(requests.get("cpu", "0"))
        cpu += float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)
        memory += resources.quantity_bytes(str(requests.get("memory", "0")))
        gpus += int(container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
    return PodRequests(cpu=cpu, memory_bytes=memory, gpus=gpus)


def _cpu(cpus: float) -> str:
    """A CPU quantity: whole numbers as "4", fractions in millicores ("1500m")."""
    if float(cpus).is_integer():
        return str(int(cpus))
    return f"{round(cpus * 1000)}m"
