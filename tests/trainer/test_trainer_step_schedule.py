"""The step schedule: which step every rank reports, checkpoints, stops or yields to a preemption at.

Real ``ControlChannel`` exchanges: world size 1 in-process, and 2 processes over gloo (torch.multiprocessing)
for the agreement between ranks. Nothing is mocked; the time-based checkpoint test gives ``StepSchedule`` a
clock it steps itself (its ``clock`` argument), where a real clock made the test depend on the machine's
pauses.
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
import trainer_support

from trainop.api import trainingjob
from trainop_trainer import distributed, preempt, step_schedule, switches


def spec(**checkpoint: Any) -> trainingjob.TrainingJobSpec:
    return trainingjob.TrainingJobSpec.model_validate(
        {
            "workload": {"model": "mlp"},
            "hyperparameters": {"maxSteps": 100},
            "workers": {"gpusPerWorker": 0},
            "precision": "fp32",
            "checkpoint": checkpoint or {"intervalSteps": 10, "intervalMinutes": None},
            "reporting": {"everySteps": 4, "everySeconds": 3600},
        },
        by_alias=True,
    )


def context(rank: int = 0, world_size: int = 1) -> distributed.WorkerContext:
    ctx: distributed.WorkerContext = trainer_support.cpu_context(rank, world_size)
    return ctx


class SteppedClock:
    """Rank 0's clock for the time-based tests: it moves only when the test moves it, so a process paused
    between two polls changes nothing (a real 60 ms interval did)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def schedule(
    tmp_path: pathlib.Path, job: trainingjob.TrainingJobSpec, clock: Callable[[], float] = time.monotonic
) -> step_schedule.StepSchedule:
    return step_schedule.StepSchedule(
        spec=job,
        control=distributed.ControlChannel(context()),
        is_rank0=True,
        stop_file=tmp_path / "stop-requested",
        ray_report_interval_s=None,
        clock=clock,
    )


@pytest.fixture(autouse=True)
def no_signal() -> Any:
    preempt.reset()
    yield
    preempt.reset()


def test_step_count_checkpoints_and_reports_happen_at_once(tmp_path: pathlib.Path) -> None:
    s = schedule(tmp_path, spec())
    decisions = {step: s.poll(step) for step in range(1, 21)}
    assert [step for step, d in decisions.items() if d.checkpoint] == [10, 20]
    assert [step for step, d in decisions.items() if d.report] == [4, 8, 12, 16, 20]
    assert not any(d.stop or d.ray_report for d in decisions.values())


def test_a_time_based_checkpoint_is_agreed_one_step_after_rank_0s_clock_runs_out(
    tmp_path: pathlib.Path,
) -> None:
    clock = SteppedClock()
    s = schedule(tmp_path, spec(intervalMinutes=1), clock)
    clock.now += 59.5
    assert not s.poll(1).checkpoint  # not yet a minute
    clock.now += 0.5
    assert not s.poll(2).checkpoint  # a minute: asked at step 2 ...
    assert s.poll(3).checkpoint  # ... agreed at step 3
    clock.now += 59.5
    assert not s.poll(4).checkpoint  # the clock restarted when it asked (at step 2)
    assert not s.poll(5).checkpoint
    clock.now += 0.5
    s.poll(6)
    assert s.poll(7).checkpoint  # a minute after step 2's ask


def test_a_stop_file_stops_every_rank_with_a_checkpoint_and_a_report(tmp_path: pathlib.Path) -> None:
    s = schedule(tmp_path, spec())
    s.poll(1)
    (tmp_path / "stop-requested").write_text("signal 15\n")
    time.sleep(step_schedule.STOP_FILE_CHECK_INTERVAL_S + 0.05)
    s.poll(2)
    decision = s.poll(3)
    assert decision.stop and decision.checkpoint and decision.report and decision.ray_report
    assert decision.outcome == step_schedule.Outcome.STOPPED


def test_a_sigterm_is_a_preemption_with_a_checkpoint_at_the_next_step(tmp_path: pathlib.Path) -> None:
    s = schedule(tmp_path, spec())
    s.poll(1)
    preempt.request()
    assert not s.poll(2).stop
    decision = s.poll(3)
    assert decision.preempt and decision.checkpoint
    assert decision.outcome == step_schedule.Outcome.PREEMPTED


def _two_ranks(rank: int, port: int, stop_file: str, out: str, control_every: int = 1) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    switches.apply({"control_every": control_every})
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ctx = context(rank, 2)
    s = step_schedule.StepSchedule(
        spec=spec(),
        control=distributed.ControlChannel(ctx),
        is_rank0=rank == 0,
        stop_file=pathlib.Path(stop_file),
        ray_report_interval_s=None,
    )
    seen = []
    for step in range(1, 30):
        if rank == 1 and step == 7:
            preempt.request()  # only rank 1 gets the signal
        decision = s.poll(step)
        seen.append((step, decision.stop, decision.preempt, decision.checkpoint))
        if decision.stop:
            break
    pathlib.Path(out).write_text(json.dumps(seen))
    dist.destroy_process_group()


@pytest.mark.parametrize(
    ("control_every", "stop_step"),
    [(1, 8), (4, 12)],  # signalled during step 7: posted at the next exchange, agreed at the one after
)
def test_a_signal_seen_by_one_rank_stops_every_rank_at_the_same_step(
    tmp_path: pathlib.Path, control_every: int, stop_step: int
) -> None:
    port = distributed.free_port()
    outs = [tmp_path / "rank0.txt", tmp_path / "rank1.txt"]
    spawn = mp.get_context("spawn")
    procs = [
        spawn.Process(
            target=_two_ranks, args=(rank, port, str(tmp_path / "stop"), str(outs[rank]), control_every)
        )
        for rank in (0, 1)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    rank0, rank1 = (json.loads(out.read_text()) for out in outs)
    assert rank0 == rank1
    assert rank0[-1] == [stop_step, True, True, True]
