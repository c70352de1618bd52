"""One RayJob's Ray pods, as the local machine stands in for them: directories, a token, an environment.

``Materializer.head_process(pod, rayjob)`` returns the entrypoint's argv and environment, after making
what the kubelet would have mounted: the volumes of the pod templates (claim -> a directory that outlives
the RayJob, ConfigMap -> its files, emptyDir -> an empty directory) and the ServiceAccount token. Paths
under a container's ``mountPath`` in the entrypoint's arguments and in env values are rewritten to those
directories. It raises ``NotReady`` while something a pod needs does not exist yet (a real pod would be
Pending), and never starts a process itself (``controller`` does).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shlex
import subprocess
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger("kuberay-standin")

# Set on every entrypoint because this machine runs all the Ray pods of every job on 2 shared cores, where
# starting a worker group (a process per worker, each importing torch) can take longer than Ray Train's
# default 60 s; a real cluster gives each pod its own CPUs. Ray Train propagates it to its controller.
SLOW_MACHINE_ENV = {"RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "600"}

Mounts = list[tuple[str, Path]]  # (mountPath, local directory), longest mount path first


class NotReady(Exception):
    """Something the pod needs (claim, ConfigMap, ServiceAccount) does not exist yet."""


@dataclasses.dataclass
class HeadPod:
    """The local stand-in for one RayJob's Ray cluster: a directory and the entrypoint process."""

    namespace: str
    name: str
    uid: str
    directory: Path
    job_id: str
    cluster_name: str
    process: subprocess.Popen[bytes] | None = None
    started_at: str = ""
    deleted: bool = False
    handled: set[str] = dataclasses.field(default_factory=set)  # fault requests already served
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    @property
    def pid_dir(self) -> Path:
        """``TRAINOP_PID_DIR`` of this RayJob's Ray Train workers (the trainer registers each rank there)."""
        return self.directory / "pids"

    @property
    def driver_log(self) -> Path:
        return self.directory / "driver.log"

    def log_tail(self, num_lines: int = 12) -> str:
        try:
            lines = self.driver_log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(lines[-num_lines:])


def translate(value: str, mounts: Mounts) -> str:
    """A path under a container mountPath, rewritten to the local directory standing in for the volume."""
    for mount_path, local in mounts:
        root = mount_path.rstrip("/")
        if value in (mount_path, root):
            return str(local)
        if value.startswith(root + "/"):
            return str(local / value[len(root) + 1 :])
    return value


def translate_arg(arg: str, mounts: Mounts) -> str:
    if arg.startswith("-") and "=" in arg:
        flag, _, value = arg.partition("=")
        return f"{flag}={translate(value, mounts)}"
    return translate(arg, mounts)


