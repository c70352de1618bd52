"""The head's log follower (``python -m trainop_trainer.logtail``): the job driver's log file, which holds
every rank's lines, reaches the follower's stdout, i.e. the pods' log subresource (``kubectl logs -c
trainer-log``). Real files, a real process, a real SIGTERM."""

from __future__ import annotations

import io
import pathlib
import signal
import subprocess
import sys
import time

from trainop_trainer import logtail

LOGS = "session_latest/logs"


def driver_log(root: pathlib.Path, job: str = "01000000") -> pathlib.Path:
    path = root / LOGS / f"job-driver-{job}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def test_complete_lines_are_printed_once_and_a_partial_line_waits_for_its_end(tmp_path: pathlib.Path) -> None:
    out = io.StringIO()
    follower = logtail.Follower(tmp_path, logtail.DEFAULT_PATTERN, out)
    log = driver_log(tmp_path)
    log.write_text("(RayTrainWorker pid=7) 2026-11-26 rank0 trainop_trainer INFO: step 10\npartial")
    assert follower.poll_once() == 1
    with log.open("a") as file:
        file.write(" line\nnext\n")
    assert follower.poll_once() == 2
    assert follower.poll_once() == 0
    assert out.getvalue().splitlines() == [
        "(RayTrainWorker pid=7) 2026-11-26 rank0 trainop_trainer INFO: step 10",
        "partial line",
        "next",
    ]


def test_a_driver_log_that_appears_later_and_one_that_is_truncated_are_followed(
    tmp_path: pathlib.Path,
) -> None:
    out = io.StringIO()
    follower = logtail.Follower(tmp_path, logtail.DEFAULT_PATTERN, out)
    assert follower.poll_once() == 0  # no Ray session yet
    first = driver_log(tmp_path, "a")
    first.write_text("one\ntwo\n")
    follower.poll_once()
    first.write_text("three\n")  # truncated (rotated) and written again: read from its start
    second = driver_log(tmp_path, "b")
    second.write_text("other\n")
    follower.poll_once()
    assert out.getvalue().splitlines() == ["one", "two", "three", "other"]


def test_other_files_of_the_ray_log_dir_are_not_printed(tmp_path: pathlib.Path) -> None:
    out = io.StringIO()
    driver_log(tmp_path).write_text("driver\n")
    (tmp_path / LOGS / "raylet.out").write_text("raylet noise\n")
    logtail.Follower(tmp_path, logtail.DEFAULT_PATTERN, out).poll_once()
    assert out.getvalue() == "driver\n"


def test_the_follower_process_streams_the_log_and_ends_on_sigterm_with_the_rest_printed(
    tmp_path: pathlib.Path,
) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "trainop_trainer.logtail", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        log = driver_log(tmp_path)
        log.write_text("rank1 trainop_trainer INFO: resumed from step 200\n")
        assert process.stdout is not None
        assert process.stdout.readline() == "rank1 trainop_trainer INFO: resumed from step 200\n"
        with log.open("a") as file:
            file.write("last words without a newline")
        time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert out == "last words without a newline\n"
