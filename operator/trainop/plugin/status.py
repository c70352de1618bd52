"""``kubectl trainop status NAME``: one screen that says where a job is. Pure: the object in, text out.

What a user asks first, in that order: the phase and why (the condition that explains it), the attempt and
restarts, progress (step, percent, loss, throughput, time left, and how fresh that is), the newest
checkpoint, the network measured at start-up, the sweep's trials and best trial, the conditions that are
not as they should be, and the last failures.
"""

from __future__ import annotations

import datetime
from typing import Any

from trainop.controller import conditions
from trainop.plugin import target as target_module

MAX_FAILURES_SHOWN = 3
# The condition whose message explains each phase.
_EXPLAINS = {
    "Running": "Running",
    "Suspended": "Suspended",
    "Succeeded": "Complete",
    "Failed": "Failed",
}


def screen(target: target_module.Target, *, now: datetime.datetime) -> str:
    status = target.status
    spec = target.body.get("spec") or {}
    lines = [f"{target.describe()}: {target.phase}"]
    why = _explanation(status)
    if why:
        lines.append(f"  {why}")
    attempt = f"attempt {target.attempt}" if target.attempt else "no attempt yet"
    restarts = int(status.get("restarts") or 0)
    lines.append(f"  {attempt}, {restarts} restart{'s' if restarts != 1 else ''}{_ages(status, now)}")
    if status.get("nextRestartTime"):
        lines.append(
            f"  next attempt at {status['nextRestartTime']} ({_since(status['nextRestartTime'], now)})"
        )
    if target.kind.reports_workers:
        lines.extend(_job_lines(spec, status, now))
    else:
        lines.extend(_sweep_lines(spec, status))
    # Conditions whose reason the operator counts as a problem a user can act on (it posts a Warning for
    # them): an image that cannot be pulled, a quota, a missing claim, an invalid spec.
    problems = [c for c in status.get("conditions") or [] if c.get("reason") in conditions.PROBLEM_REASONS]
    for condition in problems:
        reason, message = condition.get("reason"), _one_line(condition.get("message", ""))
        lines.append(f"  ! {condition['type']} {condition['status']} ({reason}): {message}")
    failures = list(status.get("failures") or [])
    if failures:
        lines.append(f"  failures ({len(failures)}, newest last):")
        for failure in failures[-MAX_FAILURES_SHOWN:]:
            lines.append(
                f"    attempt {failure.get('attempt')} at {failure.get('time')}: {failure.get('reason')}: "
                f"{_one_line(failure.get('message') or '')}"
            )
    return "\n".join(lines)


def _job_lines(spec: dict[str, Any], status: dict[str, Any], now: datetime.datetime) -> list[str]:
    workers = spec.get("workers") or {}
    gpus = int(workers.get("gpusPerWorker", 1))
    device = f"{gpus} GPU each" if gpus else "CPU"
    lines = [f"  workers   {workers.get('replicas', 1)} pods, {device}"]
    progress = status.get("progress")
    if progress:
        step, total = progress.get("step", 0), progress.get("totalSteps")
        parts = [f"step {step}/{total or '?'}"]
        if progress.get("percent") is not None:
            parts[0] += f" ({progress['percent']:.1f}%)"
        if progress.get("loss") is not None:
            parts.append(f"loss {progress['loss']:.4g}")
        if progress.get("samplesPerSecond") is not None:
            parts.append(f"{progress['samplesPerSecond']:.0f} samples/s")
        if progress.get("etaSeconds") is not None and status.get("phase") == "Running":
            parts.append(f"{_duration(progress['etaSeconds'])} left")
        if progress.get("workerRestarts"):
            parts.append(f"{progress['workerRestarts']} worker restart(s) in this attempt")
        updated = f" (updated {_since(progress['updated'], now)})" if progress.get("updated") else ""
        lines.append(f"  progress  {', '.join(parts)}{updated}")
    else:
        lines.append("  progress  none reported yet")
    checkpoint = status.get("checkpoint")
    if checkpoint:
        lines.append(
            f"  checkpoint step {checkpoint.get('step')} ({_since(checkpoint.get('time'), now)}): "
            f"{checkpoint.get('path')}"
        )
    else:
        lines.append("  checkpoint none yet")
    network = status.get("network")
    if network:
        measured = network.get("allReduceBusBandwidthGBPerSecond")
        bandwidth = f", all-reduce {measured:g} GB/s" if measured is not None else ""
        ranks = f" over {network['worldSize']} ranks" if network.get("worldSize") else ""
        lines.append(
            f"  network   {network.get('profile')} ({network.get('backend') or '?'}){bandwidth}{ranks}"
        )
    return lines


def _sweep_lines(spec: dict[str, Any], status: dict[str, Any]) -> list[str]:
    trials = status.get("trials") or {}
    counts = ", ".join(
        f"{trials.get(key, 0)} {label}"
        for key, label in (
            ("running", "running"),
            ("pending", "pending"),
            ("succeeded", "succeeded"),
            ("earlyStopped", "early-stopped"),
            ("failed", "failed"),
        )
    )
    lines = [f"  trials    {trials.get('total', 0)} of {spec.get('numTrials', '?')}: {counts}"]
    best = status.get("bestTrial")
    if best:
        parameters = ", ".join(f"{k}={v}" for k, v in (best.get("parameters") or {}).items())
        lines.append(
            f"  best      trial {best.get('id')}: {best.get('metric')} {best.get('value'):.6g} ({parameters})"
        )
        if best.get("checkpoint"):
            lines.append(f"            checkpoint {best['checkpoint']}")
    return lines


def _explanation(status: dict[str, Any]) -> str:
    wanted = _EXPLAINS.get(str(status.get("phase")))
    for condition in status.get("conditions") or []:
        if condition.get("type") == wanted and condition.get("message"):
            return _one_line(condition["message"])
    return ""


def _ages(status: dict[str, Any], now: datetime.datetime) -> str:
    if status.get("completionTime"):
        return f", finished {_since(status['completionTime'], now)}"
    if status.get("startTime"):
        return f", started {_since(status['startTime'], now)}"
    return ""


def _since(stamp: str | None, now: datetime.datetime) -> str:
    if not stamp:
        return "time unknown"
    try:
        then = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return stamp
    seconds = (now - then).total_seconds()
    return f"{_duration(seconds)} ago" if seconds >= 0 else f"in {_duration(-seconds)}"


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())