class Materializer:
    def __init__(
        self, *, core: Any, api_exception: type[Exception], state_dir: Path, server: str, ca_file: str
    ):
        self.core = core
        self.api_exception = api_exception
        self.state_dir = state_dir
        self.server = server
        self.ca_file = ca_file

    def claim_dir(self, namespace: str, claim: str) -> Path:
        return self.state_dir / "pvs" / namespace / claim

    def head_process(
        self, pod: HeadPod, rayjob: dict[str, Any], *, base_env: dict[str, str], ray_env: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        """argv and environment of the entrypoint; the job-level runtime env carries the workers' env."""
        spec = rayjob["spec"]
        cluster = spec["rayClusterSpec"]
        head = cluster["headGroupSpec"]["template"]
        head_mounts, head_env = self._container(pod, head, role="head")
        worker_env: dict[str, str] = {}
        for group in cluster.get("workerGroupSpecs") or ():
            worker_env.update(self._container(pod, group["template"], role="worker")[1])
        pod.pid_dir.mkdir(parents=True, exist_ok=True)
        extra = {**self._service_account(pod, head), "TRAINOP_PID_DIR": str(pod.pid_dir)}
        config_path = head_env.get("TRAINOP_CONFIG")
        if config_path and Path(config_path).is_file():
            storage = json.loads(Path(config_path).read_text()).get("storagePath")
            if storage:
                extra["TRAINOP_STORAGE_PATH"] = translate(storage, head_mounts)
        # RAY_ADDRESS for every process of the job, too: in KubeRay each pod runs one Ray instance, which
        # Ray's own helpers (e.g. Ray Train's placement group cleaner) find by looking; here other Ray
        # clusters may share the machine, and they must not pick one of those.
        job_env = {**worker_env, **extra, "RAY_ADDRESS": ray_env["RAY_ADDRESS"]}
        job_config = {
            "runtime_env": {"env_vars": job_env},
            "metadata": {"job_submission_id": pod.job_id},
        }
        env = {
            **base_env,
            **head_env,
            **extra,
            **ray_env,
            **SLOW_MACHINE_ENV,
            "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps(job_config),
            "PYTHONUNBUFFERED": "1",
        }
        argv = [translate_arg(arg, head_mounts) for arg in shlex.split(spec["entrypoint"])]
        return argv, env

    def _container(
        self, pod: HeadPod, template: dict[str, Any], *, role: str
    ) -> tuple[Mounts, dict[str, str]]:
        pod_spec = template["spec"]
        container = pod_spec["containers"][0]
        volumes = {volume["name"]: volume for volume in pod_spec.get("volumes") or ()}
        mounts: Mounts = []
        for mount in container.get("volumeMounts") or ():
            volume = volumes.get(mount["name"])
            if volume is None:
                raise RuntimeError(f"volumeMount {mount['name']} names no volume of the pod template")
            mounts.append((mount["mountPath"], self._volume(pod, volume, role=role)))
        mounts.sort(key=lambda pair: len(pair[0]), reverse=True)
        env: dict[str, str] = {}
        for variable in container.get("env") or ():
            if "value" in variable:
                env[variable["name"]] = translate(str(variable["value"]), mounts)
            else:
                log.warning(
                    "%s/%s: env %s uses valueFrom, which the stand-in does not emulate; skipped",
                    pod.namespace,
                    pod.name,
                    variable["name"],
                )
        return mounts, env

    def _read(self, read: Any, what: str) -> Any:
        try:
            return read()
        except self.api_exception as error:
            if getattr(error, "status", None) == 404:
                raise NotReady(f"{what} not found") from error
            raise

    def _volume(self, pod: HeadPod, volume: dict[str, Any], *, role: str) -> Path:
        name = volume["name"]
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            stored = self._read(
                lambda: self.core.read_namespaced_persistent_volume_claim(claim, pod.namespace),
                f"persistentvolumeclaim {claim}",
            )
            local = self.claim_dir(pod.namespace, claim)
            local.mkdir(parents=True, exist_ok=True)
            if not stored.spec.volume_name:
                self._bind(stored, local)
        elif "configMap" in volume:
            source = volume["configMap"]
            config_map = self._read(
                lambda: self.core.read_namespaced_config_map(source["name"], pod.namespace),
                f"configmap {source['name']}",
            )
            data = config_map.data or {}
            local = pod.directory / "volumes" / role / name
            for item in source.get("items") or [{"key": key, "path": key} for key in data]:
                target = local / item["path"]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(data[item["key"]])
        elif "emptyDir" in volume:
            local = pod.directory / "volumes" / role / name
        else:
            raise RuntimeError(
                f"volume {name}: the stand-in emulates persistentVolumeClaim, configMap, emptyDir"
            )
        local.mkdir(parents=True, exist_ok=True)
        return local

    def _bind(self, claim: Any, local: Path) -> None:
        """What a WaitForFirstConsumer provisioner and the PV binder do when the first pod uses the claim: a
        hostPath PersistentVolume for the local directory, bound to the claim (spec.volumeName, then
        Bound on both). Nothing else binds claims in the test control plane."""
        meta, spec = claim.metadata, claim.spec
        volume = f"pvc-{meta.uid}"
        requested = (spec.resources.requests or {}).get("storage", "1Gi")
        access_modes = list(spec.access_modes or ["ReadWriteOnce"])
        body = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume, "labels": {"e2e.trainop.dev/provisioned-by": "kuberay-standin"}},
            "spec": {
                "capacity": {"storage": requested},
                "accessModes": access_modes,
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": spec.storage_class_name or "",
                "hostPath": {"path": str(local), "type": "DirectoryOrCreate"},
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": meta.namespace,
                    "name": meta.name,
                    "uid": meta.uid,
                },
            },
        }
        try:
            self.core.create_persistent_volume(body)
        except self.api_exception as error:
            if getattr(error, "status", None) != 409:
                raise
        self.core.patch_persistent_volume_status(volume, {"status": {"phase": "Bound"}})
        self.core.patch_namespaced_persistent_volume_claim(
            meta.name, meta.namespace, {"spec": {"volumeName": volume}}
        )
        self.core.patch_namespaced_persistent_volume_claim_status(
            meta.name,
            meta.namespace,
            {
                "status": {
                    "phase": "Bound",
                    "accessModes": access_modes,
                    "capacity": {"storage": requested},
                }
            },
        )
        log.info(
            "%s/%s: bound to PersistentVolume %s (hostPath %s)", meta.namespace, meta.name, volume, local
        )

    def _service_account(self, pod: HeadPod, template: dict[str, Any]) -> dict[str, str]:
        """The kubelet's ServiceAccount token mount, handed over as the trainer reads it outside a pod."""
        import kubernetes

        pod_spec = template["spec"]
        if pod_spec.get("automountServiceAccountToken") is False:
            return {}
        account = pod_spec.get("serviceAccountName") or "default"
        request = kubernetes.client.AuthenticationV1TokenRequest(
            spec=kubernetes.client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
        )
        response = self._read(
            lambda: self.core.create_namespaced_service_account_token(account, pod.namespace, request),
            f"serviceaccount {account}",
        )
        directory = pod.directory / "serviceaccount"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "token").write_text(response.status.token)
        (directory / "namespace").write_text(pod.namespace)
        credentials = {"TRAINOP_KUBE_HOST": self.server, "TRAINOP_KUBE_TOKEN_FILE": str(directory / "token")}
        if self.ca_file:
            (directory / "ca.crt").write_bytes(Path(self.ca_file).read_bytes())
            credentials["TRAINOP_KUBE_CA_FILE"] = str(directory / "ca.crt")
        log.info("%s/%s: token of serviceaccount %s issued", pod.namespace, pod.name, account)
        return credentials
