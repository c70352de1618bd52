"""The failure classifier (failures.py) and the watchdog (watchdog.py) without Ray.

The classifier gets real exceptions (raised and caught, so they carry real tracebacks; torch.distributed's
own error types) and the texts NCCL, gloo and Ray produce. The watchdog test runs two real watchdog threads
that share heartbeats through a real ``torch.distributed.TCPStore`` served in this process, as the driver
serves it: one rank goes silent (as a SIGSTOPped process does), the other's progress stops; nothing is
mocked but the process exit (``on_stall`` records the verdict instead of ending the test process).
"""

from __future__ import annotations

import datetime
import json
import pathlib
import sys
import threading
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

from trainop.api import trainingjob
from trainop_trainer import checkpointer, failures, ray_train, watchdog
from trainop_trainer.workloads import models


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def forward(x: list[int]) -> None:
    raise ValueError(f"bad shape {x}")


def test_a_users_exception_is_a_user_code_error_with_its_type_message_and_frame() -> None:
    try:
        forward([3, 4])
    except ValueError as exc:
        failure = failures.classify_exception(exc, rank=1, step=7)
    line = forward.__code__.co_firstlineno + 1
    assert failure == failures.Failure(
        failures.USER_CODE_ERROR,
        f"ValueError: bad shape [3, 4] at test_trainer_failures.py:{line} (forward)",
        rank=1,
        step=7,
    )


@pytest.mark.parametrize(
    "exc",
    [
        torch.distributed.DistBackendError("NCCL communicator was aborted on rank 1"),
        torch.distributed.DistNetworkError("failed to recv, got 0 bytes"),
        RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error, NCCL version 2.21.5"),
        RuntimeError(
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]"
        ),
        RuntimeError(
            "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=41, OpType=ALLREDUCE) "
            "ran for 960000 milliseconds before timing out."
        ),
    ],
    ids=["DistBackendError", "DistNetworkError", "nccl-text", "gloo-peer", "collective-timeout"],
)
def test_torch_distributed_nccl_and_gloo_errors_are_nccl_errors(exc: BaseException) -> None:
    assert failures.classify_exception(raised(exc)).reason == failures.NCCL_ERROR


def test_an_error_raised_while_handling_a_broken_collective_is_a_nccl_error() -> None:
    try:
        try:
            raise RuntimeError("[gloo/transport/tcp/pair.cc:598] Connection reset by peer")
        except RuntimeError as inner:
            raise KeyError("loss") from inner
    except KeyError as exc:
        assert failures.classify_exception(exc).reason == failures.NCCL_ERROR


def test_out_of_memory_and_preemption_have_their_own_classes() -> None:
    oom = failures.classify_exception(raised(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate")))
    assert oom.reason == failures.OOM_KILLED and "batchSizePerWorker" in oom.message
    from trainop_trainer.runtime import WorkerPreempted

    assert failures.classify_exception(raised(WorkerPreempted("SIGTERM"))).reason == failures.PREEMPTED


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            "ActorDiedError: The actor died unexpectedly: Worker exit type: SYSTEM_ERROR exit code 137",
            "OOMKilled",
        ),
        ("Task was killed due to the node running low on memory (killed by the memory monitor)", "OOMKilled"),
        (
            "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
            "OOMKilled",
        ),
        ("RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer", "NCCLError"),
        ("The worker group failed: a worker process died (exit code 1)", "Unknown"),
        (
            "Training failed due to worker errors:\n ActorDiedError: Worker exit type: SYSTEM_ERROR "
            "Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. Some "
            "common causes include: (1) the process was killed by the OOM killer due to high memory usage",
            "Unknown",
        ),
        ("", "Unknown"),
    ],
)
def test_rays_error_text_is_classified_when_no_worker_said_anything(text: str, reason: str) -> None:
    assert failures.classify_text(text).reason == reason


def test_the_cause_wins_over_the_broken_collectives_it_caused() -> None:
    nccl = failures.Failure(failures.NCCL_ERROR, "Connection closed by peer", rank=0)
    user = failures.Failure(failures.USER_CODE_ERROR, "ValueError: x", rank=1)
    stall = failures.Failure(failures.STALLED, "rank 1 made no progress", rank=1)
    assert failures.choose([nccl, user]) == user
    assert failures.choose([user, stall, nccl]) == stall
    assert failures.choose([]) is None


def test_budgets_are_read_by_class_and_named_as_a_user_writes_them() -> None:
    policy = trainingjob.FailurePolicy.model_validate({"budgets": {"userCodeError": 0, "stalled": 5}})
    assert failures.budget(policy, failures.USER_CODE_ERROR) == 0
    assert failures.budget(policy, failures.STALLED) == 5
    assert (
        failures.budget(policy, failures.PREEMPTED) == 1000
    )  # the documented default (docs/operator.md, "Failures")
    assert failures.budget_field(failures.OOM_KILLED) == "spec.failurePolicy.budgets.oomKilled"
    assert set(failures.FAST_RECOVERY).isdisjoint({failures.PREEMPTED, failures.NODE_LOST})


