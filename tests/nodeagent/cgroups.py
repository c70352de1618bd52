"""cgroup v1 groups for containers: limits, the OOM-kill count, and killing every process inside.

Owns ``/sys/fs/cgroup/{memory,cpu,pids}/trainop/b<bed>/pod<uid>/<container>-<restart>``: one group per
container *instance*, so a restart starts with fresh counters and no stragglers of the previous run.
``resources.limits.memory`` becomes ``memory.limit_in_bytes`` (the kernel's OOM killer acts inside the
group and ``memory.oom_control``'s ``oom_kill`` counts its kills: how OOMKilled is told apart from a plain
SIGKILL), ``limits.cpu`` a CFS quota and ``requests.cpu`` ``cpu.shares``, as the kubelet's cgroupfs
driver does. :meth:`Cgroup.oom_eventfd` tells the runtime the moment the OOM killer acts, so it can kill the
whole container as the kubelet's ``memory.oom.group`` does on cgroup v2 (``runtime.wait``). The group is
also the container's process tree: :meth:`Cgroup.kill_all` reaches every
descendant, including daemons that left the process group (Ray's do).

It never touches groups outside ``trainop/``; :func:`remove_bed_tree` is how a later start cleans a
crashed agent's groups.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _controllers() -> tuple[str, ...]:
    """memory, cpu and pids; and cpuacct (each container's CPU time) where it is a hierarchy of its own. Where
    it is mounted together with cpu (``cpu,cpuacct``), the cpu group already has its counter."""
    cpuacct = ROOT / "cpuacct"
    separate = cpuacct.is_dir() and cpuacct.resolve() != (ROOT / "cpu").resolve()
    return ("memory", "cpu", "pids", "cpuacct") if separate else ("memory", "cpu", "pids")


CONTROLLERS = _controllers()
_CFS_PERIOD_US = 100_000


def bed_path(bed_id: int) -> Path:
    """Relative path of a bed's tree under each controller."""
    return Path("trainop") / f"b{bed_id}"


@dataclasses.dataclass(frozen=True)
class Cgroup:
    """One group, present in every controller of :data:`CONTROLLERS` under the same relative path."""

    relative: Path

    def dir(self, controller: str) -> Path:
        return ROOT / controller / self.relative

    def create(self) -> None:
        for controller in CONTROLLERS:
            self.dir(controller).mkdir(parents=True, exist_ok=True)

    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes its pid into to join (the launcher does)."""
        return [str(self.dir(controller) / "cgroup.procs") for controller in CONTROLLERS]

    def set_limits(
        self, *, memory_bytes: int | None, cpu_millis_limit: int | None, cpu_millis_request: int | None
    ) -> None:
        if memory_bytes is not None:
            (self.dir("memory") / "memory.limit_in_bytes").write_text(str(memory_bytes))
        if cpu_millis_limit is not None:
            quota = max(1000, cpu_millis_limit * _CFS_PERIOD_US // 1000)
            (self.dir("cpu") / "cpu.cfs_period_us").write_text(str(_CFS_PERIOD_US))
            (self.dir("cpu") / "cpu.cfs_quota_us").write_text(str(quota))
        if cpu_millis_request is not None:
            (self.dir("cpu") / "cpu.shares").write_text(str(max(2, cpu_millis_request * 1024 // 1000)))

    def pids(self) -> list[int]:
        try:
            text = (self.dir("pids") / "cgroup.procs").read_text()
        except OSError:  # gone, or being removed (ENODEV)
            return []
        return [int(pid) for pid in text.split()]

    def cpu_seconds(self) -> float | None:
        """CPU time (user + system) of every process that ran in the group, exited ones included; None where
        the kernel keeps no such counter (no cpuacct hierarchy)."""
        for controller in ("cpuacct", "cpu"):
            try:
                return int((self.dir(controller) / "cpuacct.usage").read_text()) / 1e9
            except (FileNotFoundError, ValueError):
                continue
        return None

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer has killed in this group."""
        try:
            text = (self.dir("memory") / "memory.oom_control").read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def oom_eventfd(self) -> int | None:
        """An eventfd the kernel signals when the OOM killer acts in this group (cgroup v1's notification
        API: ``"<eventfd> <fd of memory.oom_control>"`` written to ``cgroup.event_control``); None where the
        kernel refuses it. The caller closes it."""
        event = os.eventfd(0, os.EFD_CLOEXEC)
        try:
            control = os.open(self.dir("memory") / "memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
            try:
                (self.dir("memory") / "cgroup.event_control").write_text(f"{event} {control}")
            finally:
                os.close(control)  # the kernel holds its own reference once registered
        except OSError:
            os.close(event)
            return None
        return event

    def signal_all(self, signum: int) -> int:
        """Send ``signum`` to every process in the group; return how many there were."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        return len(pids)

    def kill_all(self, *, timeout_s: float = 10.0) -> None:
        """SIGKILL every process until the group is empty (forks racing the kill are caught by the loop)."""
        deadline = time.monotonic() + timeout_s
        while self.signal_all(signal.SIGKILL):
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes in cgroup {self.relative} survive SIGKILL: {self.pids()}")
            time.sleep(0.02)

    def remove(self) -> None:
        """Kill what is left and remove the group from every controller. Idempotent."""
        self.kill_all()
        for controller in CONTROLLERS:
            _rmdir_retrying(self.dir(controller))


def _rmdir_retrying(path: Path) -> None:
    # A just-killed process can keep the group busy for a moment after it left cgroup.procs.
    for _ in range(100):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as error:
            if error.errno != errno.EBUSY:
                raise
            time.sleep(0.02)
    path.rmdir()


def remove_tree(relative: Path) -> None:
    """Kill every process below ``relative`` and remove its groups, deepest first, in every controller."""
    for controller in CONTROLLERS:
        top = ROOT / controller / relative
        if not top.is_dir():
            continue
        for directory in sorted(_subdirs(top), key=lambda p: len(p.parts), reverse=True):
            group = Cgroup(directory.relative_to(ROOT / controller))
            group.kill_all()
            _rmdir_retrying(directory)


def _subdirs(top: Path) -> Iterable[Path]:
    yield top
    for dirpath, dirnames, _ in os.walk(top):
        for name in dirnames:
            yield Path(dirpath) / name


def remove_bed_tree(bed_id: int) -> None:
    remove_tree(bed_path(bed_id))


def bed_ids_with_groups() -> list[int]:
    """Beds that have a tree under ``trainop/`` in any controller."""
    ids: set[int] = set()
    for controller in CONTROLLERS:
        parent = ROOT / controller / "trainop"
        if parent.is_dir():
            ids.update(int(p.name[1:]) for p in parent.iterdir() if p.is_dir() and p.name[1:].isdigit())
    return sorted(ids)
