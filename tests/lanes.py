"""``make test`` as two pytest processes at once: the tiers that wait run beside the tiers that compute.

One pytest process is single-threaded: the unit and chart tiers (about 1,200 tests, ~11 minutes on the
2-core dev box) keep one core busy and leave the other idle, and the control-plane tier spends most of its
time waiting on watches. So ``make test`` runs two *lanes* of the same suite side by side:

- ``cluster``: ``-m "controlplane or ray or e2e"`` (control plane, node agent, Ray, e2e), in the
  foreground, printed as it runs;
- ``unit``: ``-m "not controlplane and not ray and not e2e"`` (unit, chart, monitoring), at a lower CPU
  priority (``nice``; ``TRAINOP_LANE_NICE``, default 10) so the cluster lane's timing-sensitive scenarios
  keep the cores when both want them.

Not three: the e2e tier in a lane of its own, beside the Ray tiers, was tried on 2026-11-29 (docs/
reliability.md, "CI"): both cores stayed 100 % busy from the first minute and two e2e scenarios timed out
waiting 420 s for a Ray cluster. The suite is CPU-bound on two cores; more lanes only add contention.

The background lane's output goes to ``out/test-lane-unit.log``; every ``PROGRESS_EVERY_S`` seconds the
runner prints its last line while it runs (so a run cut short still shows where it was), and the whole log
when it ends. A SIGTERM or Ctrl-C stops both lanes and prints the background log's tail.

The two marker expressions are complements: every collected test runs in exactly one lane. Each lane
writes its own tier summary; the merged summary (outcomes added up; a test counts as deselected only if
*every* lane deselected it) goes to ``$TRAINOP_TIER_SUMMARY``, and under ``CI=true`` the same gate as a
single run (``tests/tier_gate.check``) judges it: a tier that ran in neither lane, a skip outside the
allow-list or a failure in either lane makes the run red.

``TRAINOP_TEST_LANES=1`` (``make test TEST_LANES=1``) or a ``-m`` in the arguments runs one plain pytest.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests import tier_gate

NICE_ENV = "TRAINOP_LANE_NICE"
LANES_ENV = "TRAINOP_TEST_LANES"
DEFAULT_SUMMARY = Path("out/test-tiers.json")
#: pytest's status for "no tests collected": a lane that the arguments' paths left empty.
NO_TESTS = 5


#: Seconds between the runner's progress lines about the background lanes.
PROGRESS_EVERY_S = 300.0
#: Lines of a background lane's log printed when the run is stopped before it ended.
TAIL_LINES = 60


@dataclasses.dataclass(frozen=True)
class Lane:
    name: str
    marker: str
    background: bool


LANES = (
    Lane("cluster", "controlplane or ray or e2e", background=False),
    Lane("unit", "not controlplane and not ray and not e2e", background=True),
)


def merge(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """One summary for the whole run from the lanes' summaries (same format as a single run's)."""
    tiers: dict[str, dict[str, int]] = {}
    for summary in summaries:
        for tier, counts in summary["tiers"].items():
            merged = tiers.setdefault(tier, {})
            for outcome, n in counts.items():
                if outcome != "deselected":
                    merged[outcome] = merged.get(outcome, 0) + n
    # Deselected in every lane = deselected by the caller's own -k/paths, not by the lane split.
    per_lane = [{d["nodeid"]: d for d in summary["deselected"]} for summary in summaries]
    common = set(per_lane[0]).intersection(*per_lane[1:]) if per_lane else set()
    deselected = [per_lane[0][nodeid] for nodeid in sorted(common)]
    for item in deselected:
        counts = tiers.setdefault(item["tier"], {})
        counts["deselected"] = counts.get("deselected", 0) + 1
    statuses = [summary["exitstatus"] for summary in summaries]
    ran = any(sum(c.get("passed", 0) + c.get("failed", 0) for c in s["tiers"].values()) for s in summaries)
    failing = [s for s in statuses if s not in (0, NO_TESTS)] or ([] if ran else [NO_TESTS])
    return {
        "version": tier_gate.SUMMARY_VERSION,
        "ci": tier_gate.in_ci(),
        "args": [arg for summary in summaries for arg in summary["args"]],
        "started": min(summary["started"] for summary in summaries),
        "finished": max(summary["finished"] for summary in summaries),
        "exitstatus": failing[0] if failing else 0,
        "tiers": tiers,
        "skipped": [skip for summary in summaries for skip in summary["skipped"]],
        "deselected": deselected,
        "lanes": {
            lane.name: {"exitstatus": s["exitstatus"], "seconds": round(s["finished"] - s["started"], 1)}
            for lane, s in zip(LANES, summaries, strict=True)
        },
    }


def _lane_summary_path(summary: Path, lane: Lane) -> Path:
    return summary.with_name(f"{summary.stem}.lane-{lane.name}{summary.suffix}")


def _single(args: list[str]) -> int:
    return subprocess.call([sys.executable, "-m", "pytest", *args])


def _tail(log: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last ``lines`` non-empty lines of a lane's log, read from the file's end (at most 64 KiB)."""
    with log.open("rb") as handle:
        handle.seek(max(0, handle.seek(0, os.SEEK_END) - 65536))
        text = handle.read().decode(errors="replace")
    return [line for line in text.splitlines() if line.strip()][-lines:]