def beat(rank: int, *, step: int | None, phase: str, posted: float) -> dict[str, Any]:
    return {"rank": rank, "step": step, "phase": phase, "posted": posted, "progressed": posted}


def test_the_stuck_rank_is_the_silent_one_else_the_one_behind_else_the_one_outside_a_collective() -> None:
    now = 1000.0
    frozen = {
        0: beat(0, step=17, phase="control", posted=now),
        1: beat(1, step=17, phase="optimizer", posted=990),
    }
    assert watchdog.stuck_rank(frozen, me=0, now=now, silent_after_s=5) == 1
    behind = {0: beat(0, step=18, phase="control", posted=now), 1: beat(1, step=17, phase="data", posted=now)}
    assert watchdog.stuck_rank(behind, me=0, now=now, silent_after_s=5) == 1
    outside = {
        0: beat(0, step=17, phase="control", posted=now),
        1: beat(1, step=17, phase="data", posted=now),
    }
    assert watchdog.stuck_rank(outside, me=0, now=now, silent_after_s=5) == 1
    alike = {
        0: beat(0, step=17, phase="control", posted=now),
        1: beat(1, step=17, phase="control", posted=now),
    }
    assert watchdog.stuck_rank(alike, me=1, now=now, silent_after_s=5) == 1


def test_where_a_rank_waits_names_the_training_code_that_called_into_a_library() -> None:
    """A thread parked in ``threading.Event.wait`` (as in a checkpoint hand-off, CI's case): the innermost
    frame is threading.py, so the training code's frame that called it follows; a thread in its own code (a
    sleep is C, no Python frame) is named by that code alone."""
    release = threading.Event()
    spots: dict[str, int] = {}

    def park_in_a_library() -> None:
        spots["wait"] = _line_of_next_statement()
        release.wait(30)

    def sleep_in_training_code() -> None:
        spots["sleep"] = _line_of_next_statement()
        time.sleep(0.5)

    threads = [threading.Thread(target=f) for f in (park_in_a_library, sleep_in_training_code)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    frames = sys._current_frames()
    parked = watchdog.where(frames[threads[0].ident])
    sleeping = watchdog.where(frames[threads[1].ident])
    release.set()
    for thread in threads:
        thread.join()
    assert parked is not None and parked.startswith("threading.py:"), parked
    assert parked.endswith(f" from test_trainer_failures.py:{spots['wait']} (park_in_a_library)"), parked
    assert sleeping == f"test_trainer_failures.py:{spots['sleep']} (sleep_in_training_code)", sleeping
    assert watchdog.where(None) is None
    # The search's order: training code (a user's module, the built-in workloads), then this package's loop
    # and checkpointer, then Python's library and installed packages.
    assert [watchdog._kind(m.__file__) for m in (failures, models, checkpointer, threading, torch)] == [
        1,
        0,
        1,
        2,
        2,
    ]
    assert watchdog._kind(__file__) == 0


def _line_of_next_statement() -> int:
    return sys._getframe(1).f_lineno + 1


def test_a_silent_rank_is_named_by_its_peers_watchdog_which_dumps_its_stacks(tmp_path: pathlib.Path) -> None:
    server = dist.TCPStore(  # type: ignore[attr-defined]
        "0.0.0.0", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=10)
    )
    verdicts: list[failures.Failure] = []
    stop = threading.Event()
    dogs: list[watchdog.Watchdog] = []

    def rank_loop(rank: int) -> None:
        """A training thread: steps every 50 ms until stopped; rank 1's watchdog then stops posting."""
        heartbeat = watchdog.Heartbeat()
        dog = watchdog.Watchdog(
            heartbeat=heartbeat,
            rank=rank,
            world_size=2,
            timeout_s=3.0,
            attempt=4,
            attempt_try=1,
            stalls_dir=tmp_path / "stalls",
            store=watchdog.connect(f"127.0.0.1:{server.port}"),
            on_stall=verdicts.append,
        )
        dogs.append(dog)
        dog.start()
        step = 0
        while not stop.is_set():
            step += 1
            heartbeat.beat(step)
            heartbeat.enter("control")
            time.sleep(0.05)
        if rank == 1:
            dog.close()  # frozen: neither steps nor heartbeats any more
            return
        stop_waiting = time.monotonic() + 60
        while not verdicts and time.monotonic() < stop_waiting:  # "waiting in the collective"
            time.sleep(0.05)

    threads = [threading.Thread(target=rank_loop, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    time.sleep(1.5)
    stop.set()
    for thread in threads:
        thread.join(90)
    for dog in dogs:
        dog.close()

    assert len(verdicts) == 1, verdicts
    verdict = verdicts[0]
    assert (verdict.reason, verdict.rank) == (failures.STALLED, 1), verdict
    stacks = tmp_path / "stalls" / "attempt-4-try-1-rank-0.txt"
    assert verdict.message.startswith("rank 1 made no progress and went silent"), verdict.message
    assert verdict.message.endswith(f"stacks in {stacks}") and "rank 0 waited" in verdict.message
    text = stacks.read_text()
    assert text.startswith("rank 0 heartbeat: ") and "rank_loop" in text and "File " in text
    assert json.loads(server.get(watchdog.store_key(1, "failure", 0)))["rank"] == 1


SPEC = {"workload": {"model": "mlp"}, "hyperparameters": {"maxSteps": 100}}


def test_used_counts_the_operators_new_attempts_and_the_trainers_restarts_and_the_book_adds_to_them(
    tmp_path: pathlib.Path,
) -> None:
    """Local mode: the driver reads status.json (the CR's copy in a cluster: test_trainer_status_kube)."""
    from trainop.api import trainer_config
    from trainop_trainer import ray_train

    status_file = tmp_path / "job" / "status.json"
    status_file.parent.mkdir()
    status_file.write_text(
        json.dumps(
            {
                "progress": {"step": 7},
                "restartsByReason": {"UserCodeError": 1, "Preempted": 4},
                "workerFailures": {"counts": {"UserCodeError": 1}, "last": []},
            }
        )
    )
    config = trainer_config.TrainerConfig.model_validate(
        {"jobName": "job", "runName": "job", "storagePath": str(tmp_path), "attempt": 2, "spec": SPEC},
        by_alias=True,
    )
    book = ray_train.FailureBook(config, status_file=status_file)
    assert (book.used(failures.USER_CODE_ERROR), book.used(failures.PREEMPTED)) == (2, 4)
    book.record(failures.Failure(failures.NCCL_ERROR, "DistBackendError: x", rank=0), restarted=True)
    book.record(failures.Failure(failures.USER_CODE_ERROR, "ValueError: y", rank=1), restarted=False)
    written = json.loads(status_file.read_text())
    assert written["progress"] == {"step": 7}  # the other records are kept
    assert written["workerFailures"]["counts"] == {"UserCodeError": 1, "NCCLError": 1}
    assert [(e["reason"], e["restarted"], e["attempt"]) for e in written["workerFailures"]["last"]] == [
        ("UserCodeError", False, 2),
        ("NCCLError", True, 2),
    ]


RAY_DEAD_WORKER = (
    "Worker exit type: SYSTEM_ERROR Worker exit detail: "
    "Worker unexpectedly exits with a connection error code 2."
)


def test_a_preempted_rank_that_exited_before_its_peers_spoke_is_preempted_not_an_unexplained_death() -> None:
    """The race seen on the cluster bed (2026-11-28): the rank that received SIGTERM writes its checkpoint and
    exits 0; Ray Train's controller can find it dead before the other ranks' WorkerPreempted arrives. Its own
    report (ray_train.preempted, written before it exits) makes the cause Preempted -- an attempt's end, not
    an in-attempt restart on a pod that is going away. A real TCPStore, as the driver serves it."""
    server = dist.TCPStore(  # type: ignore[attr-defined]
        "0.0.0.0", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=10)
    )
    attempt_try = 3
    # Nobody said anything yet: a dead rank is an unexplained death (what the bed recorded before the fix).
    unexplained = ray_train.classify_run_failure(server, attempt_try, 2, RAY_DEAD_WORKER, failed_ranks=[1])
    assert (unexplained.reason, unexplained.rank) == (failures.UNKNOWN, 1), unexplained

    ray_train.report_failure(server, attempt_try, 1, ray_train.preempted(1, 777))
    alone = ray_train.classify_run_failure(server, attempt_try, 2, RAY_DEAD_WORKER, failed_ranks=[1])
    assert (alone.reason, alone.rank, alone.step) == (failures.PREEMPTED, 1, 777), alone
    assert alone.message.startswith("rank 1 received SIGTERM") and "step 777" in alone.message, alone

    # Rank 0's WorkerPreempted arrives too: the dead rank's own word is still the one recorded.
    from trainop_trainer.runtime import WorkerPreempted

    peer = failures.classify_exception(
        raised(WorkerPreempted("rank 0: another worker received SIGTERM")), rank=0
    )
    ray_train.report_failure(server, attempt_try, 0, peer)
    both = ray_train.classify_run_failure(server, attempt_try, 2, RAY_DEAD_WORKER, failed_ranks=[1])
    assert (both.reason, both.rank) == (failures.PREEMPTED, 1), both
    # ... and without Ray naming a dead rank, rank order decides, as before.
    unnamed = ray_train.classify_run_failure(server, attempt_try, 2, RAY_DEAD_WORKER)
    assert (unnamed.reason, unnamed.rank) == (failures.PREEMPTED, 0), unnamed


def test_the_process_group_timeout_follows_the_trainers_watchdog_and_is_ray_trains_when_it_is_off() -> None:
    from trainop.api import trainingjob
    from trainop_trainer import ray_train

    on = trainingjob.FailurePolicy(stallTimeoutSeconds=120)
    assert ray_train.process_group_timeout_s(on) == 120 + ray_train.PG_TIMEOUT_MARGIN_S
    off = trainingjob.FailurePolicy(stallTimeoutSeconds=120, trainerWatchdog=False)
    assert ray_train.process_group_timeout_s(off) is None


def test_the_trainers_classes_are_the_operators_failure_reasons() -> None:
    from trainop.api.operator_status import FailureReason

    assert set(failures.REASONS) == {reason.value for reason in FailureReason}
