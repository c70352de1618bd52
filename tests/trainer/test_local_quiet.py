"""`make demo`, as a user first runs it (issues #22 and #14): the README's demo command trains the example
manifest on a local Ray, survives the worker it kills on purpose, ends with the status the CR would carry,
and prints trainop's own lines only: no warning or error a user would have to learn to ignore (Ray's
token-authentication notice, Ray's INFO start-up line, the error-level line of Ray Train's preemption
watcher, Ray's C++ warnings, the raylet's "A worker died" paragraph when the injected failure kills a
worker)."""

from __future__ import annotations

import pathlib
import re
import shlex
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Ray's Python log lines ("2026-11-26 11:41:11,554\tWARNING file.py:85 -- ..."), its C++ ones
# ("[2026-11-26 11:44:13,036 W 11028 11028] ..."), forwarded worker output ("(raylet) ...",
# "(TrainController pid=1) ..."), and Python's own.
NOISE = re.compile(
    r"\t(DEBUG|INFO|WARNING|ERROR)\s|^\[[0-9-]+ [0-9:,]+ [DIWEF] |^\x1b\[\d+m\(|^\(|Traceback|Warning:"
)
# The beginnings of trainop's own lines: its notes, the progress line, the worker-group lines, the status.
OWN_LINES = ("trainop: ", "step ", "status:", "  ", "worker group ")


def demo_arguments() -> list[str]:
    """The arguments of `trainop run` in the Makefile's demo recipe: the test runs what `make demo` runs."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^demo:.*\n\t(.+)$", makefile, re.MULTILINE)
    assert recipe, "the Makefile has no demo target"
    words = shlex.split(recipe.group(1))
    assert words[0].endswith("/trainop") and words[1] == "run", words
    return words[2:]


@pytest.mark.ray
@pytest.mark.slow
def test_the_demo_recovers_from_its_injected_failure_prints_the_final_status_and_no_warning_or_error_line(
    tmp_path: pathlib.Path,
) -> None:
    arguments = demo_arguments()
    assert "--inject-failure-at-step" in arguments, arguments  # the demo shows a recovery
    manifest = ROOT / arguments[0]
    name = yaml.safe_load(manifest.read_text())["metadata"]["name"]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainop",
            "run",
            str(manifest),
            *arguments[1:],
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
    assert all(line.startswith(OWN_LINES) for line in lines), "\n".join(
        line for line in lines if not line.startswith(OWN_LINES)
    )
    text = "\n".join(lines)
    assert "a worker will be killed once" in text
    failed = [line for line in lines if line.startswith("worker group failed")]
    assert (
        len(failed) == 1
        and "restarting it from the newest checkpoint (restart 1 of this attempt" in failed[0]
    ), failed
    restarted = [line for line in lines if line.startswith("worker group restarted")]
    assert len(restarted) == 1 and re.fullmatch(
        r"worker group restarted \(restart 1 of this run\): resumed from checkpoint step \d+", restarted[0]
    ), restarted
    assert f"trainop: TrainingJob {name} completed; status:" in lines
    # The status is the end of stdout (the trainer's own lines about the worker group are on stderr).
    status = yaml.safe_load(result.stdout[result.stdout.index("\nstatus:\n") + 1 :])["status"]
    max_steps = yaml.safe_load(manifest.read_text())["spec"]["hyperparameters"]["maxSteps"]
    assert status["phase"] == "Succeeded"
    assert (status["progress"]["step"], status["progress"]["workerRestarts"]) == (max_steps, 1)
    assert status["checkpoint"]["step"] == max_steps
    assert status["checkpoint"]["path"] == str(
        tmp_path / "state" / name / "checkpoints" / f"step_{max_steps}"
    )
    assert (status["workers"], status["gpus"]) == (2, 0)
    assert (tmp_path / "state" / name / "trainer.json").is_file()


def test_the_noise_pattern_matches_the_lines_it_is_meant_to_catch() -> None:
    """The assertion above could pass by matching nothing: these are lines Ray printed before the fixes."""
    seen = [
        "2026-11-26 11:24:35,519\tWARNING authentication_token_setup.py:85 -- Token authentication is on",
        "2026-11-26 11:24:47,931\tINFO worker.py:2038 -- Started a local Ray instance.",
        "[2026-11-26 11:44:13,036 W 11028 11028] gcs_client.cc:210: Failed to get cluster ID from GCS",
        "\x1b[36m(TrainController pid=8068)\x1b[0m [2026-11-26 11:43:22,157 E 8068 8126] core_worker.cc:2465 "
        "Actor with class name: 'PreemptionWatcher' ... has constructor arguments in the object store",
        "\x1b[33m(raylet)\x1b[0m A worker died or was killed while executing a task by an unexpected system "
        "error. To troubleshoot the problem, check the logs for the dead worker.",
    ]
    assert all(NOISE.search(line) for line in seen)
    assert not NOISE.search("trainop: note: Ray starts with 6 logical CPUs for 2 worker(s) on 2 core(s)")


def test_the_demo_arguments_are_read_from_the_makefile() -> None:
    arguments = demo_arguments()
    assert arguments[0] == "examples/cpu-mlp.yaml" and "--fresh" in arguments, arguments
