"""pytest plugin: which tier each test belongs to, its timeout, and what the run did per tier.

Registered from the root conftest. It owns:

- **tiers.** Every collected test gets exactly one tier, the first rule of ``TIERS`` that matches it
  (directory or marker): e2e, chart, monitoring, ray, controlplane, unit. The controlplane plugin's
  auto-marking (tests/controlplane/fixtures.py, ``tryfirst``) runs before this, so a test that reaches
  the control plane through a fixture counts as controlplane.
- **timeouts.** Each tier has a generous per-test limit (setup, call and teardown together), applied
  through pytest-timeout's ``timeout`` marker unless a test sets its own. pytest-timeout's signal method
  dumps the stack of every thread and fails that one test; the run goes on. As a backstop for a hang
  that never returns to the interpreter (a C call that ignores signals), faulthandler dumps every
  thread's stack and ends the process ``HARD_STOP_GRACE_S`` later: a red run with a stack, never a CI
  job that sits for 90 minutes saying nothing.
- **the summary.** Passed/failed/error/skipped/xfailed/deselected per tier, every skip with its reason,
  written as JSON to ``--tier-summary`` / ``$TRAINOP_TIER_SUMMARY`` and printed as a table at the end.
  Skips and deselections are repeated in one loud block, so a local ``make test`` that could not run a
  tier says so at the bottom, not once in the middle.
- **the cost.** Each test's wall time and the machine's CPU time while it ran (tests/cost.py), written
  beside the summary (``<summary>-cost.json``), the costliest printed at the end.
- **the gate under CI.** With ``CI=true`` the run fails unless ``tier_gate.check`` accepts the summary
  (every tier passed something; no deselection; no skip outside the ``gpu`` allow-list).

It must not skip or deselect anything itself, except ``gpu``-marked tests on a machine without CUDA.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import os
import sys
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

from tests import cost, tier_gate

#: Seconds between pytest-timeout's soft limit (fail one test) and faulthandler's hard stop (end the run).
HARD_STOP_GRACE_S = 120


@dataclasses.dataclass(frozen=True)
class Tier:
    name: str
    matches: Callable[[pytest.Item, str], bool]
    #: Per-test limit in seconds, setup + call + teardown; the first test of a tier also pays for its
    #: session fixtures (a control plane start, Ray start-up, helm install).
    timeout_s: int


def _under(*prefixes: str) -> Callable[[pytest.Item, str], bool]:
    return lambda item, path: path.startswith(prefixes)


def _marked(name: str) -> Callable[[pytest.Item, str], bool]:
    return lambda item, path: item.get_closest_marker(name) is not None


# First match wins. Timeouts are several times the slowest test of each tier on the 2-core dev box
# (docs/reliability.md, "Timeouts"), so only a hang reaches them.
TIERS: tuple[Tier, ...] = (
    Tier("e2e", lambda item, path: path.startswith("e2e/") or _marked("e2e")(item, path), 1800),
    Tier("chart", _under("tests/chart/"), 600),
    Tier("monitoring", _under("tests/monitoring/"), 300),
    Tier("ray", _marked("ray"), 1200),
    Tier("nodeagent", _marked("nodeagent"), 600),
    Tier("controlplane", _marked("controlplane"), 900),
    Tier("unit", lambda item, path: True, 300),
)
assert {t.name for t in TIERS} == set(tier_gate.REQUIRED_TIERS)


def tier_of(item: pytest.Item) -> Tier:
    path = Path(item.path).resolve()
    try:
        relative = path.relative_to(Path(item.config.rootpath).resolve()).as_posix()
    except ValueError:
        relative = path.as_posix()
    return next(tier for tier in TIERS if tier.matches(item, relative))


@dataclasses.dataclass
class _RunState:
    started: float
    tier_by_nodeid: dict[str, str] = dataclasses.field(default_factory=dict)
    allowed_skip: set[str] = dataclasses.field(default_factory=set)
    counts: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    skipped: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    deselected: list[dict[str, str]] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)
    costs: list[cost.Cost] = dataclasses.field(default_factory=list)

    def add(self, tier: str, outcome: str) -> None:
        self.counts.setdefault(tier, {}).setdefault(outcome, 0)
        self.counts[tier][outcome] += 1

    def summary(self, *, exitstatus: int, args: list[str]) -> dict[str, Any]:
        return {
            "version": tier_gate.SUMMARY_VERSION,
            "ci": tier_gate.in_ci(),
            "args": args,
            "started": self.started,
            "finished": time.time(),
            "exitstatus": exitstatus,
            "tiers": {tier.name: dict(self.counts.get(tier.name, {})) for tier in TIERS},
            "skipped": self.skipped,
            "deselected": self.deselected,
        }


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--tier-summary",
        default=None,
        metavar="PATH",
        help=f"write the per-tier summary as JSON to PATH (default: ${tier_gate.SUMMARY_ENV})",
    )


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.hasplugin("timeout"):
        raise pytest.UsageError(
            "pytest-timeout is not installed, and every test runs under a timeout: run `make venv` "
            "(or `.venv/bin/python -m pip install -e '.[dev]'`)"
        )
    config.addinivalue_line(
        "markers",
        f"{tier_gate.ALLOWED_SKIP_MARKER}: needs a CUDA GPU; skipped without one, the only skip CI accepts",
    )
    config.pluginmanager.register(_TierPlugin(config), "trainop-tiers")


def _no_gpu_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "needs a CUDA GPU (torch is not installed)"
    return None if torch.cuda.is_available() else "needs a CUDA GPU (torch.cuda.is_available() is False)"


class _TierPlugin:
    """The per-run state and the hooks that fill it (an object, so reports find the state)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.state = _RunState(started=time.time())
        # The hard stop writes to the terminal's stderr, not to the capture file of the hung test (which
        # nobody reads once the process is gone).
        capture = config.pluginmanager.get_plugin("capturemanager")
        if capture is not None:
            with capture.global_and_fixture_disabled():
                self.stderr_fd = os.dup(sys.stderr.fileno())
        else:
            self.stderr_fd = os.dup(sys.stderr.fileno())

    @pytest.hookimpl(trylast=True)  # after the controlplane auto-marking and every -m/-k deselection
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        gpu_items = [item for item in items if item.get_closest_marker(tier_gate.ALLOWED_SKIP_MARKER)]
        no_gpu_reason = _no_gpu_reason() if gpu_items else None
        for item in items:
            tier = tier_of(item)
            self.state.tier_by_nodeid[item.nodeid] = tier.name
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(tier.timeout_s))
            if item.get_closest_marker(tier_gate.ALLOWED_SKIP_MARKER) is not None:
                self.state.allowed_skip.add(item.nodeid)
                if no_gpu_reason:
                    item.add_marker(pytest.mark.skip(reason=no_gpu_reason))

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        for item in items:
            tier = tier_of(item).name
            self.state.add(tier, "deselected")
            self.state.deselected.append({"nodeid": item.nodeid, "tier": tier})

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, object, object]:
        marker = item.get_closest_marker("timeout")
        limit = float(marker.args[0]) if marker is not None and marker.args else 0.0
        if limit:
            # The backstop: if pytest-timeout's signal cannot interrupt the hang, dump and end the process.
            faulthandler.dump_traceback_later(limit + HARD_STOP_GRACE_S, exit=True, file=self.stderr_fd)
        started, busy = time.monotonic(), cost.machine_busy_s()
        try:
            return (yield)
        finally:
            if limit:
                faulthandler.cancel_dump_traceback_later()
            now = cost.machine_busy_s()
            self.state.costs.append(
                cost.Cost(
                    nodeid=item.nodeid,
                    tier=self.state.tier_by_nodeid.get(item.nodeid, "unit"),
                    wall_s=round(time.monotonic() - started, 3),
                    cpu_s=None if busy is None or now is None else round(now - busy, 2),
                )
            )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        tier = self.state.tier_by_nodeid.get(report.nodeid, "unit")
        if report.skipped:
            if hasattr(report, "wasxfail"):
                self.state.add(tier, "xfailed")
                return
            self.state.add(tier, "skipped")
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.state.skipped.append(
                {
                    "nodeid": report.nodeid,
                    "tier": tier,
                    "reason": reason.removeprefix("Skipped: "),
                    "allowed": report.nodeid in self.state.allowed_skip,
                }
            )
        elif report.failed:
            self.state.add(tier, "failed" if report.when == "call" else "error")
        elif report.when == "call":
            self.state.add(tier, "xpassed" if hasattr(report, "wasxfail") else "passed")

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.config.option.collectonly:
            return
        summary = self.state.summary(
            exitstatus=int(exitstatus), args=list(self.config.invocation_params.args)
        )
        if tier_gate.in_ci() and not os.environ.get(tier_gate.LANE_ENV):
            # Judge the run as if pytest had passed: the gate adds what pytest's own status cannot say.
            # One lane of ``make test`` (tests/lanes.py) is judged with the other, on the merged summary.
            self.state.problems = tier_gate.check({**summary, "exitstatus": 0})
            if self.state.problems and exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
                summary["exitstatus"] = int(session.exitstatus)
        destination = self.config.getoption("--tier-summary") or os.environ.get(tier_gate.SUMMARY_ENV)
        if destination:
            path = Path(destination)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(summary, indent=1) + "\n")
            cost.cost_path(path).write_text(json.dumps(cost.as_json(self.state.costs), indent=1) + "\n")

    def pytest_unconfigure(self) -> None:
        os.close(self.stderr_fd)

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int) -> None:
        if self.config.option.collectonly or not (self.state.tier_by_nodeid or self.state.deselected):
            return
        costs = cost.table(self.state.costs, lane=os.environ.get(tier_gate.LANE_ENV))
        if costs:
            terminalreporter.section("what the tests cost the machine (costliest first)")
            for line in costs:
                terminalreporter.write_line(line)
        terminalreporter.section("tests per tier")
        for line in tier_gate.table(self.state.summary(exitstatus=exitstatus, args=[])):
            terminalreporter.write_line(line)
        not_run = [skip for skip in self.state.skipped if not skip["allowed"]]
        by_tier: dict[str, int] = {}
        for item in self.state.deselected:
            by_tier[item["tier"]] = by_tier.get(item["tier"], 0) + 1
        lane = os.environ.get(tier_gate.LANE_ENV)
        if lane and by_tier:
            # make test's lane split (tests/lanes.py): the merged table at its end counts what no lane ran.
            terminalreporter.write_line(
                f"lane {lane} left to the other lane: "
                + ", ".join(f"{count} {tier}" for tier, count in sorted(by_tier.items()))
            )
            by_tier = {}
        if not_run or by_tier:
            terminalreporter.section("NOT RUN", yellow=True, bold=True)
            for skip in not_run:
                terminalreporter.write_line(f"SKIPPED {skip['nodeid']}: {skip['reason']}", yellow=True)
            for tier, count in sorted(by_tier.items()):
                terminalreporter.write_line(f"DESELECTED {count} test(s) of tier {tier}", yellow=True)
        if self.state.problems:
            terminalreporter.section("CI tier gate: refused", red=True, bold=True)
            for problem in self.state.problems:
                terminalreporter.write_line(problem, red=True)
