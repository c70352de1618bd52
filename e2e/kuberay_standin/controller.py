"""The stand-in's control loop: watch RayJobs, run each one's entrypoint, write status as KubeRay v1.5 does.

One thread watches RayJobs cluster-wide (list, then watch from that resourceVersion; list again on any
error or expiry: every handler is idempotent, keyed by the RayJob's uid). Each new RayJob gets a thread
that materializes its pods (``pod``), starts the entrypoint, waits for it and writes the final status.
Fault requests (annotations) and deletions are served from the watch events.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from e2e.kuberay_standin import ANNOTATION_KILL_DRIVER, ANNOTATION_KILL_WORKER, FIELD_MANAGER, ray_runtime
from e2e.kuberay_standin import pod as pod_module

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayjobs"
# Passed from the stand-in's own environment to what it starts; nothing else (no KUBECONFIG, no tokens).
PASS_ENV = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TZ", "TMPDIR", "TERM")

log = logging.getLogger("kuberay-standin")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class StandIn:
    def __init__(self, *, kubeconfig: Path, state_dir: Path, num_cpus: int, grace_s: float = 10.0) -> None:
        import kubernetes

        self.k8s: Any = kubernetes
        self.state_dir = state_dir
        self.grace_s = grace_s
        self.marker = uuid.uuid4().hex
        api_client = self.k8s.config.new_client_from_config(config_file=str(kubeconfig))
        self.custom: Any = self.k8s.client.CustomObjectsApi(api_client)
        self.core: Any = self.k8s.client.CoreV1Api(api_client)
        self.materializer = pod_module.Materializer(
            core=self.core,
            api_exception=self.k8s.client.ApiException,
            state_dir=state_dir,
            server=str(api_client.configuration.host),
            ca_file=str(api_client.configuration.ssl_ca_cert or ""),
        )
        self.ray = ray_runtime.RayRuntime(num_cpus=num_cpus, marker=self.marker)
        self.pods: dict[str, pod_module.HeadPod] = {}  # by RayJob uid
        self.pods_lock = threading.Lock()
        self.stopping = threading.Event()

    def base_env(self) -> dict[str, str]:
        """The environment every started process begins with."""
        env = {key: os.environ[key] for key in PASS_ENV if key in os.environ}
        # `python` in an entrypoint is this interpreter, as it would be the image's.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "/usr/bin:/bin")])
        # A kubeconfig that does not exist: a process falling back to one finds no credentials at all.
        env["KUBECONFIG"] = str(self.state_dir / "no-kubeconfig-in-pods")
        env[ray_runtime.MARKER_ENV] = self.marker
        return env

    # ---------------------------------------------------------------------------------------- lifecycle
    def run(self) -> None:
        try:
            self.ray.start(base_env=self.base_env())
            threading.Thread(target=self._watch_forever, name="watch", daemon=True).start()
            while not self.stopping.wait(1.0):
                if not self.ray.running:
                    # Like a lost head pod: the running entrypoints fail; later RayJobs get a new cluster.
                    log.error("the Ray cluster died:\n%s\nstarting a new one", self.ray.log_tail())
                    self.ray.stop()
                    self.ray = ray_runtime.RayRuntime(num_cpus=self.ray.num_cpus, marker=self.marker)
                    self.ray.start(base_env=self.base_env())
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        log.info("stopping: entrypoints, then Ray")
        with self.pods_lock:
            pods = list(self.pods.values())
        for pod in pods:
            self._stop_process(pod, grace_s=2.0)
        self.ray.stop()
        log.info("stopped")

    # -------------------------------------------------------------------------------------------- watch
    def _watch_forever(self) -> None:
        ready = self.state_dir / "ready"
        while not self.stopping.is_set():
            try:
                listing = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
                for item in listing.get("items", []):
                    self._on_event("ADDED", item)
                if not ready.exists():
                    ready.write_text(f"ray={self.ray.address}\n")
                    log.info("ready: watching RayJobs in every namespace")
                stream = self.k8s.watch.Watch().stream(
                    self.custom.list_cluster_custom_object,
                    GROUP,
                    VERSION,
                    PLURAL,
                    resource_version=listing["metadata"]["resourceVersion"],
                    timeout_seconds=60,
                    allow_watch_bookmarks=True,
                )
                for event in stream:
                    if event["type"] == "BOOKMARK":
                        continue
                    if event["type"] == "ERROR":
                        break  # e.g. 410 Gone: list again
                    self._on_event(event["type"], event["object"])
            except Exception:
                if self.stopping.is_set():
                    return
                log.exception("watch failed; listing again in 1s")
                time.sleep(1)

    def _on_event(self, event_type: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        with self.pods_lock:
            pod = self.pods.get(meta["uid"])
        if event_type == "DELETED" or meta.get("deletionTimestamp"):
            if pod is not None and not pod.deleted:
                pod.deleted = True
                log.info("%s/%s deleted: stopping its entrypoint", pod.namespace, pod.name)
                threading.Thread(target=self._stop_process, args=(pod,), daemon=True).start()
            return
        if pod is None:
            if (obj.get("status") or {}).get("jobDeploymentStatus"):
                return  # started by someone else (or an earlier stand-in): not ours to run
            pod = self._new_pod(obj)
            with self.pods_lock:
                self.pods[pod.uid] = pod
            threading.Thread(
                target=self._run_job, args=(pod, obj), name=f"job-{pod.name}", daemon=True
            ).start()
            return
        self._serve_requests(pod, meta.get("annotations") or {})

    # ---------------------------------------------------------------------------------------- one RayJob
    def _new_pod(self, obj: dict[str, Any]) -> pod_module.HeadPod:
        meta = obj["metadata"]
        suffix = uuid.uuid4().hex[:5]
        directory = self.state_dir / "pods" / meta["namespace"] / f"{meta['name']}-{meta['uid'][:8]}"
        directory.mkdir(parents=True, exist_ok=True)
        return pod_module.HeadPod(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta["uid"],
            directory=directory,
            job_id=f"{meta['name']}-{suffix}",
            cluster_name=f"{meta['name']}-raycluster-{suffix}",
        )

    def _run_job(self, pod: pod_module.HeadPod, obj: dict[str, Any]) -> None:
        try:
            self._patch_status(
                pod,
                {
                    "jobDeploymentStatus": "Initializing",
                    "jobId": pod.job_id,
                    "rayClusterName": pod.cluster_name,
                    "startTime": now(),
                    "failed": 0,
                    "succeeded": 0,
                    "observedGeneration": obj["metadata"].get("generation", 1),
                },
            )
            argv, env = self._materialize_until_ready(pod, obj)
            if pod.deleted:
                return
            self._patch_status(
                pod,
                {
                    "jobDeploymentStatus": "Running",
                    "jobStatus": "PENDING",
                    "dashboardURL": f"{pod.cluster_name}-head-svc.{pod.namespace}.svc.cluster.local:8265",
                },
            )
            with pod.lock:
                if pod.deleted:
                    return
                with pod.driver_log.open("ab") as out:
                    out.write(f"$ {shlex.join(argv)}\n".encode())
                    out.flush()
                    pod.process = subprocess.Popen(
                        argv,
                        env=env,
                        cwd=pod.directory,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        preexec_fn=ray_runtime.die_with_parent,
                    )
                pod.started_at = now()
            log.info(
                "%s/%s: entrypoint pid %d, log %s", pod.namespace, pod.name, pod.process.pid, pod.driver_log
            )
            self._patch_status(pod, {"jobStatus": "RUNNING", "rayJobInfo": {"startTime": pod.started_at}})
            self._finish(pod, pod.process.wait())
        except Exception as exc:
            log.exception("%s/%s: stand-in error", pod.namespace, pod.name)
            with contextlib.suppress(Exception):
                self._event(pod, "StandInError", f"kuberay-standin: {exc}", warning=True)

    def _materialize_until_ready(
        self, pod: pod_module.HeadPod, obj: dict[str, Any], timeout_s: float = 120
    ) -> tuple[list[str], dict[str, str]]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.materializer.head_process(
                    pod, obj, base_env=self.base_env(), ray_env=self.ray.env()
                )
            except pod_module.NotReady as waiting:
                if pod.deleted or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the Ray pods of {pod.name} never became ready: {waiting}"
                    ) from waiting
                time.sleep(0.5)

    def _finish(self, pod: pod_module.HeadPod, returncode: int) -> None:
        if pod.deleted:
            log.info("%s/%s: entrypoint ended (%d) after deletion", pod.namespace, pod.name, returncode)
            return
        ended = now()
        info = {"startTime": pod.started_at, "endTime": ended}
        status: dict[str, Any]
        if returncode == 0:
            status = {
                "jobStatus": "SUCCEEDED",
                "jobDeploymentStatus": "Complete",
                "message": "Job finished successfully.",
                "endTime": ended,
                "succeeded": 1,
                "rayJobInfo": info,
            }
        else:
            message = (
                f"Job entrypoint command failed with exit code {returncode}, last available logs "
                f"(truncated to 20,000 chars):\n{pod.log_tail()}"
            )
            status = {
                "jobStatus": "FAILED",
                "jobDeploymentStatus": "Failed",
                "reason": "AppFailed",
                "message": message,
                "endTime": ended,
                "failed": 1,
                "rayJobInfo": info,
            }
        log.info(
            "%s/%s: entrypoint exited %d -> %s", pod.namespace, pod.name, returncode, status["jobStatus"]
        )
        self._patch_status(pod, status)

    # ------------------------------------------------------------------------------------ fault requests
    def _serve_requests(self, pod: pod_module.HeadPod, annotations: dict[str, str]) -> None:
        for key, action in (
            (ANNOTATION_KILL_WORKER, self._kill_worker),
            (ANNOTATION_KILL_DRIVER, self._kill_driver),
        ):
            value = annotations.get(key)
            if value is None:
                continue
            request = f"{key}={value}"
            with pod.lock:
                if request in pod.handled:
                    continue
                pod.handled.add(request)
            threading.Thread(target=action, args=(pod, request), daemon=True).start()

    def _kill_worker(self, pod: pod_module.HeadPod, request: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not pod.deleted:
            live = []
            for path in pod.pid_dir.glob("*-rank*.pid"):
                with contextlib.suppress(ValueError, OSError):
                    rank, pid = int(path.stem.rsplit("-rank", 1)[1]), int(path.read_text().strip())
                    os.kill(pid, 0)
                    live.append((rank, pid))
            if live:
                rank, pid = max(live)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    message = (
                        f"kuberay-standin: SIGKILL to Ray Train worker rank {rank} (pid {pid}) "
                        f"on request {request}"
                    )
                    self._event(pod, "WorkerKilled", message, warning=True)
                    log.info("%s/%s: %s", pod.namespace, pod.name, message)
                    return
            time.sleep(0.2)
        self._event(
            pod, "WorkerKillFailed", f"kuberay-standin: no live Ray Train worker for {request}", warning=True
        )

    def _kill_driver(self, pod: pod_module.HeadPod, request: str) -> None:
        with pod.lock:
            process = pod.process
        if process is None or process.poll() is not None:
            self._event(
                pod, "DriverKillFailed", f"kuberay-standin: no running entrypoint for {request}", warning=True
            )
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        message = f"kuberay-standin: SIGKILL to the entrypoint (pid {process.pid}) on request {request}"
        self._event(pod, "DriverKilled", message, warning=True)
        log.info("%s/%s: %s", pod.namespace, pod.name, message)

    def _stop_process(self, pod: pod_module.HeadPod, grace_s: float | None = None) -> None:
        with pod.lock:
            process = pod.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=self.grace_s if grace_s is None else grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    # ------------------------------------------------------------------------------------------ writing
    def _patch_status(self, pod: pod_module.HeadPod, status: dict[str, Any]) -> None:
        try:
            self.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                pod.namespace,
                PLURAL,
                pod.name,
                {"status": status},
                field_manager=FIELD_MANAGER,
                _content_type="application/merge-patch+json",
            )
        except self.k8s.client.ApiException as error:
            if error.status == 404:
                pod.deleted = True
                return
            raise
        shown = {k: v for k, v in status.items() if k in ("jobDeploymentStatus", "jobStatus", "reason")}
        log.info("%s/%s: status %s", pod.namespace, pod.name, shown)

    def _event(self, pod: pod_module.HeadPod, reason: str, message: str, *, warning: bool = False) -> None:
        client = self.k8s.client
        stamp = datetime.datetime.now(datetime.UTC)
        self.core.create_namespaced_event(
            pod.namespace,
            client.CoreV1Event(
                metadata=client.V1ObjectMeta(name=f"{pod.name}.{uuid.uuid4().hex[:12]}"),
                involved_object=client.V1ObjectReference(
                    api_version=f"{GROUP}/{VERSION}",
                    kind="RayJob",
                    name=pod.name,
                    namespace=pod.namespace,
                    uid=pod.uid,
                ),
                reason=reason,
                message=message,
                type="Warning" if warning else "Normal",
                first_timestamp=stamp,
                last_timestamp=stamp,
                count=1,
                source=client.V1EventSource(component=FIELD_MANAGER),
                reporting_component=FIELD_MANAGER,
            ),
        )
