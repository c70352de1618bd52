"""Where a bed's CPU goes: the node agent's per-container CPU log, read back and summed by role.

The agent appends one JSON line per finished container run (``instances.account`` through :func:`append`:
the CPU time of every process its cgroup ever held, from ``cpuacct.usage``). :func:`read` loads that log
once the agent stopped;
:func:`by_role` sums it by what the pod is (a Ray head or worker, a KubeRay submitter Job, the operator,
CoreDNS, ...) and container, for the e2e tier's summary (e2e/conftest.py) and docs/benchmarks.md.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
from collections.abc import Iterable
from pathlib import Path

#: The log's name in the agent's state directory (``context.AgentSettings.cpu_log``).
LOG_NAME = "container-cpu.jsonl"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    namespace: str
    pod: str
    labels: dict[str, str]
    container: str
    cpu_s: float
    wall_s: float

    @property
    def role(self) -> str:
        """What the pod is, from the labels its owner gives it."""
        node_type = self.labels.get("ray.io/node-type")
        if node_type:
            return f"ray {node_type}"
        if "batch.kubernetes.io/job-name" in self.labels or "job-name" in self.labels:
            return "job"
        return self.labels.get("app.kubernetes.io/name") or self.labels.get("app") or self.pod


_APPEND_LOCK = threading.Lock()  # the agent's pod workers are threads of one process


def append(path: Path, run: Run) -> None:
    line = json.dumps(dataclasses.asdict(run))
    with _APPEND_LOCK, path.open("a") as out:
        out.write(line + "\n")


def read(path: Path) -> list[Run]:
    """The runs logged at ``path``; none when no container ended (or the kernel keeps no CPU counter)."""
    if not path.is_file():
        return []
    return [Run(**json.loads(line)) for line in path.read_text().splitlines()]


@dataclasses.dataclass(frozen=True)
class Row:
    role: str
    container: str
    runs: int
    cpu_s: float
    wall_s: float


def by_role(runs: Iterable[Run]) -> list[Row]:
    """CPU seconds, run count and wall seconds per (role, container), the costliest first."""
    cpu: dict[tuple[str, str], float] = collections.defaultdict(float)
    wall: dict[tuple[str, str], float] = collections.defaultdict(float)
    count: dict[tuple[str, str], int] = collections.defaultdict(int)
    for run in runs:
        key = (run.role, run.container)
        cpu[key] += run.cpu_s
        wall[key] += run.wall_s
        count[key] += 1
    ranked = sorted(cpu.items(), key=lambda item: -item[1])
    return [
        Row(role, container, count[(role, container)], seconds, wall[(role, container)])
        for (role, container), seconds in ranked
    ]


def render(runs: list[Run]) -> str:
    rows = by_role(runs)
    total = sum(row.cpu_s for row in rows)
    lines = [f"container CPU, all pods of the bed: {total:,.0f} CPU-s in {len(runs)} container runs"]
    for row in rows:
        lines.append(
            f"  {row.cpu_s:8.1f} CPU-s {_share(row.cpu_s, total)}  {row.runs:4d} runs {row.wall_s:9.0f} s  "
            f"{row.role} / {row.container}"
        )
    per_namespace: dict[str, float] = collections.defaultdict(float)
    for run in runs:
        per_namespace[run.namespace] += run.cpu_s
    lines.append("by namespace:")
    lines.extend(
        f"  {seconds:8.1f} CPU-s {_share(seconds, total)}  {namespace}"
        for namespace, seconds in sorted(per_namespace.items(), key=lambda item: -item[1])
    )
    return "\n".join(lines)


def _share(part: float, total: float) -> str:
    return f"{part / total * 100 if total else 0.0:5.1f} %"
