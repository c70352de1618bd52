"""CI cannot be green on a partial run: the tiers plugin (tests/tiers.py) and its gate (tests/tier_gate.py)
judged on real inner pytest runs (pytester, a subprocess each) of small test trees laid out like ours."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests import tier_gate

ROOT = Path(__file__).resolve().parents[2]

# One passing test per tier, placed where tests/tiers.py looks (directory or marker).
EVERY_TIER = {
    "tests/unit/test_u.py": "def test_u():\n    pass\n",
    "tests/chart/test_c.py": "def test_c():\n    pass\n",
    "tests/monitoring/test_m.py": "def test_m():\n    pass\n",
    "e2e/test_e.py": "def test_e():\n    pass\n",
    "tests/x/test_r.py": "import pytest\n\n@pytest.mark.ray\ndef test_r():\n    pass\n",
    "tests/x/test_p.py": "import pytest\n\n@pytest.mark.controlplane\ndef test_p():\n    pass\n",
    "tests/x/test_n.py": "import pytest\n\n@pytest.mark.nodeagent\ndef test_n():\n    pass\n",
}
INI = "[pytest]\nmarkers =\n    ray: r\n    controlplane: c\n    nodeagent: n\n    e2e: e\n"


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv(tier_gate.SUMMARY_ENV, raising=False)
    # An inner run is a whole run, judged by its own gate, also when this run is one of make test's lanes.
    monkeypatch.delenv(tier_gate.LANE_ENV, raising=False)
    pytester.makefile(".ini", pytest=INI)
    return pytester


def _tree(pytester: pytest.Pytester, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = pytester.path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _run(pytester: pytest.Pytester, *args: str, ci: bool) -> tuple[pytest.RunResult, dict[str, Any]]:
    summary = pytester.path / "summary.json"
    with pytest.MonkeyPatch.context() as patch:  # the inner pytest inherits this process's environment
        if ci:
            patch.setenv("CI", "true")
        result = pytester.runpytest_subprocess(
            "-p", "tests.tiers", "-p", "no:cacheprovider", f"--tier-summary={summary}", *args
        )
    return result, json.loads(summary.read_text())


def test_under_ci_a_run_of_every_tier_with_nothing_skipped_is_green(inner: pytest.Pytester) -> None:
    _tree(inner, EVERY_TIER)
    result, summary = _run(inner, ci=True)
    assert result.ret == 0, result.stdout.str()
    assert tier_gate.check(summary) == []
    assert {tier: counts.get("passed") for tier, counts in summary["tiers"].items()} == dict.fromkeys(
        tier_gate.REQUIRED_TIERS, 1
    )
    result.stdout.fnmatch_lines(["*tests per tier*", "unit * 1 *"])


def test_under_ci_a_tier_that_did_not_run_fails_the_run_naming_the_tier(inner: pytest.Pytester) -> None:
    _tree(inner, {k: v for k, v in EVERY_TIER.items() if not k.startswith("tests/monitoring")})
    result, summary = _run(inner, ci=True)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*CI tier gate: refused*", "tier monitoring: no test passed*"])
    assert summary["exitstatus"] == pytest.ExitCode.TESTS_FAILED


def test_under_ci_a_skip_outside_the_gpu_allow_list_fails_naming_test_and_reason(
    inner: pytest.Pytester,
) -> None:
    skipping = "import pytest\n\ndef test_needs_helm():\n    pytest.skip('helm unavailable')\n"
    _tree(inner, {**EVERY_TIER, "tests/chart/test_skip.py": skipping})
    result, summary = _run(inner, ci=True)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["*skipped outside the allow-list: tests/chart/test_skip.py::test_needs_helm*"]
    )
    assert summary["skipped"] == [
        {
            "nodeid": "tests/chart/test_skip.py::test_needs_helm",
            "tier": "chart",
            "reason": "helm unavailable",
            "allowed": False,
        }
    ]


def test_the_same_skip_outside_ci_passes_and_is_listed_loudly_at_the_end(inner: pytest.Pytester) -> None:
    skipping = "import pytest\n\ndef test_needs_helm():\n    pytest.skip('helm unavailable')\n"
    _tree(inner, {**EVERY_TIER, "tests/chart/test_skip.py": skipping})
    result, _ = _run(inner, ci=False)
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        ["*NOT RUN*", "SKIPPED tests/chart/test_skip.py::test_needs_helm: helm unavailable"]
    )


def test_under_ci_a_gpu_marked_test_is_the_one_skip_allowed(inner: pytest.Pytester) -> None:
    gpu = "import pytest\n\n@pytest.mark.gpu\ndef test_on_cuda():\n    pytest.skip('needs a CUDA GPU')\n"
    _tree(inner, {**EVERY_TIER, "tests/x/test_gpu.py": gpu})
    result, summary = _run(inner, ci=True)
    assert result.ret == 0, result.stdout.str()
    assert [s["allowed"] for s in summary["skipped"]] == [True]


def test_under_ci_deselecting_tests_fails_the_run(inner: pytest.Pytester) -> None:
    _tree(inner, {**EVERY_TIER, "tests/unit/test_more.py": "def test_other():\n    pass\n"})
    result, summary = _run(inner, "-k", "not other", ci=True)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["tier unit: 1 test(s) deselected*"])
    assert summary["deselected"] == [{"nodeid": "tests/unit/test_more.py::test_other", "tier": "unit"}]


def test_a_hung_test_fails_alone_with_every_threads_stack_and_the_run_goes_on(inner: pytest.Pytester) -> None:
    hung = (
        "import threading, pytest\n\n"
        "@pytest.mark.timeout(2)\n"
        "def test_deadlocked():\n"
        "    threading.Thread(target=threading.Event().wait, name='stuck-helper', daemon=True).start()\n"
        "    lock = threading.Lock()\n"
        "    lock.acquire()\n"
        "    lock.acquire()\n\n"
        "def test_next():\n"
        "    pass\n"
    )
    _tree(inner, {"tests/unit/test_hang.py": hung})
    result, summary = _run(inner, ci=False)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*Timeout (>2.0s) from pytest-timeout*", "*Stack of stuck-helper*"])
    assert summary["tiers"]["unit"] == {"failed": 1, "passed": 1}


def test_every_collected_test_gets_its_tiers_timeout(inner: pytest.Pytester) -> None:
    probe = (
        "import pytest\n\n"
        "@pytest.mark.ray\n"
        "def test_r(request):\n"
        "    assert request.node.get_closest_marker('timeout').args == (1200,)\n\n"
        "def test_u(request):\n"
        "    assert request.node.get_closest_marker('timeout').args == (300,)\n"
    )
    _tree(inner, {"tests/x/test_probe.py": probe})
    result, _ = _run(inner, ci=False)
    assert result.ret == 0, result.stdout.str()


def test_the_checker_refuses_a_run_that_wrote_no_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tier_gate.main([str(tmp_path / "absent.json")]) == 1
    assert "no test summary" in capsys.readouterr().err


def test_the_checker_refuses_xfails_and_failures_and_accepts_a_complete_run(tmp_path: Path) -> None:
    complete: dict[str, Any] = {
        "version": tier_gate.SUMMARY_VERSION,
        "exitstatus": 0,
        "tiers": {tier: {"passed": 3} for tier in tier_gate.REQUIRED_TIERS},
        "skipped": [],
    }
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(complete))
    assert tier_gate.main([str(path)]) == 0
    xfailed = {**complete, "tiers": {**complete["tiers"], "ray": {"passed": 3, "xfailed": 1}}}
    assert tier_gate.check(xfailed) == [
        "tier ray: 1 xfailed, 0 xpassed: a known failure is a failing test in CI; fix it or remove the claim"
    ]
    failed = {**complete, "exitstatus": 1, "tiers": {**complete["tiers"], "e2e": {"passed": 1, "failed": 1}}}
    assert tier_gate.check(failed) == ["tier e2e: 1 failed, 0 errors", "pytest exited with status 1"]
