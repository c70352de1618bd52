"""Local mode's stop grace and bad environment values, with real processes and signals.

- `trainop run` waits ``TRAINOP_STOP_GRACE_S`` for its workers after SIGTERM/SIGINT, as docs/trainer.md
  says (it waited a fixed 60 s), and a stop forced when that runs out exits 128 + the signal's number: not a
  clean exit, so `trainop run x.yaml && next-step` stops there (a forced SIGTERM used to exit 0). The pod
  driver (``python -m trainop_trainer``) keeps exiting 0 then: SIGTERM is its pod's end, not an error.
- A bad ``TRAINOP_INJECT_FAILURE_AT_STEP``, ``TRAINOP_STOP_GRACE_S`` or ``TRAINOP_RAY_REPORT_MIN_INTERVAL_S``
  (or ``--inject-failure-at-step 0``) is one line naming the variable and exit code 2, before Ray starts (it
  was a traceback, or a worker's error that burnt restarts).

Stand-ins (the drivers' own code around them is real: ``trainop.cli.main`` and
``trainop_trainer.__main__.main`` as their commands run them, the real signal handler, timer and exit code):

- the grace tests' children replace ``ray_train.ensure_ray`` (a no-op) and ``ray_train.run`` (prints ``fit
  started``, then sleeps until the process ends): workers that never stop within the grace period. What
  is tested is the driver's side (the stop request written, the timer, the exit code), which does not
  depend on what the workers are; a real Ray run with an entrypoint that ignores the stop request would
  cost a Ray start and a worker group per case (three, tens of seconds each on 2 cores) for nothing more.
  The real run's checkpoint-and-stop on a signal is ``test_trainer_ray.py``'s (SIGTERM to the driver) and
  ``test_local_interrupt.py``'s (Ctrl+C on `trainop run`).
- the bad-value tests' children replace ``ray_train.ensure_ray`` with an exit of its own
  (``RAY_WOULD_START``): Ray starting at all is the failure those tests look for.
"""

from __future__ import annotations

import pathlib
import signal
import subprocess
import time

import pytest
import trainer_support
from test_local_quiet import ROOT

from trainop.api import trainer_config

MANIFEST = ROOT / "examples" / "cpu-mlp.yaml"
RAY_WOULD_START = 99

# `trainop run` (argv: trainop MANIFEST STATE_DIR) or the pod driver `python -m trainop_trainer` (argv:
# trainer CONFIG) with a training that never stops by itself: only the grace period's forced exit ends it.
STUCK_RUN_CHILD = """
import sys, time
from trainop_trainer import ray_train

def stuck_run(config, **kwargs):
    print("fit started", flush=True)
    while True:  # workers that never see the stop request
        time.sleep(0.1)

ray_train.ensure_ray = lambda **kwargs: None
ray_train.run = stuck_run
if sys.argv[1] == "trainop":
    from trainop import cli
    sys.exit(cli.main(["run", sys.argv[2], "--state-dir", sys.argv[3]]))
from trainop_trainer import __main__ as trainer_main
sys.exit(trainer_main.main(["--config", sys.argv[2]]))
"""

# `trainop run` / `python -m trainop_trainer` where starting Ray is a failure of the test.
NO_RAY_CHILD = f"""
import os, sys
from trainop_trainer import ray_train

def ensure_ray(**kwargs):
    print("ray would start", flush=True)
    os._exit({RAY_WOULD_START})

ray_train.ensure_ray = ensure_ray
if sys.argv[1] == "trainop":
    from trainop import cli
    sys.exit(cli.main(sys.argv[2:]))
from trainop_trainer import __main__ as trainer_main
sys.exit(trainer_main.main(sys.argv[2:]))
"""


def _signal_when_ready(
    argv: list[str], ready: str, signum: int, *, env: dict[str, str], timeout: float = 30
) -> tuple[int, str, float]:
    """Start ``argv``, send ``signum`` once it printed ``ready``; (exit code, its output, seconds after the
    signal)."""
    child = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    lines: list[str] = []
    try:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line.rstrip("\n"))
            if line.strip() == ready:
                break
        assert child.poll() is None, "\n".join(lines)
        signalled = time.monotonic()
        child.send_signal(signum)
        try:
            rest, _ = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            rest, _ = child.communicate()
            pytest.fail(f"still running {timeout:.0f}s after the signal:\n" + "\n".join([*lines, rest]))
        return child.returncode, "\n".join(lines) + "\n" + rest, time.monotonic() - signalled
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_trainop_run_waits_trainop_stop_grace_s_then_exits_128_plus_the_signal(
    tmp_path: pathlib.Path, signum: signal.Signals
) -> None:
    state = tmp_path / "state"
    code, out, waited = _signal_when_ready(
        [trainer_support.PYTHON, "-c", STUCK_RUN_CHILD, "trainop", str(MANIFEST), str(state)],
        "fit started",
        signum,
        env=trainer_support.subprocess_env(TRAINOP_STOP_GRACE_S="2"),
    )
    assert code == 128 + signum, out  # 143 / 130: `trainop run x.yaml && next-step` does not go on
    assert "trainop: workers did not stop within 2s; exiting" in out, out
    assert 1.5 <= waited < 20, (waited, out)
    assert (state / "cpu-mlp" / "trainop" / "stop-requested").is_file()  # what workers would see


