"""The container runtime: start a container's process through the launcher, wait for it, exec inside it.

Owns the process side of a container: writing the launcher's spec, starting it in its own session with
stdout+stderr appended to the container's log file, learning whether the exec succeeded (the launcher's
close-on-exec status pipe), turning the exit into (exit code, signal, OOM-killed) from the cgroup, and
running further commands inside a running container (exec probes, lifecycle hooks, ``kubectl exec``)
with the same namespaces, cgroups, user and environment.

It knows nothing of pods, restart policies or the API: ``podworker.py`` decides what to start and when.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from . import cgroups

LAUNCHER = Path(__file__).with_name("launcher.py")
#: The container ID scheme, like ``containerd://<id>``.
RUNTIME_NAME = "nodeagent"


class StartFailed(RuntimeError):
    """The launcher could not exec the command (or set the container up); the message says why."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mount:
    target: str
    kind: str = "bind"  # "bind" | "tmpfs"
    source: str = ""
    readonly: bool = False
    options: str = ""
    #: Create the target inside the container ("dir"/"file"): only for targets below another of the
    #: container's own mounts; host paths are made by the agent's mountpoint registry.
    mkdir: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProcessSpec:
    """Who and what runs: shared by containers (``run``) and commands inside them (``join``)."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str = "/"
    uid: int | None = None
    gid: int | None = None
    groups: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ContainerSpec:
    process: ProcessSpec
    hostname: str
    #: The pod's netns (``/run/netns/...``); None for hostNetwork pods (the agent's own, the bed's).
    netns_path: str | None
    mounts: tuple[Mount, ...]
    cwd_mkdir: bool = False
    readonly_root: bool = False


@dataclasses.dataclass(kw_only=True)
class RunningContainer:
    container_id: str
    popen: subprocess.Popen[bytes]
    cgroup: cgroups.Cgroup
    started_at: float
    process: ProcessSpec
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid


@dataclasses.dataclass(frozen=True, kw_only=True)
class Exit:
    exit_code: int
    signal: int | None
    oom_killed: bool
    finished_at: float


def _nofile_limit() -> int:
    """Container runtimes' RLIMIT_NOFILE (1048576), capped by what this kernel allows."""
    try:
        return min(1_048_576, int(Path("/proc/sys/fs/nr_open").read_text()))
    except OSError:
        return 1_048_576


def _launcher_argv(spec_path: Path) -> list[str]:
    return [sys.executable, "-I", "-S", str(LAUNCHER), str(spec_path)]


def _spawn(
    payload: dict[str, Any],
    *,
    spec_dir: Path,
    stdin: int | IO[bytes] | None,
    stdout: int | IO[bytes] | None,
    stderr: int | IO[bytes] | None,
) -> subprocess.Popen[bytes]:
    """Start the launcher with ``payload``; return once it exec'd; raise StartFailed if it could not."""
    spec_dir.mkdir(parents=True, exist_ok=True)
    read_fd, write_fd = os.pipe()
    spec_path = spec_dir / f"launch-{uuid.uuid4().hex[:12]}.json"
    fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump({**payload, "status_fd": write_fd}, file)
    try:
        popen = subprocess.Popen(
            _launcher_argv(spec_path),
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            pass_fds=(write_fd,),
            start_new_session=True,
        )
    finally:
        os.close(write_fd)
    try:
        with os.fdopen(read_fd, "rb") as status:
            report = status.read()
    finally:
        spec_path.unlink(missing_ok=True)
    if report:
        popen.wait()
        detail = json.loads(report.decode().splitlines()[0])
        stage = "" if detail["stage"] == "exec" else f"{detail['stage']}: "
        raise StartFailed(f"{stage}{detail['message']}")
    return popen


def _process_payload(process: ProcessSpec) -> dict[str, Any]:
    return {
        "argv": list(process.argv),
        "env": dict(process.env),
        "cwd": process.cwd,
        "uid": process.uid,
        "gid": process.gid,
        "groups": list(process.groups) if process.groups is not None else None,
    }


