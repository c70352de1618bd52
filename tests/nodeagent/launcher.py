"""The container's first process: build its namespaces and mounts, drop privileges, exec the command.

Run as ``python -I -S launcher.py SPEC.json`` by the runtime (``runtime.py``), never imported by it: it
depends on the standard library only, starts in a few tens of milliseconds, and becomes the container's
command through ``execve`` (the pid the agent watches is the container's main process).

``mode: run`` (a container):
  join the container's cgroups -> enter the pod's netns -> new mount and UTS namespaces (mounts are
  slaves of the host's, so host unmounts reach us and ours never leak out; hostname = pod name) ->
  every mount of the spec, in order (bind sources are opened first, so a tmpfs laid over ``/root`` can
  still receive bind mounts of ``/root/.pyenv``) -> supplementary groups, gid, uid -> chdir -> exec.
``mode: join`` (exec probes, lifecycle hooks, ``kubectl exec``): join the cgroups, then the net, UTS
  and mount namespaces of ``join_pid`` (the container's main process), drop privileges, chdir, exec.

Failure reporting: ``status_fd`` is close-on-exec. A successful exec closes it unwritten; any failure
writes one JSON line ``{"stage": ..., "message": ...}`` to it and exits 128, which the runtime reports
as ``ContainerCannotRun`` with that message (``executable file not found in $PATH`` and the like).
"""

import ctypes
import ctypes.util
import fcntl
import json
import os
import resource
import socket
import sys
import termios
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_SLAVE = 1 << 19

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {source or fstype} on {target}",
    )


def _setns(path: str, nstype: int) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc.setns(fd, nstype), f"setns {path}")
    finally:
        os.close(fd)


def _make_target(target: str, kind: str | None) -> None:
    if os.path.lexists(target) or not kind:
        return
    if kind == "dir":
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "a"):
            pass


def _do_mounts(mounts: list[dict[str, Any]]) -> None:
    # Bind sources first: a later mount (a tmpfs over /root) may hide them.
    sources: dict[int, int] = {}
    for index, spec in enumerate(mounts):
        if spec["kind"] == "bind":
            sources[index] = os.open(spec["source"], os.O_PATH | os.O_CLOEXEC)
    for index, spec in enumerate(mounts):
        target = spec["target"]
        _make_target(target, spec.get("mkdir"))
        if spec["kind"] == "tmpfs":
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, spec.get("options") or "mode=755")
        else:
            _mount(f"/proc/self/fd/{sources[index]}", target, None, MS_BIND | MS_REC, None)
            if spec.get("readonly"):
                _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
    for fd in sources.values():
        os.close(fd)


def _raise_nofile(wanted: int) -> None:
    """containerd and Docker give containers 1048576 open files; where raising the hard limit is not
    allowed (no CAP_SYS_RESOURCE), the soft limit goes up to the hard one."""
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
    except (ValueError, OSError):
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _drop_privileges(spec: dict[str, Any]) -> None:
    if spec.get("groups") is not None:
        os.setgroups(spec["groups"])
    if spec.get("gid") is not None:
        os.setgid(spec["gid"])
    if spec.get("uid") is not None:
        os.setuid(spec["uid"])


def main() -> None:
    with open(sys.argv[1]) as file:
        spec = json.load(file)
    status_fd = spec["status_fd"]
    os.set_inheritable(status_fd, False)  # closed by a successful exec: that is the "started" signal
    stage = "cgroups"
    try:
        for procs in spec.get("cgroup_procs") or []:
            with open(procs, "w") as file:
                file.write("0")
        if spec["mode"] == "run":
            stage = "namespaces"
            if spec.get("netns"):
                _setns(spec["netns"], CLONE_NEWNET)
            _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWUTS), "unshare")
            _mount(None, "/", None, MS_REC | MS_SLAVE, None)
            if spec.get("hostname"):
                socket.sethostname(spec["hostname"])
            if spec.get("readonly_root"):  # this namespace's view of / only: a per-mount flag
                _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
            stage = "mounts"
            _do_mounts(spec.get("mounts") or [])
        else:
            stage = "namespaces"
            pid = spec["join_pid"]
            for name, nstype in (("net", CLONE_NEWNET), ("uts", CLONE_NEWUTS), ("mnt", CLONE_NEWNS)):
                _setns(f"/proc/{pid}/ns/{name}", nstype)
        if spec.get("tty"):  # we lead a new session (the runtime starts us so): take stdin's terminal
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        stage = "user"
        if spec.get("nofile"):
            _raise_nofile(spec["nofile"])
        _drop_privileges(spec)
        stage = "workingDir"
        if spec.get("cwd_mkdir"):
            os.makedirs(spec["cwd"], exist_ok=True)
        os.chdir(spec.get("cwd") or "/")
        stage = "exec"
        argv = spec["argv"]
        if not argv:
            raise OSError("no command specified")
        os.execvpe(argv[0], argv, spec["env"])
    except Exception as error:
        message = str(error)
        if stage == "exec" and isinstance(error, FileNotFoundError):
            message = f'exec: "{spec["argv"][0]}": executable file not found in $PATH'
        elif stage == "exec" and isinstance(error, PermissionError):
            message = f'exec: "{spec["argv"][0]}": permission denied'
        try:
            os.write(status_fd, json.dumps({"stage": stage, "message": message}).encode() + b"\n")
        finally:
            os._exit(128)


if __name__ == "__main__":
    main()
