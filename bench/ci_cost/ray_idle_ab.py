"""What an idle Ray head costs in CPU, and what Ray's own settings change: two heads at once, A with Ray's
defaults and B with the given environment, on their own ports and temp dirs, measured over the same window
(so that a shared box's changing speed hits both alike). Each daemon's CPU is read from /proc (utime +
stime), its head from the AB_TAG variable it inherited.

    .venv/bin/python bench/ci_cost/ray_idle_ab.py 60 RAY_LOG_MONITOR_MANY_FILES_THRESHOLD=0

prints, per daemon and head, the CPU-seconds used in the window (after 20 s of settling), then both heads'
CPU-seconds per minute and B/A. Stops both heads at the end (and on Ctrl+C).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import cpu_by_process  # this directory's: run as a script, bench/ci_cost is on sys.path

HZ = os.sysconf("SC_CLK_TCK")
RAY = str(Path(sys.executable).with_name("ray"))


def snapshot() -> dict[str, tuple[str, str, float]]:
    """pid -> (head, kind of process, CPU-seconds) of every process that carries AB_TAG or descends from one
    that does (the dashboard's module processes come from a fork server that does not pass the variable on).
    The command line, its kind and the CPU ticks are read as ``cpu_by_process`` reads them."""
    seen: dict[str, tuple[str | None, str, str, float]] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue
        argv, ticks = cpu_by_process.argv_of(int(pid)), cpu_by_process.ticks_of(int(pid))
        if argv is None or ticks is None:
            continue
        tag = next((e[len(b"AB_TAG=") :].decode() for e in env if e.startswith(b"AB_TAG=")), None)
        seen[pid] = (tag, parent, cpu_by_process.kind_of(argv), ticks[1] / HZ)

    def head(pid: str, depth: int = 0) -> str | None:
        if pid not in seen or depth > 20:
            return None
        tag, parent, _, _ = seen[pid]
        return tag if tag is not None else head(parent, depth + 1)

    found: dict[str, tuple[str, str, float]] = {}
    for pid, (_, _, kind, cpu) in seen.items():
        tag = head(pid)
        if tag is not None:
            found[pid] = (tag, kind, cpu)
    return found


def start(tag: str, offset: int, extra: dict[str, str]) -> None:
    env = dict(os.environ, AB_TAG=tag, RAY_USAGE_STATS_ENABLED="0", **extra)
    ports = {
        "port": 6379, "dashboard-port": 8265, "ray-client-server-port": 10001, "node-manager-port": 7000,
        "object-manager-port": 7001, "dashboard-agent-listen-port": 52365, "dashboard-agent-grpc-port": 52400,
        "runtime-env-agent-port": 52500, "metrics-export-port": 8080,
    }  # fmt: skip
    flags = [f"--{name}={port + offset * 20}" for name, port in ports.items()]
    subprocess.run(
        [RAY, "start", "--head", "--num-cpus=0", "--disable-usage-stats", *flags,
         f"--min-worker-port={20000 + offset * 1000}", f"--max-worker-port={20999 + offset * 1000}",
         f"--temp-dir=/tmp/ray-idle-ab-{tag}"],
        env=env, check=True, capture_output=True,
    )  # fmt: skip


def main() -> None:
    window = float(sys.argv[1])
    extra = dict(item.split("=", 1) for item in sys.argv[2:])
    try:
        start("A", 0, {})
        start("B", 1, extra)
        time.sleep(20)
        before = snapshot()
        time.sleep(window)
        after = snapshot()
    finally:
        for signal_number in (15, 9):  # both heads' processes, found as they were measured
            for pid in snapshot():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal_number)
            time.sleep(1)
    totals = {"A": 0.0, "B": 0.0}
    rows: dict[tuple[str, str], float] = {}
    for pid, (tag, kind, cpu) in after.items():
        used = cpu - before.get(pid, (tag, kind, 0.0))[2]
        totals[tag] += used
        rows[(kind, tag)] = rows.get((kind, tag), 0.0) + used
    for (name, tag), used in sorted(rows.items()):
        if used >= 0.05:
            print(f"{tag} {used:6.2f}  {name}")
    a, b = totals["A"] * 60 / window, totals["B"] * 60 / window
    print(f"CPU-s per minute: A {a:.2f}  B {b:.2f}  B/A {b / max(a, 1e-9):.2f}  B's environment: {extra}")


if __name__ == "__main__":
    main()
