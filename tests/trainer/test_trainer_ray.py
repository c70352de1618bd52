"""The packaged trainer on real Ray Train V2 with 2 workers and real torch.distributed (gloo on CPU).

Each test drives a whole run: TorchTrainer, worker processes, checkpoints on disk, status records, the
metrics endpoints. Worker failures are real process deaths (``os._exit`` through the injection knob, or
SIGTERM sent to the worker's PID); nothing is mocked.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pathlib
import signal
import subprocess
import threading
import time
import urllib.request
from typing import Any

import pytest
import torch
import trainer_support

from trainop.api import trainer_config
from trainop_trainer import metrics, ray_train, switches

pytestmark = pytest.mark.ray

Params = dict[str, torch.Tensor]


def bitwise_equal(a: Params, b: Params) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# The exact-resume tests run once per strategy and storage, not for every pair (issue #14: each is a whole
# Ray Train run, ~100 CPU-seconds on 2 cores): here on a volume, a killed worker with DDP and a new attempt
# with FSDP2; test_trainer_s3.py has the other two on the bucket. Each strategy and each storage path is
# exercised by both kinds of interruption between the two files. The references (tests/trainer/conftest.py:
# uninterrupted) are computed once per session.


@pytest.mark.parametrize("uninterrupted", ["ddp"], indirect=True)
def test_a_killed_worker_is_restarted_by_ray_train_and_training_ends_bitwise_equal_to_an_uninterrupted_run(
    ray_cluster: str, uninterrupted: tuple[str, Params], tmp_path: pathlib.Path
) -> None:
    strategy, reference = uninterrupted
    config = trainer_support.exact_config(tmp_path, strategy)
    controllers = trainer_support.train_controllers()
    actors = {name: trainer_support.actors_started(name) for name in ("TrainController", "DatasetManager")}
    logs = trainer_support.train_controller_logs()
    # Rank 1 dies (os._exit) at step 25, five steps after checkpoint 20: those steps are trained twice.
    result = ray_train.run(config, inject_failure_at_step=25)

    assert (result.outcome, result.step) == ("completed", 60), result
    # trainop's failure policy restarted the worker group inside Ray Train's controller: one controller.
    assert trainer_support.train_controllers() - controllers == 1
    # The GCS's actor table agrees, and neither worker group started Ray Data's DatasetManager (a process
    # per group that Ray Train's own TorchTrainer starts even without datasets; lean_trainer.py).
    started = {name: trainer_support.actors_started(name) - before for name, before in actors.items()}
    assert started == {"TrainController": 1, "DatasetManager": 0}, started
    # Nor did its controller register resource requests with Ray Data's AutoscalingCoordinator (an actor
    # only a Ray autoscaler reads; lean_trainer.FixedSize): Ray's policy logs "Requesting resources" first.
    messages = trainer_support.controller_messages(logs)
    assert any("worker group" in message.lower() for message in messages), messages
    assert not [message for message in messages if "Requesting resources" in message], messages
    assert_restarted_once_as_unknown(config)
    assert bitwise_equal(trainer_support.final_model(config, 60), reference)


def assert_restarted_once_as_unknown(config: trainer_config.TrainerConfig) -> None:
    events = trainer_support.events(config)
    starts = [e for e in events if e["event"] == "start"]
    assert len(starts) == 2 and len({e["launch"] for e in starts}) == 1  # one launch, two worker groups
    assert [e["step"] for e in events if e["event"] == "resume"] == [20]
    status = trainer_support.status(config)
    assert status["progress"]["workerRestarts"] == 1
    # A process that died without a word: Unknown, restarted inside the attempt within its budget.
    [entry] = status["workerFailures"]["last"]
    assert (entry["reason"], entry["restarted"], entry["rank"]) == ("Unknown", True, 1), entry
    assert status["workerFailures"]["counts"] == {"Unknown": 1}


def test_with_restarts_in_the_driver_a_killed_worker_gets_a_new_controller_and_the_same_account(
    ray_cluster: str, tmp_path: pathlib.Path
) -> None:
    """The older path (``TRAINOP_SWITCHES=restarts=driver``, the recovery benchmark's baseline; also what
    runs when the failure policy did not decide): fit() fails, the driver classifies and runs it again."""
    config = trainer_support.exact_config(tmp_path, "ddp")
    controllers = trainer_support.train_controllers()
    switches.apply({"restarts": "driver"})
    try:
        result = ray_train.run(config, inject_failure_at_step=25)
    finally:
        switches.reset()
    assert (result.outcome, result.step) == ("completed", 60), result
    assert trainer_support.train_controllers() - controllers == 2
    assert_restarted_once_as_unknown(config)


@pytest.mark.parametrize("uninterrupted", ["fsdp"], indirect=True)
def test_a_new_attempt_with_the_same_run_name_and_storage_path_resumes_bitwise_exactly(
    ray_cluster: str, uninterrupted: tuple[str, Params], tmp_path: pathlib.Path
) -> None:
    strategy, reference = uninterrupted
    config = trainer_support.exact_config(tmp_path, strategy, max_worker_failures=0)
    first = ray_train.run(config, inject_failure_at_step=25)
    assert first.outcome == "failed", first
    assert 60 not in trainer_support.checkpoint_steps(config)

    second = ray_train.run(config.model_copy(update={"attempt": 2}))

    assert (second.outcome, second.step) == ("completed", 60), second
    starts = [e for e in trainer_support.events(config) if e["event"] == "start"]
    resumes = [e for e in trainer_support.events(config) if e["event"] == "resume"]
    assert [e["attempt"] for e in starts] == [1, 2]
    assert [(e["step"], e["launch"]) for e in resumes] == [(20, starts[1]["launch"])]
    assert bitwise_equal(trainer_support.final_model(config, 60), reference)


def _wait_for_step(config: trainer_config.TrainerConfig, step: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = int(trainer_support.status(config).get("progress", {}).get("step", 0))
        if seen >= step:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"training never reached step {step}")


def long_config(
    storage: pathlib.Path, name: str, *, max_steps: int, **overrides: Any
) -> trainer_config.TrainerConfig:
    """Slow enough steps to act in the middle of training; checkpoints only on request (1000-min interval)."""
    return trainer_support.mlp_config(
        storage,
        name,
        max_steps=max_steps,
        interval_steps=None,
        interval_minutes=1000,
        every_steps=5,
        num_samples=8192,
        batch_size=64,
        hidden_dim=256,
        **overrides,
    )


def test_sigterm_to_one_worker_checkpoints_ends_the_attempt_as_preempted_and_the_next_attempt_resumes(
    ray_cluster: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's SIGTERM means its pod is going away: never restarted inside the attempt (issue #17)."""
    pid_dir = tmp_path / "pids"
    monkeypatch.setenv("TRAINOP_PID_DIR", str(pid_dir))  # forwarded to the workers
    config = long_config(tmp_path, "sigterm-worker", max_steps=400)
    signalled: dict[str, int] = {}

    def preempt_rank1() -> None:
        signalled["step"] = _wait_for_step(config, 20, timeout_s=120)
        pid = int((pid_dir / "sigterm-worker-rank1.pid").read_text())
        signalled["pid"] = pid
        # Ray starts its workers at niceness 15; a training worker runs at 0 (switches niceness=training).
        signalled["niceness"] = os.getpriority(os.PRIO_PROCESS, pid)
        os.kill(pid, signal.SIGTERM)

    thread = threading.Thread(target=preempt_rank1)
    thread.start()
    first = ray_train.run(config)
    thread.join()

    assert first.outcome == "failed" and (first.error or "").startswith("Preempted"), first
    assert signalled["niceness"] == 0, signalled
    [entry] = trainer_support.status(config)["workerFailures"]["last"]
    assert (entry["reason"], entry["restarted"], entry["attempt"]) == ("Preempted", False, 1), entry
    second = ray_train.run(config.model_copy(update={"attempt": 2}))
    assert (second.outcome, second.step) == ("completed", 400), second
    resumes = [e["step"] for e in trainer_support.events(config) if e["event"] == "resume"]
    assert len(resumes) == 1 and signalled["step"] <= resumes[0] < 400, (resumes, signalled)


