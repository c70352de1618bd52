"""One pod's life on its node: the kubelet's syncPod loop, on one thread per pod.

Owns the container records of a pod and every decision about them: the sandbox first, then init
containers one by one to completion, then the app containers; restarts by ``restartPolicy`` with the
CrashLoopBackOff delay (first restart at once, then ``backoff_initial_s`` doubling to ``backoff_max_s``,
reset after a run longer than twice the cap); image lookups with ErrImagePull/ImagePullBackOff;
CreateContainerConfigError for env, user and mount errors; probes' verdicts (readiness drives Ready,
liveness and startup failures restart); postStart/preStop hooks; deletion (preStop, SIGTERM, SIGKILL of
the whole container after the grace period, a terminal phase, then the pod object deleted with grace 0);
the status it PATCHes and the Events it records.

Everything arrives as a message in :attr:`PodWorker.inbox` (pod updates, container exits, probe results,
node loss, agent shutdown) and is handled on the worker's thread only, so no record needs a lock. Helper
threads (exit waiters, probe runners, container stoppers) only post messages.

Agent restarts are *kill-and-report*: a worker created for a pod whose status says a container was running
finds no process of it (the agent's start killed every leftover), records it terminated (exit code 137,
reason Error, a message saying so) and applies the restart policy.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from tests.clusterbed import network

from . import (
    containers,
    context,
    env,
    events,
    images,
    instances,
    kube,
    probes,
    reporter,
    runtime,
    sandbox,
    volumes,
)
from . import status as status_module
from .status import ContainerRecord

log = logging.getLogger(__name__)
JSON = dict[str, Any]
_RETRY_S = 2.0


def _rfc3339(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


@dataclasses.dataclass
class _Backoff:
    delay_s: float = 0.0
    not_before: float = 0.0


class PodWorker(threading.Thread):
    def __init__(self, *, node: context.NodeContext, pod: JSON, on_done: Callable[[str], None]) -> None:
        metadata = pod["metadata"]
        super().__init__(name=f"pod-{metadata['namespace']}/{metadata['name']}", daemon=True)
        self.node = node
        self.pod = pod
        self.uid = str(metadata["uid"])
        self.on_done = on_done
        self.inbox: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.pod_dir = node.settings.pods_dir / f"{metadata['namespace']}_{metadata['name']}_{self.uid}"
        self.sandbox = sandbox.Sandbox(node=node, pod=pod, pod_dir=self.pod_dir)
        self.records: dict[str, ContainerRecord] = {}
        self.instances: dict[str, instances.Instance] = {}
        self._crash_backoff: dict[str, _Backoff] = {}
        self._pull_backoff: dict[str, _Backoff] = {}
        self._awaiting_restart: set[str] = set()
        self._wake_at: float | None = None
        self._terminating = False
        self._terminal = False
        self.finished = threading.Event()
        self._next_refresh = 0.0
        adopted = status_module.adopt(pod, now=kube.now_rfc3339())
        self.records = adopted.records
        self._awaiting_restart = set(adopted.awaiting_restart)
        self._terminal = adopted.terminal
        self.reporter = reporter.StatusReporter(
            client=node.client, pod=pod, start_time=adopted.start_time, conditions=adopted.conditions
        )

    # ------------------------------------------------------------------------------ public, any thread
    def post(self, message: tuple[Any, ...]) -> None:
        self.inbox.put(message)

    @property
    def namespace(self) -> str:
        return str(self.pod["metadata"]["namespace"])

    @property
    def name_(self) -> str:
        return str(self.pod["metadata"]["name"])

    def instance(self, container: str) -> instances.Instance | None:
        return self.instances.get(container)

    # ---------------------------------------------------------------------------------- the loop
    def run(self) -> None:
        try:
            self._loop()
        except Exception:
            log.exception("pod worker %s/%s failed; killing its containers", self.namespace, self.name_)
            self._kill_everything()
        finally:
            self.finished.set()
            self.on_done(self.uid)

    def _loop(self) -> None:
        self._sync()
        while not self.finished.is_set():
            timeout = None if self._wake_at is None else max(0.0, self._wake_at - time.time())
            try:
                messages = [self.inbox.get(timeout=timeout)]
            except queue.Empty:
                messages = []
            while True:
                try:
                    messages.append(self.inbox.get_nowait())
                except queue.Empty:
                    break
            for message in messages:
                if self._handle(message):
                    return
            self._sync()

    def _wake_in(self, seconds: float) -> None:
        at = time.time() + seconds
        self._wake_at = at if self._wake_at is None else min(self._wake_at, at)

    def _handle(self, message: tuple[Any, ...]) -> bool:
        """Apply one message; True when the worker is done."""
        kind = message[0]
        if kind == "update":
            self.pod = message[1]
        elif kind == "exited":
            _, name, number, exit_info = message
            instance = self.instances.get(name)
            if instance is not None and instance.number == number:
                self._on_exit(name, instance, exit_info)
        elif kind == "probe":
            _, name, number, result = message
            instance = self.instances.get(name)
            if instance is not None and instance.number == number and not instance.stopping:
                self._on_probe(name, instance, result)
        elif kind in ("deleted", "lose", "shutdown"):
            self._kill_everything()
            return True
        return False

    # -------------------------------------------------------------------------------- adoption
    # ------------------------------------------------------------------------------------- sync
    def _sync(self) -> None:
        self._wake_at = None
        if self.pod["metadata"].get("deletionTimestamp"):
            self._terminate()
            return
        if self._terminal:
            return
        if not self._ensure_sandbox():
            self._push_status()
            return
        spec = self.pod["spec"]
        policy = spec.get("restartPolicy") or "Always"
        initialized = True
        for container in spec.get("initContainers") or []:
            record = self.records[container["name"]]
            terminated = record.terminated
            if terminated is not None and terminated["exitCode"] == 0:
                continue
            initialized = False
            if container["name"] not in self.instances and not (terminated and policy == "Never"):
                self._try_start(container)
            break
        if initialized:
            for container in spec["containers"]:
                if container["name"] in self.instances:
                    continue
                record = self.records[container["name"]]
                terminated = record.terminated
                wanted = (
                    terminated is None
                    or policy == "Always"
                    or (policy == "OnFailure" and terminated["exitCode"] != 0)
                )
                if wanted:
                    self._try_start(container)
        phase = self._phase()
        if phase in status_module.TERMINAL_PHASES:
            self._terminal = True
            self.sandbox.teardown()
        elif self.instances and time.time() >= self._next_refresh:
            self.sandbox.volumes.refresh()
            self._next_refresh = time.time() + self.node.settings.volume_resync_s
        if self.instances and not self._terminal:
            self._wake_in(self.node.settings.volume_resync_s)
        self._push_status(phase)

    def _phase(self) -> str:
        spec = self.pod["spec"]
        init = [self.records[c["name"]] for c in spec.get("initContainers") or []]
        app = [self.records[c["name"]] for c in spec["containers"]]
        return status_module.pod_phase(
            restart_policy=spec.get("restartPolicy") or "Always", init=init, app=app
        )

    def _hostname(self) -> str:
        """The pod's hostname; a hostNetwork pod shares the node's, as it shares its network."""
        if self.pod["spec"].get("hostNetwork"):
            return self.node.name
        return str(self.pod["spec"].get("hostname") or self.name_)[:63]

    def _pod_with_status(self) -> JSON:
        """The pod as env and downward API see it: with the IPs the agent assigned."""
        ips = [{"ip": self.sandbox.pod_ip}] if self.sandbox.pod_ip else []
        status = {
            **(self.pod.get("status") or {}),
            "podIP": self.sandbox.pod_ip,
            "podIPs": ips,
            "hostIP": self.node.ip,
            "hostIPs": [{"ip": self.node.ip}],
        }
        return {**self.pod, "status": status}

    def _ensure_sandbox(self) -> bool:
        try:
            self.sandbox.create_network()
        except (network.NetworkError, RuntimeError) as error:
            self._event(events.WARNING, "FailedCreatePodSandBox", f"Failed to create pod sandbox: {error}")
            self._wake_in(_RETRY_S)
            return False
        if self.sandbox.volumes_ready:
            return True
        try:
            self.sandbox.setup_volumes(self._pod_with_status())
        except volumes.VolumeError as error:
            self._event(events.WARNING, "FailedMount", f"MountVolume.SetUp failed: {error}")
            self._wake_in(_RETRY_S)
            return False
        return True

    # ------------------------------------------------------------------------------- starting
    def _try_start(self, container: JSON) -> None:
        name = container["name"]
        record = self.records[name]
        now = time.time()
        if name in self._awaiting_restart:
            backoff = self._crash_backoff.setdefault(name, _Backoff())
            if now < backoff.not_before:
                if record.terminated is not None:
                    record.last_state = {"terminated": record.terminated}
                message = (
                    f"back-off {backoff.delay_s:g}s restarting failed container={name} "
                    f"pod={containers.pod_label(self.pod)}"
                )
                if (record.waiting or {}).get("reason") != "CrashLoopBackOff":
                    self._event(
                        events.WARNING,
                        "BackOff",
                        f"Back-off restarting failed container {name} in pod "
                        f"{containers.pod_label(self.pod)}",
                        container=name,
                    )
                record.state = {"waiting": {"reason": "CrashLoopBackOff", "message": message}}
                self._wake_in(backoff.not_before - now)
                return
        pull = self._pull_backoff.get(name)
        if pull is not None and now < pull.not_before:
            self._wake_in(pull.not_before - now)
            return
        self._start(container)

    def _start(self, container: JSON) -> None:
        name = container["name"]
        record = self.records[name]
        reference = container["image"]
        try:
            image = self.node.images.current().resolve(reference)
        except (images.ImageNotFound, ValueError, OSError) as error:
            self._image_pull_failed(container, str(error))
            return
        self._pull_backoff.pop(name, None)
        try:
            plan, process, identity = self._configure(container, image)
        except (env.EnvError, containers.ConfigError, kube.ApiError) as error:
            message = str(error)
            if (record.waiting or {}).get("message") != message:
                self._event(events.WARNING, "Failed", f"Error: {message}", container=name)
            record.state = {"waiting": {"reason": "CreateContainerConfigError", "message": message}}
            self._wake_in(_RETRY_S)
            return
        if record.waiting is None or (record.waiting or {}).get("reason") != "CrashLoopBackOff":
            self._event(
                events.NORMAL,
                "Pulled",
                f'Container image "{reference}" already present on machine',
                container=name,
            )
        if record.terminated is not None:
            record.last_state = {"terminated": record.terminated}
        if name in self._awaiting_restart:
            record.restart_count += 1
            self._awaiting_restart.discard(name)
        number = record.restart_count
        self._event(events.NORMAL, "Created", f"Created container: {name}", container=name)
        started_at = time.time()
        try:
            instance = instances.launch(
                container=container,
                number=number,
                plan=plan,
                process=process,
                hostname=self._hostname(),
                netns_path=self.sandbox.netns_path,
                cgroup_root=self.sandbox.cgroup_root,
                pod_dir=self.pod_dir,
                registry=self.node.mountpoints,
            )
        except runtime.StartFailed as error:
            message = f"failed to create containerd task: failed to create shim task: {error}"
            self._event(events.WARNING, "Failed", f"Error: {message}", container=name)
            record.state = status_module.terminated_state(
                exit_code=128,
                reason="ContainerCannotRun",
                message=str(error),
                started_at=_rfc3339(started_at),
                finished_at=kube.now_rfc3339(),
                container_id="",
            )
            record.ready = record.started = False
            self._after_termination(name, ran_for_s=0.0)
            return
        running = instance.running
        log.info(
            "started %s/%s container %s (uid %d, pid %d)",
            self.namespace,
            self.name_,
            name,
            identity.uid,
            running.pid,
        )
        self._event(events.NORMAL, "Started", f"Started container {name}", container=name)
        self.instances[name] = instance
        record.state = {"running": {"startedAt": _rfc3339(running.started_at)}}
        record.container_id = running.container_id
        record.image_id = instances.image_id(reference, image)
        record.started = not container.get("startupProbe")
        record.ready = record.started and not container.get("readinessProbe") and not record.is_init
        threading.Thread(
            target=lambda: self.post(("exited", name, number, runtime.wait(running))),
            name=f"wait-{self.name_}-{name}-{number}",
            daemon=True,
        ).start()
        if probes.ProbeRunner.needed(container) and not record.is_init:
            instance.probes = probes.ProbeRunner(
                container=container,
                pod_ip=self.sandbox.pod_ip,
                run_exec=self._exec_runner(instance),
                post=lambda result: self.post(("probe", name, number, result)),
                name=f"probe-{self.name_}-{name}-{number}",
            )
            instance.probes.start()
        post_start = (container.get("lifecycle") or {}).get("postStart")
        if post_start:
            ok, output = probes.run_handler(
                post_start,
                container=container,
                pod_ip=self.sandbox.pod_ip,
                timeout_s=self._grace_s(),
                run_exec=self._exec_runner(instance),
            )
            if not ok:
                self._event(
                    events.WARNING, "FailedPostStartHook", f"PostStartHook failed: {output}", container=name
                )
                self._kill(name, grace_s=self._grace_s(), run_pre_stop=True)

    def _configure(
        self, container: JSON, image: images.Image
    ) -> tuple[containers.MountPlan, runtime.ProcessSpec, containers.Identity]:
        pod = self._pod_with_status()
        config_maps, secrets = env.referenced_objects(pod)
        api = self.sandbox.volumes.api
        sources = env.EnvSources(
            config_maps={name: api.config_map(self.namespace, name) for name in config_maps},
            secrets={name: api.secret(self.namespace, name) for name in secrets},
            services=self.node.services.snapshot(),
            node_allocatable=self.node.allocatable,
        )
        name = container["name"]
        number = self.records[name].restart_count + (1 if name in self._awaiting_restart else 0)
        assert self.sandbox.files is not None
        return containers.configure(
            pod=pod,
            container=container,
            image=image,
            sources=sources,
            hostname=self._hostname(),
            sandbox=self.sandbox.files,
            pod_volumes=self.sandbox.volumes.volumes,
            termination_log=instances.termination_log_path(self.pod_dir, name, number),
            bin_wrappers=self.node.bin_wrappers(image.bin_dir) if image.bin_dir is not None else None,
        )

    def _image_pull_failed(self, container: JSON, message: str) -> None:
        name, reference = container["name"], container["image"]
        record = self.records[name]
        backoff = self._pull_backoff.setdefault(name, _Backoff())
        settings = self.node.settings
        self._event(events.NORMAL, "Pulling", f'Pulling image "{reference}"', container=name)
        self._event(
            events.WARNING, "Failed", f'Failed to pull image "{reference}": {message}', container=name
        )
        self._event(events.WARNING, "Failed", "Error: ErrImagePull", container=name)
        if (record.waiting or {}).get("reason") in ("ErrImagePull", "ImagePullBackOff"):
            record.state = {
                "waiting": {
                    "reason": "ImagePullBackOff",
                    "message": f'Back-off pulling image "{reference}": ErrImagePull: {message}',
                }
            }
            self._event(events.NORMAL, "BackOff", f'Back-off pulling image "{reference}"', container=name)
            self._event(events.WARNING, "Failed", "Error: ImagePullBackOff", container=name)
        else:
            record.state = {"waiting": {"reason": "ErrImagePull", "message": message}}
        backoff.delay_s = (
            settings.backoff_initial_s
            if backoff.delay_s == 0
            else min(backoff.delay_s * 2, settings.backoff_max_s)
        )
        backoff.not_before = time.time() + backoff.delay_s
        self._wake_in(backoff.delay_s)

    def _exec_runner(self, instance: instances.Instance) -> probes.ExecRunner:
        def run(argv: list[str], timeout_s: float) -> tuple[int | None, str]:
            process = dataclasses.replace(instance.running.process, argv=tuple(argv))
            return runtime.run_in(
                instance.running, process, spec_dir=self.pod_dir / "launch", timeout_s=timeout_s
            )

        return run

    # ---------------------------------------------------------------------------- exits, probes
    def _on_exit(self, name: str, instance: instances.Instance, exit_info: runtime.Exit) -> None:
        del self.instances[name]
        instances.account(instance, pod=self.pod, log=self.node.settings.cpu_log)
        instances.release(instance, self.node.mountpoints)
        record = self.records[name]
        reason = status_module.exit_reason(exit_code=exit_info.exit_code, oom_killed=exit_info.oom_killed)
        message = instances.termination_message(instance, failed=exit_info.exit_code != 0)
        record.state = status_module.terminated_state(
            exit_code=exit_info.exit_code,
            reason=reason,
            message=message,
            signal=exit_info.signal,
            started_at=_rfc3339(instance.running.started_at),
            finished_at=_rfc3339(exit_info.finished_at),
            container_id=instance.running.container_id,
        )
        record.ready = record.started = False
        self._after_termination(name, ran_for_s=exit_info.finished_at - instance.running.started_at)

    def _after_termination(self, name: str, *, ran_for_s: float) -> None:
        settings = self.node.settings
        backoff = self._crash_backoff.setdefault(name, _Backoff())
        if ran_for_s > 2 * settings.backoff_max_s:
            backoff.delay_s = 0.0
        backoff.not_before = time.time() + backoff.delay_s
        backoff.delay_s = (
            settings.backoff_initial_s
            if backoff.delay_s == 0
            else min(backoff.delay_s * 2, settings.backoff_max_s)
        )
        self._awaiting_restart.add(name)

    def _on_probe(self, name: str, instance: instances.Instance, result: tuple[Any, ...]) -> None:
        record = self.records[name]
        kind = result[0]
        if kind == "started":
            record.started = True
            if not instance.spec.get("readinessProbe"):
                record.ready = True
        elif kind == "ready":
            record.ready = bool(result[1]) and record.started
        elif kind == "unhealthy":
            self._event(events.WARNING, "Unhealthy", f"{result[1]} probe failed: {result[2]}", container=name)
        elif kind == "kill":
            probe_kind = str(result[1]).lower()
            self._event(
                events.NORMAL,
                "Killing",
                f"Container {name} failed {probe_kind} probe, will be restarted",
                container=name,
            )
            record.ready = False
            self._kill(name, grace_s=self._grace_s(), run_pre_stop=True)

    # ---------------------------------------------------------------------------------- killing
    def _grace_s(self) -> float:
        metadata, spec = self.pod["metadata"], self.pod["spec"]
        if metadata.get("deletionGracePeriodSeconds") is not None:
            return float(metadata["deletionGracePeriodSeconds"])
        grace = spec.get("terminationGracePeriodSeconds")
        return float(grace) if grace is not None else 30.0

    def _kill(self, name: str, *, grace_s: float, run_pre_stop: bool) -> None:
        """Stop one container on a helper thread: preStop (bounded by the grace period), SIGTERM, then
        SIGKILL of its cgroup when the grace period is over. Its exit arrives as a normal message."""
        instance = self.instances[name]
        if instance.stopping:
            return
        instance.stopping = True
        if instance.probes is not None:
            instance.probes.stop()
        pre_stop = (instance.spec.get("lifecycle") or {}).get("preStop") if run_pre_stop else None
        deadline = time.monotonic() + grace_s

        def stop() -> None:
            if pre_stop:
                ok, output = probes.run_handler(
                    pre_stop,
                    container=instance.spec,
                    pod_ip=self.sandbox.pod_ip,
                    timeout_s=max(0.0, deadline - time.monotonic()),
                    run_exec=self._exec_runner(instance),
                )
                if not ok:
                    self._event(
                        events.WARNING, "FailedPreStopHook", f"PreStopHook failed: {output}", container=name
                    )
            # The kubelet leaves at least 2 s between SIGTERM and SIGKILL, even after a long preStop.
            remaining = max(deadline - time.monotonic(), 2.0 if pre_stop else 0.0)
            runtime.stop(instance.running, grace_s=remaining)

        threading.Thread(target=stop, name=f"stop-{self.name_}-{name}", daemon=True).start()

    def _terminate(self) -> None:
        """The pod is being deleted: stop every container, then report and delete the object."""
        if not self._terminating:
            self._terminating = True
            grace = self._grace_s()
            for name in list(self.instances):
                self._event(events.NORMAL, "Killing", f"Stopping container {name}", container=name)
                self._kill(name, grace_s=grace, run_pre_stop=True)
        if self.instances:
            self._push_status()
            return
        phase = self._phase()
        if phase not in status_module.TERMINAL_PHASES:
            app = [self.records[c["name"]] for c in self.pod["spec"]["containers"]]
            succeeded = all(r.terminated is not None and r.terminated["exitCode"] == 0 for r in app)
            phase = status_module.SUCCEEDED if succeeded else status_module.FAILED
        self._terminal = True
        self.sandbox.teardown()
        self._push_status(phase)
        metadata = self.pod["metadata"]
        try:
            self.node.client.delete(
                f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}",
                {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
            )
        except kube.ApiError as error:
            if error.status not in (404, 409):
                raise
        self.finished.set()

    def _kill_everything(self) -> None:
        """Node lost, agent stopping, object gone: SIGKILL at once, tear down, no API writes."""
        for instance in list(self.instances.values()):
            instances.kill_now(instance, self.node.mountpoints)
            instances.account(instance, pod=self.pod, log=self.node.settings.cpu_log)
        self.instances.clear()
        self.sandbox.teardown()
        self.finished.set()

    # ------------------------------------------------------------------------------ reporting
    def _event(self, kind: str, reason: str, message: str, *, container: str | None = None) -> None:
        self.node.recorder.pod_event(self.pod, kind=kind, reason=reason, message=message, container=container)

    def _push_status(self, phase: str | None = None) -> None:
        spec = self.pod["spec"]
        outcome = self.reporter.push(
            self.pod,
            init=[self.records[c["name"]] for c in spec.get("initContainers") or []],
            app=[self.records[c["name"]] for c in spec["containers"]],
            phase=phase or self._phase(),
            node_ip=self.node.ip,
            sandbox_ready=self.sandbox.network_ready,
            pod_ip=self.sandbox.pod_ip,
        )
        if outcome is reporter.Outcome.GONE:
            self.post(("deleted",))
        elif outcome is reporter.Outcome.RETRY:
            self._wake_in(_RETRY_S)
