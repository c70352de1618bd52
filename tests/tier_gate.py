"""What CI accepts of a test run: every tier ran, nothing was deselected, nothing skipped but GPU-only tests.

A run of ``make test`` writes a per-tier summary (``tests/tiers.py``, the pytest plugin, to the file named
by ``$TRAINOP_TIER_SUMMARY`` or ``--tier-summary``). This module judges such a summary; it is used twice:

- by the plugin itself when ``CI`` is set (``CI=true``): a run that the gate refuses exits non-zero even
  though every test that ran passed;
- by ``.ci/run`` after pytest, as ``python -m tests.tier_gate out/test-tiers.json``: a summary that is
  missing (the plugin was not loaded, pytest never got that far) or stale is a failure too, so CI cannot
  be green on a run that did not report itself.

The only skips CI accepts are tests marked ``gpu`` (they need a CUDA device, which CI runners do not
have; docs/reliability.md lists them). A skip for any other reason, an ``xfail``, a deselected test or a
tier with no passed test makes the run red, naming what did not run and why.

``missing_tool`` is the same policy at the point where a test finds a tool absent: locally it skips with
the reason and the command that installs the tool; under ``CI`` it fails with the same sentence.

This module must stay importable without pytest plugins, torch or Ray: ``.ci/run`` runs it on its own.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

#: The tiers every CI run must exercise (tests/tiers.py assigns each test to one of them).
REQUIRED_TIERS = ("unit", "controlplane", "nodeagent", "ray", "e2e", "chart", "monitoring")
#: Tests carrying this marker may skip in CI, and only they (they need a CUDA GPU).
ALLOWED_SKIP_MARKER = "gpu"
SUMMARY_ENV = "TRAINOP_TIER_SUMMARY"
#: Set by tests/lanes.py in each of ``make test``'s pytest processes (the lane's name): the plugin then
#: leaves the gate to the lanes runner, which judges the merged summary.
LANE_ENV = "TRAINOP_TIER_LANE"
SUMMARY_VERSION = 1


def in_ci() -> bool:
    """True under CI (``CI=true``, as GitHub Actions, GitLab and .ci/run set it)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing_tool(tool: str, how_to_install: str) -> NoReturn:
    """A test cannot run because ``tool`` is absent: skip locally, fail under CI, naming the fix."""
    import pytest

    message = f"{tool} unavailable: {how_to_install}"
    if in_ci():
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)


def check(summary: dict[str, Any]) -> list[str]:
    """Every reason the run described by ``summary`` must not count as green; empty when it may."""
    if summary.get("version") != SUMMARY_VERSION:
        return [f"summary version {summary.get('version')!r}, expected {SUMMARY_VERSION}: rerun make test"]
    problems: list[str] = []
    tiers: dict[str, dict[str, int]] = summary["tiers"]
    for tier in REQUIRED_TIERS:
        counts = tiers.get(tier, {})
        if counts.get("passed", 0) == 0:
            problems.append(
                f"tier {tier}: no test passed ({_counts_text(counts) or 'none collected'}): "
                "it did not run, which CI does not accept"
            )
    for tier, counts in sorted(tiers.items()):
        if counts.get("deselected", 0):
            problems.append(
                f"tier {tier}: {counts['deselected']} test(s) deselected: CI runs every test "
                "(no -m/-k, and no tier may switch itself off)"
            )
        if counts.get("failed", 0) or counts.get("error", 0):
            problems.append(f"tier {tier}: {counts.get('failed', 0)} failed, {counts.get('error', 0)} errors")
        if counts.get("xfailed", 0) or counts.get("xpassed", 0):
            problems.append(
                f"tier {tier}: {counts.get('xfailed', 0)} xfailed, {counts.get('xpassed', 0)} xpassed: "
                "a known failure is a failing test in CI; fix it or remove the claim"
            )
    for skip in summary.get("skipped", []):
        if not skip.get("allowed"):
            problems.append(f"skipped outside the allow-list: {skip['nodeid']}: {skip['reason']}")
    if summary.get("exitstatus") not in (0, None):
        problems.append(f"pytest exited with status {summary['exitstatus']}")
    return problems


def _counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {what}" for what, n in counts.items() if n)


def table(summary: dict[str, Any]) -> list[str]:
    """The per-tier counts as aligned lines, required tiers first."""
    tiers: dict[str, dict[str, int]] = summary["tiers"]
    names = [*REQUIRED_TIERS, *sorted(set(tiers) - set(REQUIRED_TIERS))]
    columns = ("passed", "failed", "error", "skipped", "xfailed", "deselected")
    lines = [f"{'tier':<14}" + "".join(f"{c:>11}" for c in columns)]
    for name in names:
        counts = tiers.get(name, {})
        lines.append(f"{name:<14}" + "".join(f"{counts.get(c, 0):>11}" for c in columns))
    return lines


def main(argv: list[str]) -> int:
    """``python -m tests.tier_gate SUMMARY.json``: print the per-tier table; exit 1 unless CI may be green."""
    if len(argv) != 1:
        print("usage: python -m tests.tier_gate SUMMARY.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    if not path.is_file():
        print(
            f"tier gate: no test summary at {path}: pytest did not run to the end, or the tiers plugin "
            "(tests/tiers.py, registered in conftest.py) was not loaded",
            file=sys.stderr,
        )
        return 1
    summary = json.loads(path.read_text())
    print("\n".join(table(summary)))
    problems = check(summary)
    for problem in problems:
        print(f"tier gate: {problem}", file=sys.stderr)
    if problems:
        print(f"tier gate: refused ({len(problems)} problem(s)); see {path}", file=sys.stderr)
        return 1
    print(f"tier gate: every tier ran; nothing skipped outside the allow-list ({path})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