def test_sigterm_to_the_driver_checkpoints_at_or_after_the_signal_and_exits_0(
    ray_cluster: str, tmp_path: pathlib.Path
) -> None:
    config = long_config(tmp_path, "sigterm-driver", max_steps=10_000_000)
    path = trainer_support.write_config(config, tmp_path / "trainer.json")
    driver = subprocess.Popen(
        [trainer_support.PYTHON, "-m", "trainop_trainer", "--config", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=trainer_support.subprocess_env(RAY_ADDRESS=ray_cluster),
    )
    try:
        observed = _wait_for_step(config, 20, timeout_s=180)
        driver.send_signal(signal.SIGTERM)
        out, _ = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()

    assert driver.returncode == 0, out
    steps = trainer_support.checkpoint_steps(config)
    assert len(steps) == 1 and steps[0] >= observed, (steps, observed)
    assert trainer_support.status(config)["checkpoint"]["step"] == steps[0]
    assert "training stopped at step" in out


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        text: str = response.read().decode()
        return text


def _sample(text: str, name: str, rank: int, job: str) -> float | None:
    prefix = f'{name}{{job="{job}",rank="{rank}"}} '
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return None


def test_every_worker_serves_the_trainer_metrics_on_its_own_port_during_a_run(
    ray_cluster: str, tmp_path: pathlib.Path
) -> None:
    port = trainer_support.free_port_block(2)
    config = long_config(tmp_path, "metrics", max_steps=300, metrics_port=port, probe=True)
    scrapes: dict[int, str] = {}

    def scrape_while_training() -> None:
        _wait_for_step(config, 10, timeout_s=120)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(scrapes) < 2:
            for rank in (0, 1):
                try:
                    text = _scrape(port + rank)
                except OSError:
                    continue
                if (_sample(text, "trainop_trainer_step", rank, "metrics") or 0) > 0:
                    scrapes[rank] = text
            time.sleep(0.1)

    thread = threading.Thread(target=scrape_while_training)
    thread.start()
    result = ray_train.run(config)
    thread.join()

    assert result.outcome == "completed", result
    assert set(scrapes) == {0, 1}
    # The status carries GB/s rounded to 3 decimals; the metric carries the same probe result in bytes/s.
    gb_per_second = trainer_support.status(config)["network"]["allReduceBusBandwidthGBPerSecond"]
    assert gb_per_second > 0
    for rank, text in scrapes.items():
        for name in metrics.METRIC_NAMES:
            assert f"# TYPE {name} " in text, (rank, name)
        bandwidth = _sample(text, "trainop_trainer_allreduce_bus_bandwidth_bytes_per_second", rank, "metrics")
        assert bandwidth == pytest.approx(gb_per_second * 1e9, abs=0.0005e9), rank
        assert _sample(text, "trainop_trainer_worker_restarts", rank, "metrics") == 0
        assert f'trainop_trainer_step_seconds_count{{job="metrics",rank="{rank}"}}' in text


def test_a_user_entrypoint_trains_with_the_context_helpers(
    ray_cluster: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pythonpath = os.pathsep.join(
        p for p in (str(trainer_support.EXAMPLES_USER), os.environ.get("PYTHONPATH")) if p
    )
    monkeypatch.setenv("PYTHONPATH", pythonpath)  # forwarded to the workers
    monkeypatch.syspath_prepend(str(trainer_support.EXAMPLES_USER))  # the driver resolves it first
    config = trainer_support.mlp_config(
        tmp_path,
        "user-fn",
        max_steps=300,
        interval_steps=100,
        every_steps=50,
        workload={
            "entrypoint": "trainop_example.regression:train",
            "config": {"slope": 3.0, "bias": -1.0, "batchSize": 32},
        },
    )

    result = ray_train.run(config)

    assert (result.outcome, result.step) == ("completed", 300), result
    assert trainer_support.checkpoint_steps(config) == [100, 200, 300]
    state = trainer_support.user_state(config, 300)
    weight, bias = float(state["model"]["weight"]), float(state["model"]["bias"])
    assert weight == pytest.approx(3.0, abs=0.05) and bias == pytest.approx(-1.0, abs=0.05)
    progress = trainer_support.status(config)["progress"]
    assert (progress["step"], progress["totalSteps"], progress["percent"]) == (300, 300, 100.0)
    assert progress["loss"] < 0.01


def _user_entrypoints_on_path(monkeypatch: pytest.MonkeyPatch) -> str:
    """tests/trainer (faulty_entrypoint.py) on the driver's and the workers' path."""
    tests_dir = str(pathlib.Path(__file__).parent)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH")) if p)
    )
    monkeypatch.syspath_prepend(tests_dir)
    return tests_dir


def test_a_rank_frozen_with_sigstop_is_named_by_its_peers_watchdog_with_stacks_and_the_group_resumes(
    ray_cluster: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 is stopped (SIGSTOP) in the middle of training: it cannot speak, so rank 0's watchdog, stuck in
    a collective with it, must notice that rank 1's heartbeats stopped, dump its own stacks, and fail the
    group as Stalled naming rank 1; the driver restarts the group (Stalled budget left), which resumes from
    the newest checkpoint and completes."""
    pid_dir = tmp_path / "pids"
    monkeypatch.setenv("TRAINOP_PID_DIR", str(pid_dir))  # forwarded to the workers
    _user_entrypoints_on_path(monkeypatch)
    timeout_s = 10  # the API minimum (spec.failurePolicy.stallTimeoutSeconds >= 10)
    config = trainer_support.mlp_config(
        tmp_path,
        "stall",
        max_steps=60,
        interval_steps=10,
        every_steps=5,
        workload={"entrypoint": "faulty_entrypoint:train", "config": {"stepSeconds": 0.1}},
    )
    config = trainer_support.with_spec(
        config, failurePolicy={"maxWorkerFailures": 2, "stallTimeoutSeconds": timeout_s}
    )
    frozen: dict[str, float] = {}

    def freeze_rank1() -> None:
        frozen["step"] = _wait_for_step(config, 20, timeout_s=180)
        pid = int((pid_dir / "stall-rank1.pid").read_text())
        frozen["pid"] = pid
        frozen["at"] = time.time()
        os.kill(pid, signal.SIGSTOP)

    thread = threading.Thread(target=freeze_rank1)
    thread.start()
    controllers = trainer_support.train_controller_logs()
    try:
        result = ray_train.run(config)
    finally:
        thread.join()
        if "pid" in frozen:  # Ray kills the stopped worker when it ends the group; never leave one behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(frozen["pid"]), signal.SIGKILL)

    assert (result.outcome, result.step) == ("completed", 60), result
    status = trainer_support.status(config)
    [entry] = status["workerFailures"]["last"]
    assert (entry["reason"], entry["rank"], entry["restarted"], entry["attempt"]) == ("Stalled", 1, True, 1)
    assert entry["message"].startswith("rank 1 made no progress and went silent"), entry["message"]
    stacks = trainer_support.run_dir(config) / "stalls" / "attempt-1-try-0-rank-0.txt"
    assert entry["message"].endswith(f"stacks in {stacks}"), entry["message"]
    # Where rank 1 was: its last heartbeat (posted every 0.25 s; steps take 0.1 s), in the user's loop.
    assert f"at step {entry['step']}" in entry["message"] and entry["step"] >= frozen["step"] - 5, entry
    assert "faulty_entrypoint.py" in entry["message"] and "rank 0 waited" in entry["message"], entry
    text = stacks.read_text()
    assert text.startswith("rank 0 heartbeat: ") and "train_loop_per_worker" in text, text[:2000]
    # The watchdog spoke, not gloo's timeout (stallTimeoutSeconds + 60 s): detected at least the timeout after
    # the freeze (no early verdict) and before the process-group timeout.
    detected = datetime.datetime.strptime(entry["time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    waited = detected.timestamp() - frozen["at"]
    assert timeout_s - 1 <= waited < timeout_s + ray_train.PG_TIMEOUT_MARGIN_S, waited
    assert status["workerFailures"]["counts"] == {"Stalled": 1}
    resumes = [e["step"] for e in trainer_support.events(config) if e["event"] == "resume"]
    assert len(resumes) == 1 and resumes[0] >= 10 and resumes[0] % 10 == 0, resumes
    assert status["progress"]["workerRestarts"] == 1
    # The frozen rank cannot answer Ray Train's graceful shutdown (5 s of patience): in the controller,
    # trainop's policy decided, then its stopper killed the group's workers before Ray's shutdown began.
    messages = trainer_support.controller_messages(controllers)
    assert_stopped_before_shutdown(messages, failed_ranks=[0], decisions=["Stalled, rank 1): restarting"])


def assert_stopped_before_shutdown(
    messages: list[str], *, failed_ranks: list[int], decisions: list[str]
) -> None:
    """Each failed group of a run: trainop's policy logged its decision (``decisions``, in order, each a part
    of the line) and then FailedGroupStopper killed the 2 workers, before Ray Train's "Shutting down"."""
    decided = [m for m in messages if m.startswith("trainop: worker group ")]
    assert len(decided) == len(decisions), messages
    for line, part in zip(decided, decisions, strict=True):
        assert part in line, (line, part)
    stopped = [n for n, m in enumerate(messages) if m.startswith("trainop: the worker group failed")]
    shutdowns = [n for n, m in enumerate(messages) if m == "Shutting down 2 workers."]
    assert len(stopped) == len(decisions) and len(shutdowns) >= len(decisions), messages
    expected = f"trainop: the worker group failed (ranks {failed_ranks}): killing its 2 workers now"
    for n in stopped:
        assert messages[n].startswith(expected), messages[n]
        assert any(n < m for m in shutdowns), messages


def test_a_users_exception_is_classified_restarted_within_its_budget_then_ends_the_attempt(
    ray_cluster: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entrypoint raises ValueError at step 15 on rank 1 in every worker group: the first time within
    the userCodeError budget (1), restarted from checkpoint 10; the second time the budget is used up and
    the attempt fails, its entry restarted=false for the operator."""
    tests_dir = _user_entrypoints_on_path(monkeypatch)
    controllers = trainer_support.train_controller_logs()
    config = trainer_support.mlp_config(
        tmp_path,
        "user-error",
        max_steps=40,
        interval_steps=10,
        every_steps=5,
        workload={"entrypoint": "faulty_entrypoint:train", "config": {"failAtStep": 15, "failRank": 1}},
    )
    config = trainer_support.with_spec(
        config, failurePolicy={"maxWorkerFailures": 2, "budgets": {"userCodeError": 1}}
    )

    result = ray_train.run(config)

    assert result.outcome == "failed", result
    assert "spec.failurePolicy.budgets.userCodeError (1)" in (result.error or ""), result.error
    failures = trainer_support.status(config)["workerFailures"]
    assert failures["counts"] == {"UserCodeError": 1}
    last, first = failures["last"]
    line = next(
        n
        for n, text in enumerate(
            (pathlib.Path(tests_dir) / "faulty_entrypoint.py").read_text().splitlines(), 1
        )
        if "raise ValueError" in text
    )
    for entry in (first, last):
        assert (entry["reason"], entry["rank"], entry["attempt"]) == ("UserCodeError", 1, 1), entry
        assert entry["message"] == (
            f"ValueError: bad shape (16, 1) at step 15 at faulty_entrypoint.py:{line} (check_shape)"
        ), entry["message"]
    assert (first["restarted"], last["restarted"]) == (True, False)
    resumes = [e["step"] for e in trainer_support.events(config) if e["event"] == "resume"]
    assert resumes == [10], resumes
    assert_stopped_before_shutdown(
        trainer_support.controller_messages(controllers),
        failed_ranks=[1],
        decisions=[
            "(UserCodeError, rank 1): restarting",
            "(UserCodeError, rank 1): the attempt ends (1 UserCodeError failure used up "
            "spec.failurePolicy.budgets.userCodeError (1))",
        ],
    )
