"""One run of a container on the host: its cgroup, termination-message file, mountpoints and process.

Owns the host-side resources of a single container run, from creation to release: the run's cgroup
(``<container>-<n>`` under the pod's, with the container's CPU and memory limits), the file mounted at
``terminationMessagePath``, the host mountpoints it counts on, the process started through the runtime,
and, once it ended, the termination message the kubelet would report and the run's CPU time
(``account``). The pod worker decides when to launch and what a run's end means; this module only makes
and unmakes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from . import cgroups, container_cpu, containers, env, images, mountpoints, probes, runtime

JSON = dict[str, Any]
_LOG_TAIL_BYTES = 2048


@dataclasses.dataclass(kw_only=True)
class Instance:
    number: int
    spec: JSON
    running: runtime.RunningContainer
    termination_log: Path
    host_mountpoints: list[str]
    probes: probes.ProbeRunner | None = None
    stopping: bool = False


def image_id(reference: str, image: images.Image) -> str:
    """A stable digest of the image map entry, in the ``repo@sha256:...`` shape of real image IDs."""
    digest = hashlib.sha256(json.dumps(dataclasses.asdict(image), default=str, sort_keys=True).encode())
    return f"{images.repository_of(reference)}@sha256:{digest.hexdigest()}"


def _limits(container: JSON, group: cgroups.Cgroup) -> None:
    resources = container.get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    group.set_limits(
        memory_bytes=int(env.quantity(limits["memory"])) if "memory" in limits else None,
        cpu_millis_limit=int(env.quantity(limits["cpu"]) * 1000) if "cpu" in limits else None,
        cpu_millis_request=int(env.quantity(requests["cpu"]) * 1000) if "cpu" in requests else None,
    )


def termination_log_path(pod_dir: Path, container: str, number: int) -> Path:
    return pod_dir / "termination" / f"{container}-{number}"


def launch(
    *,
    container: JSON,
    number: int,
    plan: containers.MountPlan,
    process: runtime.ProcessSpec,
    hostname: str,
    netns_path: str | None,
    cgroup_root: Path,
    pod_dir: Path,
    registry: mountpoints.Mountpoints,
) -> Instance:
    """Start run ``number`` of ``container``; on runtime.StartFailed everything made is released first."""
    name = container["name"]
    group = cgroups.Cgroup(cgroup_root / f"{name}-{number}")
    group.create()
    _limits(container, group)
    termination_log = termination_log_path(pod_dir, name, number)
    termination_log.parent.mkdir(parents=True, exist_ok=True)
    termination_log.write_text("")
    termination_log.chmod(0o666)
    spec = runtime.ContainerSpec(
        process=process,
        hostname=hostname,
        netns_path=netns_path,
        mounts=plan.mounts,
        cwd_mkdir=containers.working_dir_created_by_launcher(process.cwd, plan.mounts),
        readonly_root=bool((container.get("securityContext") or {}).get("readOnlyRootFilesystem")),
    )
    host_mountpoints = list(plan.host_mountpoints)
    if not spec.cwd_mkdir and process.cwd != "/":
        host_mountpoints.append((process.cwd, "dir"))
    acquired: list[str] = []
    try:
        for target, kind in host_mountpoints:
            registry.acquire(target, kind=kind)
            acquired.append(target)
        running = runtime.start(
            spec, cgroup=group, log_path=pod_dir / name / f"{number}.log", spec_dir=pod_dir / "launch"
        )
    except BaseException:
        for target in acquired:
            registry.release(target)
        group.remove()
        raise
    return Instance(
        number=number,
        spec=container,
        running=running,
        termination_log=termination_log,
        host_mountpoints=acquired,
    )


def account(instance: Instance, *, pod: JSON, log: Path) -> None:
    """Append the run's CPU time (every process it ever held, from its cgroup) to ``log``: where a test
    bed's CPU goes, per pod and container (container_cpu sums it). Call before the group is removed; a
    kernel without a CPU counter writes nothing."""
    cpu_s = instance.running.cgroup.cpu_seconds()
    if cpu_s is None:
        return
    metadata = pod["metadata"]
    run = container_cpu.Run(
        namespace=metadata["namespace"],
        pod=metadata["name"],
        labels=metadata.get("labels") or {},
        container=instance.spec["name"],
        cpu_s=round(cpu_s, 3),
        wall_s=round(time.time() - instance.running.started_at, 3),
    )
    container_cpu.append(log, run)


def release(instance: Instance, registry: mountpoints.Mountpoints) -> None:
    """After the run ended: probes stopped, cgroup (and any straggler) gone, mountpoints released."""
    if instance.probes is not None:
        instance.probes.stop()
    instance.running.cgroup.remove()
    for target in instance.host_mountpoints:
        registry.release(target)


def kill_now(instance: Instance, registry: mountpoints.Mountpoints) -> None:
    """SIGKILL every process of the run and reap the main one, then release (no grace, no hooks)."""
    if instance.probes is not None:
        instance.probes.stop()
    instance.running.cgroup.kill_all()
    with contextlib.suppress(subprocess.TimeoutExpired):
        instance.running.popen.wait(timeout=10)  # reaped: gone, not a zombie, when we return
    for target in instance.host_mountpoints:
        registry.release(target)


def termination_message(instance: Instance, *, failed: bool) -> str:
    """What the container wrote to its terminationMessagePath, else (FallbackToLogsOnError, failed) its
    log's tail."""
    try:
        text = instance.termination_log.read_text(errors="replace")[:4096]
    except FileNotFoundError:
        text = ""
    if not text and failed and instance.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
        try:
            with instance.running.log_path.open("rb") as file:
                file.seek(0, 2)
                file.seek(max(0, file.tell() - _LOG_TAIL_BYTES))
                text = file.read().decode(errors="replace")
        except FileNotFoundError:
            pass
    return text