def test_the_pod_driver_still_exits_0_when_its_workers_outlast_the_grace_after_sigterm(
    tmp_path: pathlib.Path,
) -> None:
    config = trainer_support.mlp_config(tmp_path / "storage", "stuck")
    config_file = tmp_path / "trainer.json"
    config_file.write_text(trainer_config.dumps(config))
    code, out, _ = _signal_when_ready(
        [trainer_support.PYTHON, "-c", STUCK_RUN_CHILD, "trainer", str(config_file)],
        "fit started",
        signal.SIGTERM,
        env=trainer_support.subprocess_env(TRAINOP_STOP_GRACE_S="2"),
    )
    assert code == 0, out  # the pod is going away: not an error (docs/trainer.md)
    assert "trainop: workers did not stop within 2s; exiting" in out, out  # TRAINOP_STOP_GRACE_S, read
    assert (tmp_path / "storage" / "stuck" / "trainop" / "stop-requested").is_file()  # what workers would see


def _no_ray(argv: list[str], **env: str) -> tuple[int, list[str]]:
    done = subprocess.run(
        [trainer_support.PYTHON, "-c", NO_RAY_CHILD, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=trainer_support.subprocess_env(**env),
    )
    return done.returncode, (done.stdout + done.stderr).splitlines()


@pytest.mark.parametrize(
    ("env", "flags", "line"),
    [
        (
            {"TRAINOP_INJECT_FAILURE_AT_STEP": "abc"},
            [],
            "trainop: error: TRAINOP_INJECT_FAILURE_AT_STEP must be a step number >= 1, got 'abc'",
        ),
        (
            {"TRAINOP_STOP_GRACE_S": "abc"},
            [],
            "trainop: error: TRAINOP_STOP_GRACE_S must be a number of seconds >= 0, got 'abc'",
        ),
        (
            {"TRAINOP_RAY_REPORT_MIN_INTERVAL_S": "ten"},
            [],
            "trainop: error: TRAINOP_RAY_REPORT_MIN_INTERVAL_S must be a number of seconds >= 0, got 'ten'",
        ),
        (
            {},
            ["--inject-failure-at-step", "0"],
            "trainop: error: --inject-failure-at-step must be a step number >= 1, got 0",
        ),
        (
            {},
            ["--inject-failure-at-step", "-3"],
            "trainop: error: --inject-failure-at-step must be a step number >= 1, got -3",
        ),
    ],
    ids=["inject-env", "stop-grace", "report-interval", "inject-flag-0", "inject-flag-negative"],
)
def test_trainop_run_refuses_a_bad_value_in_one_line_with_exit_2_before_ray_starts(
    tmp_path: pathlib.Path, env: dict[str, str], flags: list[str], line: str
) -> None:
    code, lines = _no_ray(
        ["trainop", "run", str(MANIFEST), "--state-dir", str(tmp_path / "state"), *flags], **env
    )
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith(line), lines
    assert "unset it" in lines[0] or "--inject-failure-at-step" in lines[0], lines  # and how to fix it


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TRAINOP_STOP_GRACE_S", "abc"),
        ("TRAINOP_STOP_GRACE_S", "-1"),
        ("TRAINOP_RAY_REPORT_MIN_INTERVAL_S", "nan"),
        ("TRAINOP_INJECT_FAILURE_AT_STEP", "1.5"),
    ],
)
def test_the_pod_driver_refuses_a_bad_value_in_one_line_with_exit_2_before_ray_starts(
    tmp_path: pathlib.Path, variable: str, value: str
) -> None:
    config = tmp_path / "trainer.json"
    config.write_text(trainer_config.dumps(trainer_support.mlp_config(tmp_path / "storage", "bad-env")))
    code, lines = _no_ray(["trainer", "--config", str(config)], **{variable: value})
    assert code == 2, lines
    errors = [line for line in lines if line.startswith("trainop: error:")]
    assert len(errors) == 1 and errors[0].startswith(f"trainop: error: {variable} must be "), lines
    assert f"got '{value}'" in errors[0] and "Traceback" not in "\n".join(lines), lines
