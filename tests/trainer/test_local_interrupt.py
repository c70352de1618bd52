"""Ctrl+C on `trainop run` (local mode): the workers checkpoint and stop, the CLI prints the status and how
to resume, and exits 130; Ctrl+C again stops at once. Before 2026-11-29 Ray Train's fit() replaced the
driver's SIGINT handler with its own abort: Ctrl+C ended the run with exit code 1, no checkpoint of its own
and nothing printed (``ray_train.fit_beside_driver_handler``).

The unit tests run the signal handler in a child interpreter (pytest keeps its own SIGINT handler); the
Ray test runs the CLI in a session of its own and signals its process group, as a terminal's Ctrl+C does.

One stand-in: ``FIT_CHILD`` hands ``ray_train.fit_beside_driver_handler`` a ``Trainer`` of its own in place
of Ray Train's TorchTrainer (the function calls nothing but ``fit()``), whose ``fit()`` sends the process a
SIGINT, waits for the handler to see it, then returns or raises. It shows on which thread ``fit()`` ran and
that an exception comes back to the caller's thread, which a real fit() could show only at the cost of a
Ray start and a worker group, and could not make raise on demand. The real TorchTrainer under Ctrl+C is
the last test's (``-m "ray and slow"``).
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest
import trainer_support
import yaml
from test_local_quiet import NOISE, ROOT

from trainop_trainer import local

HANDLER_CHILD = """
import os, pathlib, signal, sys, time
from trainop_trainer import preempt
stop_file = pathlib.Path(sys.argv[1])
preempt.install_driver_handler(stop_file, grace_s=60)
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.1)
print("first", preempt.requested(), preempt.signalled_with(), stop_file.is_file(), flush=True)
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(1)
    print("second: no KeyboardInterrupt", flush=True)
except KeyboardInterrupt:
    print("second: KeyboardInterrupt", flush=True)
"""

ENDED_CHILD = """
import os, pathlib, signal, sys, time
from trainop_trainer import preempt
preempt.install_driver_handler(pathlib.Path(sys.argv[1]), grace_s=0.5)
os.kill(os.getpid(), signal.SIGINT)  # the Ctrl+C that stopped the run
time.sleep(0.1)
preempt.run_ended()  # the workers stopped, fit() returned: the status is being printed
try:
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl+C again, while the status prints
    time.sleep(1.5)  # past the first signal's grace period: its exit timer was cancelled
    print("status printed, exit code", 128 + preempt.signalled_with(), flush=True)
except KeyboardInterrupt:
    print("KeyboardInterrupt while printing the status", flush=True)
"""

FIT_CHILD = """
import os, pathlib, signal, sys, threading, time
from trainop_trainer import preempt, ray_train

class Trainer:  # a stand-in for Ray Train's TorchTrainer: only fit() is called (the module's docstring)
    def __init__(self, fail):
        self.fail = fail
    def fit(self):
        self.thread = threading.current_thread().name
        os.kill(os.getpid(), signal.SIGINT)  # what a Ctrl+C does while fit() runs
        deadline = time.monotonic() + 5
        while not preempt.requested() and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.fail:
            raise ValueError("fit failed")
        return "fitted"

plain = Trainer(fail=False)
plain.fit = lambda: threading.current_thread().name
print("without the handler:", ray_train.fit_beside_driver_handler(plain), flush=True)
preempt.install_driver_handler(pathlib.Path(sys.argv[1]), grace_s=60)
trainer = Trainer(fail=False)
result = ray_train.fit_beside_driver_handler(trainer)
print("result:", result, trainer.thread, preempt.requested(), flush=True)
preempt.reset()
try:
    ray_train.fit_beside_driver_handler(Trainer(fail=True))
except ValueError as exc:
    print("raised on", threading.current_thread().name, exc, flush=True)
