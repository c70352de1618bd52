"""The report window shared by the built-in loop and user entrypoints: loss, throughput and ETA maths."""

from __future__ import annotations

import logging
import time

import pytest
import torch
import trainer_support

from trainop_trainer import distributed, metrics
from trainop_trainer.reporting import ProgressReports, ReportWindow


def window(world_size: int = 1) -> ReportWindow:
    return ReportWindow(world_size=world_size, device=torch.device("cpu"))


def test_the_reported_loss_is_the_mean_of_every_loss_added_in_the_window() -> None:
    w = window()
    w.restart(0)
    for value in (torch.tensor(1.0), 2.0, torch.tensor(6.0)):
        w.add_loss(value)
    assert w.close(step=3, total_steps=10).local_loss == pytest.approx(3.0)


def test_throughput_counts_this_ranks_samples_times_the_world_size() -> None:
    w = window(world_size=4)
    w.restart(10)
    w.add_samples(32)
    w.add_samples(32)
    time.sleep(0.05)
    stats = w.close(step=12, total_steps=None)
    elapsed_upper_bound = 64 * 4 / stats.samples_per_second  # type: ignore[operator]
    assert 0.05 <= elapsed_upper_bound < 5.0


def test_eta_is_the_remaining_steps_at_the_windows_pace() -> None:
    w = window()
    w.restart(100)
    w.add_samples(1)
    time.sleep(0.02)
    stats = w.close(step=110, total_steps=210)
    assert stats.eta_seconds is not None
    per_step = stats.eta_seconds / 100
    assert per_step >= 0.002


def test_a_window_without_steps_repeats_the_previous_throughput_and_loss_and_ends_the_eta() -> None:
    w = window()
    w.restart(0)
    w.add_loss(4.0)
    w.add_samples(8)
    first = w.close(step=5, total_steps=5)
    w.last_loss = 4.0  # what the publication averaged over ranks
    again = w.close(step=5, total_steps=5)
    assert (again.local_loss, again.samples_per_second) == (4.0, first.samples_per_second)
    assert again.eta_seconds == 0.0


def test_without_a_known_end_there_is_no_eta() -> None:
    w = window()
    w.restart(0)
    w.add_samples(1)
    assert w.close(step=1, total_steps=None).eta_seconds is None


def test_closing_starts_a_new_empty_window() -> None:
    w = window()
    w.restart(0)
    w.add_loss(9.0)
    w.add_samples(3)
    assert w.pending
    w.close(step=1, total_steps=10)
    assert not w.pending
    w.add_loss(1.0)
    assert w.close(step=2, total_steps=10).local_loss == pytest.approx(1.0)


def test_a_repeated_report_at_the_last_step_only_reaches_ray(caplog: pytest.LogCaptureFixture) -> None:
    """The loop reported the last step; the run's end reports it again so that Ray Train gets it: the log
    line, the status and the tracking hook see that step once."""
    hooked: list[int] = []
    to_ray: list[dict[str, object]] = []
    with trainer_support.world_of_one() as ctx:  # rank 0 of one, on the CPU
        reports = ProgressReports(
            ctx=ctx,
            control=distributed.ControlChannel(ctx),
            worker_metrics=metrics.WorkerMetrics(job="report-once", rank=0),
            status=None,
            report_fn=to_ray.append,
            worker_restarts=0,
            last_checkpoint_step=lambda: None,
            on_report=lambda step, values: hooked.append(step),
        )
        reports.start(0)
        reports.window.add_loss(2.0)
        reports.step_finished(1, samples=4)
        with caplog.at_level(logging.INFO, logger="trainop_trainer.reporting"):
            reports.report(step=1, total_steps=1, epoch=0, to_ray=False)
            assert reports.needs_final_report(1)  # Ray Train has not had step 1
            reports.report(step=1, total_steps=1, epoch=0, to_ray=True)
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step 1/1")]
        assert len(lines) == 1, lines
        assert hooked == [1]
        assert [r["step"] for r in to_ray] == [1] and to_ray[0]["loss"] == 2.0
        assert not reports.needs_final_report(1)
