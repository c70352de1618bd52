"""The machine's CPU time by kind of process while a command runs: where a test tier's CPU goes.

    .venv/bin/python bench/ci_cost/cpu_by_process.py OUT.json -- \
        .venv/bin/python -m pytest e2e/test_trainingjob.py

Every ``--every`` seconds (default 2) it reads utime + stime of every process in ``/proc`` and charges the
growth since the last look to the process's kind, taken from its command line at that look (Ray workers
rename themselves ``ray::<Actor>.<method>``, so a worker's time goes to what it is doing). A process born
and gone between two looks is not seen, and the time a process spends between its last look and its exit
is lost: short-lived processes are under-counted (the total is compared with the machine's busy time at
the end). Writes ``{"command", "wall_s", "busy_cpu_s", "cpu_s": {kind: seconds}, "examples": {kind:
command line}}`` and prints the kinds, costliest first.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")
PYTHONS = ("python", "python3", "python3.11")
# Substrings of a command line and the kind they name, first match wins (after the Ray and Python rules).
KINDS = [
    ("gcs_server", "ray gcs_server"),
    ("/raylet/raylet", "ray raylet"),
    ("kube-apiserver", "kube-apiserver"),
    ("/etcd", "etcd"),
    ("kube-scheduler", "kube-scheduler"),
    ("kube-proxy", "kube-proxy"),
    ("kube-controller-manager", "kube-controller-manager"),
    ("coredns", "coredns"),
    ("ray-operator", "kuberay"),
    ("versitygw", "versitygw"),
    ("kubectl", "kubectl"),
    ("helm", "helm"),
]


def kind_of(argv: list[str]) -> str:
    if not argv:
        return "[kernel threads]"
    line = " ".join(argv)
    if line.startswith("ray::"):
        return "ray::" + line[5:].split()[0][:48]
    if "default_worker.py" in line:
        return "ray worker (starting)"
    for needle, kind in KINDS:
        if needle in line:
            return kind
    exe = os.path.basename(argv[0])
    if exe in PYTHONS and len(argv) > 2 and argv[1] in ("-m", "-u", "-c", "-B", "-I"):
        target = os.path.basename(argv[2]) if argv[1] in ("-m", "-u") else argv[2][:40]
        return f"python {argv[1]} {target[:60]}"
    if exe in PYTHONS and len(argv) > 1:
        script = os.path.basename(argv[1])
        return f"python {script} {argv[2][:20] if script == 'ray' and len(argv) > 2 else ''}".strip()
    return exe


def argv_of(pid: int) -> list[str] | None:
    try:
        raw = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def ticks_of(pid: int) -> tuple[int, int] | None:
    """(start time, utime + stime) in clock ticks."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19]), int(fields[11]) + int(fields[12])


def busy_ticks() -> int:
    values = [int(v) for v in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(values) - values[3] - values[4]  # all but idle and iowait


def _split(argv: list[str]) -> tuple[list[str], str, list[str]]:
    """This script's arguments, and the command after ``--``."""
    if "--" not in argv:
        return argv, "", []
    at = argv.index("--")
    return argv[:at], "--", argv[at + 1 :]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--every", type=float, default=2.0)
    own, _, command = _split(sys.argv[1:])
    args = parser.parse_args(own)
    if not command:
        parser.error("give the command to measure after --")

    seen: dict[int, tuple[int, int]] = {}  # pid -> (start time, ticks charged so far)
    charged: collections.Counter[str] = collections.Counter()
    examples: dict[str, str] = {}

    def look(first: bool) -> None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            ticks = ticks_of(pid)
            argv = argv_of(pid)
            if ticks is None or argv is None:
                continue
            start, used = ticks
            kind = kind_of(argv)
            examples.setdefault(kind, " ".join(argv)[:300])
            before = seen.get(pid)
            # A process already there at the first look: what it ran before is not the command's cost.
            new = before is None or before[0] != start
            base = (used if first else 0) if new else before[1]
            charged[kind] += used - base
            seen[pid] = (start, used)

    look(first=True)
    busy0, started = busy_ticks(), time.monotonic()
    child = subprocess.Popen(command)
    while child.poll() is None:
        time.sleep(args.every)
        look(first=False)
    look(first=False)
    wall = time.monotonic() - started
    busy = (busy_ticks() - busy0) / HZ
    cpu = {kind: ticks / HZ for kind, ticks in charged.most_common() if ticks > 0}
    args.out.write_text(
        json.dumps(
            {
                "command": command,
                "exit": child.returncode,
                "wall_s": round(wall, 1),
                "busy_cpu_s": round(busy, 1),
                "cpu_s": cpu,
                "examples": {kind: examples[kind] for kind in cpu},
            },
            indent=1,
        )
    )
    total = sum(cpu.values())
    print(f"{wall:.0f} s, machine busy {busy:.0f} CPU-s, in the processes seen {total:.0f}", file=sys.stderr)
    for kind, seconds in list(cpu.items())[:30]:
        print(f"{seconds:8.1f}  {100 * seconds / total:5.1f} %  {kind}", file=sys.stderr)
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