def start(spec: ContainerSpec, *, cgroup: cgroups.Cgroup, log_path: Path, spec_dir: Path) -> RunningContainer:
    """Start a container whose group ``cgroup`` already exists with its limits; logs go to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        **_process_payload(spec.process),
        "mode": "run",
        "cgroup_procs": cgroup.procs_files(),
        "netns": spec.netns_path,
        "hostname": spec.hostname,
        "mounts": [mount.to_json() for mount in spec.mounts],
        "cwd_mkdir": spec.cwd_mkdir,
        "readonly_root": spec.readonly_root,
        "nofile": _nofile_limit(),
    }
    with log_path.open("ab") as log:
        popen = _spawn(payload, spec_dir=spec_dir, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    return RunningContainer(
        container_id=f"{RUNTIME_NAME}://{uuid.uuid4().hex}",
        popen=popen,
        cgroup=cgroup,
        started_at=time.time(),
        process=spec.process,
        log_path=log_path,
    )


def wait(container: RunningContainer) -> Exit:
    """Block until the main process exits; then kill what is left in its cgroup (a container's processes
    die with its PID 1) and read whether the kernel OOM-killed inside it.

    When the kernel's OOM killer acts inside the group first, every process of the container is killed at
    once: on cgroup v2 the kubelet sets ``memory.oom.group=1`` on each container (Kubernetes >= 1.28, unless
    ``singleProcessOOMKill``), so an OOM kill of one process -- a Ray worker of a train actor, say -- ends
    the whole container, exit 137, reason OOMKilled. This box's cgroup v1 kills only the chosen process,
    so the group kill is done here, on the kernel's OOM notification (an eventfd, no polling)."""
    killed_for_oom = _kill_whole_group_on_oom(container)
    returncode = container.popen.wait()
    container.cgroup.kill_all()
    oom = killed_for_oom or container.cgroup.oom_kills() > 0
    if returncode < 0:
        return Exit(exit_code=128 - returncode, signal=-returncode, oom_killed=oom, finished_at=time.time())
    return Exit(exit_code=returncode, signal=None, oom_killed=oom, finished_at=time.time())


def _kill_whole_group_on_oom(container: RunningContainer) -> bool:
    """Return when the main process exits (False), or when the kernel signals an OOM in the group, having
    killed it all (True). The notification comes as the OOM starts, before the kernel has picked and
    counted its victim (``oom_kill`` could still read 0 then: e2e runs of 2026-11-27), so the signal alone
    decides, as the OOM group kill does."""
    oom = container.cgroup.oom_eventfd()
    if oom is None:
        return False
    try:
        pidfd = os.pidfd_open(container.pid)
    except ProcessLookupError:
        os.close(oom)
        return False
    try:
        ready, _, _ = select.select([pidfd, oom], [], [])
        if oom not in ready:
            return False
        container.cgroup.kill_all()
        return True
    finally:
        os.close(pidfd)
        os.close(oom)


def exec_in(
    container: RunningContainer,
    process: ProcessSpec,
    *,
    spec_dir: Path,
    stdin: int | IO[bytes] | None = subprocess.DEVNULL,
    stdout: int | IO[bytes] | None = subprocess.PIPE,
    stderr: int | IO[bytes] | None = subprocess.STDOUT,
    tty: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``process`` inside ``container`` (its namespaces and cgroups); raises StartFailed.

    ``tty``: stdin is a terminal the process takes as its controlling terminal (``kubectl exec -t``).
    """
    payload = {
        **_process_payload(process),
        "mode": "join",
        "join_pid": container.pid,
        "cgroup_procs": container.cgroup.procs_files(),
        "tty": tty,
    }
    return _spawn(payload, spec_dir=spec_dir, stdin=stdin, stdout=stdout, stderr=stderr)


def run_in(
    container: RunningContainer, process: ProcessSpec, *, spec_dir: Path, timeout_s: float
) -> tuple[int | None, str]:
    """Run ``process`` inside ``container`` to completion: (exit code or None on timeout, output)."""
    try:
        popen = exec_in(container, process, spec_dir=spec_dir)
    except StartFailed as error:
        return 128, str(error)
    output: list[bytes] = []
    assert popen.stdout is not None
    reader = threading.Thread(
        target=lambda: output.append(popen.stdout.read() if popen.stdout else b""), daemon=True
    )
    reader.start()
    try:
        code = popen.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_session(popen.pid)
        popen.wait()
        code = None
    reader.join(timeout=1)
    text = b"".join(output).decode(errors="replace")
    return code, text if code is not None else f"command timed out after {timeout_s:g}s"


def _kill_session(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def signal_main(container: RunningContainer, signum: int) -> None:
    """Send ``signum`` to the container's main process (what ``docker kill -s`` does)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(container.pid, signum)


def stop(container: RunningContainer, *, grace_s: float) -> None:
    """SIGTERM to the main process, then SIGKILL of every process in the container after ``grace_s``."""
    signal_main(container, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        container.popen.wait(timeout=max(0.0, grace_s))
    container.cgroup.kill_all()