def _last_line(log: Path) -> str:
    """A running lane's progress: the last non-empty line of its log."""
    try:
        tail = _tail(log, 1)
    except OSError:
        return "(no log yet)"
    return tail[0] if tail else "(no output yet)"


def _stop(processes: dict[str, subprocess.Popen[bytes]], logs: dict[str, Path], why: str) -> None:
    """Stop every lane still running (SIGINT to its process group: pytest finishes its fixtures), then
    print what the background lanes had written last."""
    print(f"\nlanes: {why}: stopping every lane", flush=True)
    for process in processes.values():
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
    for process in processes.values():
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    for name, log in logs.items():
        try:
            tail = "\n".join(_tail(log))
        except OSError as error:
            tail = f"(log not readable: {error})"
        print(f"\n{'=' * 30} lane {name}, last {TAIL_LINES} lines: {log} {'=' * 30}\n{tail}", flush=True)


def _wait(
    processes: dict[str, subprocess.Popen[bytes]], logs: dict[str, Path], started: float
) -> dict[str, int]:
    """Every lane's exit status; prints each background lane's log when it ends and, every
    ``PROGRESS_EVERY_S``, a line per background lane still running."""
    statuses: dict[str, int] = {}
    next_progress = time.monotonic() + PROGRESS_EVERY_S
    while len(statuses) < len(processes):
        for name, process in processes.items():
            if name in statuses or process.poll() is None:
                continue
            statuses[name] = process.returncode
            if name in logs:
                print(f"\n{'=' * 30} lane {name} (exit status {statuses[name]}): {logs[name]} {'=' * 30}")
                sys.stdout.write(logs[name].read_text(errors="replace"))
                sys.stdout.flush()
        if time.monotonic() >= next_progress:
            next_progress += PROGRESS_EVERY_S
            elapsed = time.monotonic() - started
            for name, log in logs.items():
                if name not in statuses:
                    print(
                        f"\n[lanes {elapsed:.0f} s] lane {name} runs; its last line: {_last_line(log)}",
                        flush=True,
                    )
        time.sleep(1.0)
    return statuses


def run(args: list[str]) -> int:
    """Every lane at once; returns the exit status ``make test`` should have."""
    if os.environ.get(LANES_ENV, "2") == "1" or any(a.startswith("-m") for a in args):
        return _single(args)
    summary_path = Path(os.environ.get(tier_gate.SUMMARY_ENV) or DEFAULT_SUMMARY)
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    nice = int(os.environ.get(NICE_ENV, "10"))
    started = time.monotonic()
    processes: dict[str, subprocess.Popen[bytes]] = {}
    logs: dict[str, Path] = {}

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    # Before the lanes start: a runner started with SIGINT ignored (a background job of a non-interactive
    # shell) would pass the ignore on to the pytest processes, and the SIGINT that stops them would not.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous_term = signal.signal(signal.SIGTERM, on_term)
    for lane in LANES:
        lane_summary = _lane_summary_path(summary_path, lane)
        lane_summary.unlink(missing_ok=True)
        env = {**os.environ, tier_gate.LANE_ENV: lane.name, tier_gate.SUMMARY_ENV: str(lane_summary)}
        command = [sys.executable, "-m", "pytest", "-m", lane.marker, *args]
        if lane.background:
            command = ["nice", "-n", str(nice), *command]
            logs[lane.name] = summary_path.parent / f"test-lane-{lane.name}.log"
            out = logs[lane.name].open("wb")
            processes[lane.name] = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
            out.close()
            print(
                f"lane {lane.name} (-m '{lane.marker}', nice {nice}) runs beside this one: {logs[lane.name]}"
            )
        else:
            processes[lane.name] = subprocess.Popen(command, env=env, start_new_session=True)

    try:
        statuses = _wait(processes, logs, started)
    except KeyboardInterrupt as stopped:
        _stop(processes, logs, f"interrupted ({stopped or 'Ctrl-C'})")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)
    print(f"\nlanes: {statuses}, {time.monotonic() - started:.0f} s in all")

    summaries: list[dict[str, Any]] = []
    for lane in LANES:
        path = _lane_summary_path(summary_path, lane)
        if not path.is_file():
            print(
                f"lanes: lane {lane.name} wrote no tier summary ({path}): it did not run to the end",
                file=sys.stderr,
            )
            summary_path.unlink(missing_ok=True)
            return statuses[lane.name] or 1
        summaries.append(json.loads(path.read_text()))
    merged = merge(summaries)
    summary_path.write_text(json.dumps(merged, indent=1) + "\n")
    print("\n".join(["tests per tier, every lane:", *tier_gate.table(merged)]))
    status = int(merged["exitstatus"])
    if tier_gate.in_ci():
        problems = tier_gate.check({**merged, "exitstatus": 0})
        for problem in problems:
            print(f"CI tier gate: {problem}", file=sys.stderr)
        if problems and status == 0:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
