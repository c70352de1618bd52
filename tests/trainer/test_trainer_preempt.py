"""The pod's preStop helper signals the registered training processes and waits for them to finish."""

from __future__ import annotations

import pathlib
import subprocess
import time

import trainer_support

CHILD = """
import os, signal, sys, time
def stop(signum, frame):
    open(sys.argv[2], "w").write("checkpointed")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(120)
"""


def test_prestop_helper_sigterms_registered_trainers_and_waits_until_they_exit(
    tmp_path: pathlib.Path,
) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    marker = tmp_path / "done"
    child = subprocess.Popen(
        [trainer_support.PYTHON, "-c", CHILD, str(pid_dir / "job-rank0.pid"), str(marker)]
    )
    try:
        deadline = time.monotonic() + 30
        while not (pid_dir / "job-rank0.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        done = subprocess.run(
            [trainer_support.PYTHON, "-m", "trainop_trainer.preempt", "--timeout", "30"],
            capture_output=True,
            text=True,
            timeout=60,
            env=trainer_support.subprocess_env(TRAINOP_PID_DIR=str(pid_dir)),
        )
        assert done.returncode == 0, done.stderr
        assert "still running" not in done.stderr  # it saw the process exit instead of timing out
        assert child.wait(timeout=5) == 0
        assert marker.read_text() == "checkpointed"
    finally:
        if child.poll() is None:
            child.kill()