"""


def _child(code: str, tmp_path: pathlib.Path) -> list[str]:
    done = subprocess.run(
        [trainer_support.PYTHON, "-c", code, str(tmp_path / "stop-requested")],
        capture_output=True,
        text=True,
        timeout=60,
        env=trainer_support.subprocess_env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines() + done.stderr.splitlines()


def test_ctrl_c_asks_the_workers_to_checkpoint_and_stop_and_ctrl_c_again_stops_now(
    tmp_path: pathlib.Path,
) -> None:
    lines = _child(HANDLER_CHILD, tmp_path)
    assert f"first True {int(signal.SIGINT)} True" in lines, lines
    assert "second: KeyboardInterrupt" in lines, lines
    assert (
        "trainop: Ctrl+C (SIGINT): asking the workers to checkpoint and stop; Ctrl+C again stops now, "
        "without it"
    ) in lines, lines
    assert "trainop: Ctrl+C again: stopping now, without waiting for the checkpoint" in lines, lines


def test_a_ctrl_c_after_the_run_ended_neither_interrupts_the_status_nor_exits_early(
    tmp_path: pathlib.Path,
) -> None:
    lines = _child(ENDED_CHILD, tmp_path)
    assert "trainop: the run has already ended; finishing" in lines, lines
    assert f"status printed, exit code {128 + int(signal.SIGINT)}" in lines, lines
    assert not any("KeyboardInterrupt" in line or "did not stop within" in line for line in lines), lines


def test_fit_runs_beside_the_driver_handler_so_a_ctrl_c_during_fit_reaches_it(tmp_path: pathlib.Path) -> None:
    lines = _child(FIT_CHILD, tmp_path)
    # Without trainop's handler fit() stays on the calling thread (Ray Train's own Ctrl+C then applies).
    assert "without the handler: MainThread" in lines, lines
    assert "result: fitted trainop-fit True" in lines, lines
    assert "raised on MainThread fit failed" in lines, lines


def test_the_progress_line_shows_only_this_runs_progress(tmp_path: pathlib.Path) -> None:
    status_file = tmp_path / "status.json"
    out = io.StringIO()
    line = local.ProgressLine(status_file, tmp_path / "events.jsonl", out, since="2026-11-29T21:16:50Z")
    earlier = {"step": 961, "totalSteps": 20000, "percent": 4.8, "workerRestarts": 1}
    status_file.write_text(json.dumps({"progress": {**earlier, "updated": "2026-11-29T21:14:40Z"}}))
    line._render(final=True)
    assert out.getvalue() == ""  # neither the earlier run's step nor its worker-group restart
    status_file.write_text(
        json.dumps(
            {
                "progress": {
                    "step": 1000,
                    "totalSteps": 1200,
                    "percent": 83.3,
                    "updated": "2026-11-29T21:16:55Z",
                }
            }
        )
    )
    line._render(final=True)
    assert out.getvalue().startswith("step 1000/1200 ["), out.getvalue()


def test_a_stopped_run_says_what_stopped_it_where_and_how_to_resume(tmp_path: pathlib.Path) -> None:
    assert local.stopped_message(signal.SIGINT, 961) == (
        "stopped by Ctrl+C (SIGINT) after a checkpoint at step 961; run `trainop run` on the same manifest "
        "again (without --fresh) to resume from it"
    )
    assert local.stopped_message(signal.SIGTERM, None).startswith("stopped by SIGTERM after a checkpoint;")
    status_file = tmp_path / "status.json"
    assert local._checkpoint_step(status_file) is None
    status_file.write_text(json.dumps({"checkpoint": {"step": 961, "path": "x"}}))
    assert local._checkpoint_step(status_file) == 961


@pytest.mark.ray
@pytest.mark.slow
def test_ctrl_c_on_trainop_run_checkpoints_prints_the_suspended_status_and_exits_130(
    tmp_path: pathlib.Path,
) -> None:
    source = yaml.safe_load((ROOT / "examples" / "cpu-mlp.yaml").read_text())
    source["spec"]["hyperparameters"]["maxSteps"] = 1_000_000  # runs until the Ctrl+C
    manifest = tmp_path / "long.yaml"
    manifest.write_text(yaml.safe_dump(source))
    name = source["metadata"]["name"]
    run_dir = tmp_path / "state" / name
    cli = subprocess.Popen(
        [sys.executable, "-m", "trainop", "run", str(manifest), "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        start_new_session=True,  # its own process group: the signal goes to all of it, as from a terminal
    )
    try:
        deadline = time.monotonic() + 300
        seen: int | None = None
        while seen is None or seen < 100:
            assert time.monotonic() < deadline and cli.poll() is None, "no checkpoint at step >= 100"
            seen = local._checkpoint_step(run_dir / "status.json")
            time.sleep(0.2)
        os.killpg(cli.pid, signal.SIGINT)
        out, _ = cli.communicate(timeout=120)
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
            cli.wait()
    lines = out.splitlines()
    assert cli.returncode == 130, "\n".join(lines[-40:])
    assert [line for line in lines if NOISE.search(line)] == [], "\n".join(lines)
    assert (
        "trainop: Ctrl+C (SIGINT): asking the workers to checkpoint and stop; Ctrl+C again stops now, "
        "without it"
    ) in lines
    assert f"trainop: TrainingJob {name} stopped; status:" in lines, "\n".join(lines[-40:])
    status = yaml.safe_load(out[out.index("\nstatus:\n") + 1 :])["status"]
    stopped = status["checkpoint"]["step"]
    assert status["phase"] == "Suspended" and stopped >= seen, status
    assert status["conditions"][0]["message"] == local.stopped_message(signal.SIGINT, stopped), status
    assert status["checkpoint"]["path"] == str(run_dir / "checkpoints" / f"step_{stopped}")
    assert (run_dir / "checkpoints" / f"step_{stopped}").is_dir()
    assert re.search(rf"^step {stopped}/1000000 ", out, re.MULTILINE), out
