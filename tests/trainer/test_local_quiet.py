"""Quiet by default (issue #22): a normal `trainop run` of the demo prints trainop's own lines only, no
warning or error a user would have to learn to ignore (Ray's token-authentication notice, Ray's INFO
start-up line, the error-level line of Ray Train's preemption watcher, Ray's C++ warnings)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Ray's Python log lines ("2026-11-26 11:41:11,554\tWARNING file.py:85 -- ..."), its C++ ones
# ("[2026-11-26 11:44:13,036 W 11028 11028] ..."), forwarded worker output ("(raylet) ...",
# "(TrainController pid=1) ..."), and Python's own.
NOISE = re.compile(
    r"\t(DEBUG|INFO|WARNING|ERROR)\s|^\[[0-9-]+ [0-9:,]+ [DIWEF] |^\x1b\[\d+m\(|^\(|Traceback|Warning:"
)


@pytest.mark.ray
@pytest.mark.slow
def test_a_normal_run_of_the_demo_prints_no_warning_or_error_line(tmp_path: pathlib.Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainop",
            "run",
            str(ROOT / "examples" / "cpu-mlp.yaml"),
            "--fresh",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    lines = (result.stdout + result.stderr).splitlines()
    assert result.returncode == 0, "\n".join(lines[-40:])
    assert [line for line in lines if NOISE.search(line)] == []
    assert "trainop: TrainingJob cpu-mlp completed; status:" in lines
    assert all(line.startswith(("trainop: ", "step ", "status:", "  ")) for line in lines), "\n".join(
        line for line in lines if not line.startswith(("trainop: ", "step ", "status:", "  "))
    )


def test_the_noise_pattern_matches_the_lines_it_is_meant_to_catch() -> None:
    """The assertion above could pass by matching nothing: these are lines Ray printed before the fix."""
    seen = [
        "2026-11-26 11:24:35,519\tWARNING authentication_token_setup.py:85 -- Token authentication is on",
        "2026-11-26 11:24:47,931\tINFO worker.py:2038 -- Started a local Ray instance.",
        "[2026-11-26 11:44:13,036 W 11028 11028] gcs_client.cc:210: Failed to get cluster ID from GCS",
        "\x1b[36m(TrainController pid=8068)\x1b[0m [2026-11-26 11:43:22,157 E 8068 8126] core_worker.cc:2465 "
        "Actor with class name: 'PreemptionWatcher' ... has constructor arguments in the object store",
        "\x1b[33m(raylet)\x1b[0m A worker died or was killed while executing a task by an unexpected error.",
    ]
    assert all(NOISE.search(line) for line in seen)
    assert not NOISE.search("trainop: note: Ray starts with 6 logical CPUs for 2 worker(s) on 2 core(s)")
