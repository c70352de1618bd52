"""From a pod's container to a :class:`runtime.ContainerSpec`: user, mounts, environment, command line.

Owns the translation the kubelet and a CRI runtime share between them:

- identity: runAsUser/runAsGroup (container over pod over the image's USER), supplementalGroups and
  fsGroup, and the runAsNonRoot checks that end in ``CreateContainerConfigError`` with the kubelet's words;
- mounts, in order: for a non-root user a 0755 tmpfs over ``/root`` with ``/root/.pyenv`` and
  ``/root/.cache/trainop`` bound back read-only (``/root`` is 0700 here, and the interpreter of the
  repository's venv lives under it); a private ``/tmp`` (with this checkout bound back read-only when it
  lies under ``/tmp``, as a 0755 tmpfs of its entries when the directory itself is 0700, and bound back
  again after a pod volume mounted over it, such as the operator's ``/tmp``); the pod's shared
  ``/dev/shm``; ``/etc/hosts``,
  ``/etc/resolv.conf``, ``/etc/hostname``; the termination-message file; the image's ``paths`` and ``bin``
  (at ``/usr/local/bin``); then the pod's volumeMounts (subPath, readOnly), shallowest first;
- which mount targets must exist on the host first (the agent's mountpoint registry makes those) and which
  the launcher creates inside a mount of the container's own;
- the environment: the image's ENV, PATH/HOSTNAME/HOME defaults, then the pod's env (``env.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import env as env_module
from . import images, runtime, volumes

JSON = dict[str, Any]
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Exposed inside a non-root container's tmpfs ``/root`` (read-only): the interpreters and cached tools.
ROOT_PASSTHROUGH = ("/root/.pyenv", "/root/.cache/trainop")


class ConfigError(ValueError):
    """The container cannot be configured (the kubelet's CreateContainerConfigError)."""

    reason = "CreateContainerConfigError"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Identity:
    uid: int
    gid: int
    groups: tuple[int, ...]


def _security(pod: JSON, container: JSON, key: str) -> Any:
    container_sc = container.get("securityContext") or {}
    if container_sc.get(key) is not None:
        return container_sc[key]
    return (pod["spec"].get("securityContext") or {}).get(key)


def pod_label(pod: JSON) -> str:
    metadata = pod["metadata"]
    return f"{metadata['name']}_{metadata['namespace']}({metadata['uid']})"


def identity(pod: JSON, container: JSON, image: images.Image) -> Identity:
    pod_sc = pod["spec"].get("securityContext") or {}
    run_as_user = _security(pod, container, "runAsUser")
    run_as_group = _security(pod, container, "runAsGroup")
    try:
        image_uid, image_gid = image.uid_gid()
    except ValueError:
        image_uid = image_gid = None
        if run_as_user is None and _security(pod, container, "runAsNonRoot"):
            raise ConfigError(
                f"container has runAsNonRoot and image has non-numeric user ({image.user}), cannot verify "
                f'user is non-root (pod: "{pod_label(pod)}", container: {container["name"]})'
            ) from None
        if run_as_user is None:
            raise ConfigError(
                f"image user {image.user!r} is not numeric; set securityContext.runAsUser"
            ) from None
    uid = int(run_as_user if run_as_user is not None else image_uid if image_uid is not None else 0)
    if _security(pod, container, "runAsNonRoot") and uid == 0:
        if run_as_user is not None:
            raise ConfigError(
                f'container\'s runAsUser breaks non-root policy (pod: "{pod_label(pod)}", '
                f"container: {container['name']})"
            )
        raise ConfigError(
            f'container has runAsNonRoot and image will run as root (pod: "{pod_label(pod)}", '
            f"container: {container['name']})"
        )
    gid = int(run_as_group if run_as_group is not None else image_gid if image_gid is not None else 0)
    groups = [gid, *(int(g) for g in pod_sc.get("supplementalGroups") or [])]
    if pod_sc.get("fsGroup") is not None:
        groups.append(int(pod_sc["fsGroup"]))
    return Identity(uid=uid, gid=gid, groups=tuple(dict.fromkeys(groups)))


# ---------------------------------------------------------------------------------------- mounts
@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxFiles:
    """Per-pod files and dirs that every container mounts."""

    hosts: Path | None
    resolv_conf: Path | None
    hostname: Path
    shm: Path


@dataclasses.dataclass(frozen=True, kw_only=True)
class MountPlan:
    mounts: tuple[runtime.Mount, ...]
    #: (target, "dir" | "file") that must exist on the host while the container runs.
    host_mountpoints: tuple[tuple[str, str], ...]


def _kind_of(source: str) -> str:
    return "dir" if os.path.isdir(source) else "file"


def plan_mounts(
    *,
    container: JSON,
    identity: Identity,
    image: images.Image,
    sandbox: SandboxFiles,
    pod_volumes: Mapping[str, volumes.HostVolume],
    termination_log: Path,
    bin_wrappers: Path | None,
    env: Mapping[str, str],
) -> MountPlan:
    """Every mount of the container, in order; raises ConfigError for a volumeMount without a volume."""
    mounts: list[runtime.Mount] = []
    if identity.uid != 0:
        mounts.append(runtime.Mount(target="/root", kind="tmpfs", options="mode=755"))
        mounts += [
            runtime.Mount(target=path, source=path, readonly=True)
            for path in ROOT_PASSTHROUGH
            if os.path.isdir(path)
        ]
    mounts.append(runtime.Mount(target="/tmp", kind="tmpfs", options="mode=1777"))
    # A checkout under /tmp (a CI clone there) holds the images' venv: it comes back through the private /tmp.
    checkout = images.REPO_ROOT.resolve()
    checkout_binds = _checkout_mounts(checkout) if checkout.is_relative_to("/tmp") else []
    mounts += checkout_binds
    mounts.append(runtime.Mount(target="/dev/shm", source=str(sandbox.shm)))
    for target, source in (
        ("/etc/hosts", sandbox.hosts),
        ("/etc/resolv.conf", sandbox.resolv_conf),
        ("/etc/hostname", sandbox.hostname),
    ):
        if source is not None:
            mounts.append(runtime.Mount(target=target, source=str(source)))
    message_path = str(container.get("terminationMessagePath") or "/dev/termination-log")
    mounts.append(runtime.Mount(target=message_path, source=str(termination_log)))
    for target, source_path in sorted(image.paths):
        mounts.append(runtime.Mount(target=target, source=str(source_path), readonly=True))
    if bin_wrappers is not None:
        mounts.append(runtime.Mount(target="/usr/local/bin", source=str(bin_wrappers), readonly=True))
    volume_mounts = []
    for volume_mount in container.get("volumeMounts") or []:
        host = pod_volumes.get(volume_mount["name"])
        if host is None:
            raise ConfigError(f"volumeMount {volume_mount['name']!r}: the pod has no such volume")
        source = host.path
        sub_path = volume_mount.get("subPath") or ""
        if volume_mount.get("subPathExpr"):
            sub_path = env_module.expand(volume_mount["subPathExpr"], env.get)
        if sub_path:
            if sub_path.startswith("/") or ".." in Path(sub_path).parts:
                raise ConfigError(
                    f"volumeMount {volume_mount['name']!r}: subPath {sub_path!r} must be relative"
                )
            source = source / sub_path
            if not source.exists() and not host.read_only:
                source.mkdir(parents=True, mode=0o755)
        volume_mounts.append(
            runtime.Mount(
                target=os.path.normpath(volume_mount["mountPath"]),
                source=str(source),
                readonly=bool(volume_mount.get("readOnly")) or host.read_only,
            )
        )
    mounts += sorted(volume_mounts, key=lambda m: m.target.count("/"))
    if checkout_binds and any(
        checkout.is_relative_to(m.target) for m in volume_mounts
    ):  # a pod's own /tmp volume (the operator's chart has one) would hide the checkout bound back above
        mounts += checkout_binds
    return _with_mountpoints(mounts)


def _checkout_mounts(checkout: Path) -> list[runtime.Mount]:
    """The checkout bound back read-only. A checkout directory others cannot enter (``mktemp -d`` makes it
    0700) comes back as a 0755 tmpfs holding its entries bound back: a non-root container reaches its venv."""
    try:
        enterable = bool(os.stat(checkout).st_mode & stat.S_IXOTH)
    except OSError:
        enterable = True  # nothing here to open up
    if enterable:
        return [runtime.Mount(target=str(checkout), source=str(checkout), readonly=True, mkdir="dir")]
    return [runtime.Mount(target=str(checkout), kind="tmpfs", options="mode=755")] + [
        runtime.Mount(target=str(entry), source=str(entry), readonly=True)
        for entry in sorted(checkout.iterdir())
    ]


def _with_mountpoints(mounts: Sequence[runtime.Mount]) -> MountPlan:
    """Decide, per target, who creates it: the launcher (inside an earlier mount of this container) or
    the agent on the host (then counted in its mountpoint registry)."""
    planned: list[runtime.Mount] = []
    host: list[tuple[str, str]] = []
    for index, mount in enumerate(mounts):
        kind = "dir" if mount.kind == "tmpfs" else _kind_of(mount.source)
        covered = any(mount.target.startswith(earlier.target.rstrip("/") + "/") for earlier in mounts[:index])
        if covered:
            planned.append(dataclasses.replace(mount, mkdir=kind))
        else:
            # Every uncovered target goes to the registry, existing or not: another pod may have made it
            # and may remove it when its container ends; the registry counts users of what it made.
            host.append((mount.target, kind))
            planned.append(mount)
    return MountPlan(mounts=tuple(planned), host_mountpoints=tuple(host))


def working_dir_created_by_launcher(working_dir: str, mounts: Sequence[runtime.Mount]) -> bool:
    return any(working_dir == m.target or working_dir.startswith(m.target.rstrip("/") + "/") for m in mounts)


# ------------------------------------------------------------------------------------- bin dirs
def write_bin_wrappers(bin_dir: Path, wrappers_root: Path) -> Path:
    """A directory of ``exec <real path> "$@"`` scripts, one per executable in ``bin_dir``.

    Bind-mounting a venv's ``bin`` at ``/usr/local/bin`` directly would break its ``python``: a venv is
    recognised by ``pyvenv.cfg`` next to the *invoked* path, which would then be ``/usr/local``.
    """
    digest = hashlib.sha256(str(bin_dir.resolve()).encode()).hexdigest()[:12]
    target = wrappers_root / digest
    if target.is_dir():
        return target
    staging = wrappers_root / f".{digest}.tmp"
    staging.mkdir(parents=True, exist_ok=True)
    for entry in sorted(bin_dir.iterdir()):
        try:
            mode = entry.stat().st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(mode) or not mode & 0o111:
            continue
        wrapper = staging / entry.name
        wrapper.write_text(f'#!/bin/sh\nexec {_sh_quote(str(entry))} "$@"\n')
        wrapper.chmod(0o755)
    staging.chmod(0o755)
    with contextlib.suppress(OSError):  # another agent thread won the race: its copy is the same
        staging.rename(target)
    return target


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


# ----------------------------------------------------------------------------------- environment
def configure(
    *,
    pod: JSON,
    container: JSON,
    image: images.Image,
    sources: env_module.EnvSources,
    hostname: str,
    sandbox: SandboxFiles,
    pod_volumes: Mapping[str, volumes.HostVolume],
    termination_log: Path,
    bin_wrappers: Path | None,
) -> tuple[MountPlan, runtime.ProcessSpec, Identity]:
    """Everything a container needs to start, or ConfigError / env.EnvError with the kubelet's words.

    ``pod`` carries the status the agent assigned (podIP, hostIP) for the downward API.
    """
    container_env = env_module.container_env(pod, container, sources)
    who = identity(pod, container, image)
    argv = env_module.command_line(
        container, image_entrypoint=image.entrypoint, image_cmd=image.cmd, env=container_env
    )
    if not argv:
        raise ConfigError("no command specified: the image has no entrypoint and the container no command")
    process = runtime.ProcessSpec(
        argv=tuple(argv),
        env=process_env(image=image, container_env=container_env, hostname=hostname, uid=who.uid),
        cwd=container.get("workingDir") or image.working_dir or "/",
        uid=who.uid,
        gid=who.gid,
        groups=who.groups,
    )
    plan = plan_mounts(
        container=container,
        identity=who,
        image=image,
        sandbox=sandbox,
        pod_volumes=pod_volumes,
        termination_log=termination_log,
        bin_wrappers=bin_wrappers,
        env=container_env,
    )
    return plan, process, who


def process_env(
    *, image: images.Image, container_env: Mapping[str, str], hostname: str, uid: int
) -> dict[str, str]:
    """The image's ENV, then runtime defaults, then the pod's env (which wins), as containerd merges."""
    merged = dict(image.env)
    merged.setdefault("PATH", DEFAULT_PATH)
    merged["HOSTNAME"] = hostname
    merged.setdefault("HOME", "/root" if uid == 0 else "/")
    merged.update(container_env)
    return merged
