"""bench/gpu/suite.py reads the trainer's throughput from rank 0's report lines: a lagged report (CUDA's
default, switches ``report_sync=lagged``) names the window its rate is of, and the suite counts that window,
not the one that ends at the line's step. Hand-written log lines; nothing else is needed."""

from __future__ import annotations

from types import ModuleType

import bench_scripts


def load() -> ModuleType:
    return bench_scripts.load("suite.py", "gpu_suite")


def line(step: int, rate: str, window: tuple[int, int] | None = None) -> str:
    suffix = "" if window is None else f" (window of steps {window[0]}-{window[1]})"
    return (
        f"2026-11-27 06:40:{step % 60:02d},000 rank0 trainop_trainer.reporting INFO: "
        f"step {step}/100 epoch 0 loss 1.2345 {rate} samples/s{suffix}"
    )


def test_lagged_rates_are_counted_for_the_window_they_name() -> None:
    suite = load()
    lagged = "\n".join(
        [
            line(10, "-"),  # the first lagged report has no earlier window
            line(20, "100.0", (0, 10)),  # warm-up: not timed
            line(30, "200.0", (10, 20)),  # warm-up: not timed
            line(40, "400.0", (20, 30)),
            line(50, "400.0", (30, 40)),
        ]
    )
    result = suite.parse_trainer_log(lagged, workload="resnet50", gpus=1, warmup=20, last=40)
    assert result["window_rates"] == [400.0, 400.0]
    assert result["timed_steps"] == 20
    assert abs(result["samples_per_second"] - 400.0) < 1e-9


def test_reports_that_wait_for_the_gpu_are_counted_for_the_window_that_ends_at_their_step() -> None:
    suite = load()
    synced = "\n".join([line(10, "100.0"), line(20, "200.0"), line(30, "400.0"), line(40, "400.0")])
    result = suite.parse_trainer_log(synced, workload="resnet50", gpus=1, warmup=20, last=40)
    assert result["window_rates"] == [400.0, 400.0]
