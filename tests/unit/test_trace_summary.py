"""bench/gpu/trace_summary.py: a step's GPU time splits into parts that add up, read from a Chrome trace.

A small hand-made trace (the shape torch.profiler writes: CPU ranges, CUDA runtime launches, kernels and
copies with correlation ids and streams) whose answer is known; nothing else is needed.
"""

from __future__ import annotations

import gzip
import json
import pathlib
from types import ModuleType
from typing import Any

import bench_scripts
import pytest


def load() -> ModuleType:
    return bench_scripts.load("trace_summary.py", "trace_summary")


def x(
    cat: str, name: str, ts: float, dur: float, *, pid: int = 1, tid: int = 1, **args: Any
) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def trace() -> list[dict[str, Any]]:
    """Three 100 us steps. Per step: a 30 us kernel on the training stream (7), a 15 us NCCL kernel right
    after it (stream 20), a 15 us copy on stream 30 whose last 5 us overlap the training kernel; in step 1
    the loop thread waits in a synchronisation inside ``trainop.report``."""
    events = []
    corr = 0
    for i in range(3):
        base = 100.0 * i
        events.append(x("user_annotation", f"trainop.step#{i + 1}", base, 90.0))
        for launch_at, stream, name, start, dur, cat in (
            (5.0, 30, "Memcpy HtoD (Pinned -> Device)", 40.0, 15.0, "gpu_memcpy"),
            (10.0, 7, "void conv_kernel", 50.0, 30.0, "kernel"),
            (20.0, 20, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 80.0, 15.0, "kernel"),
        ):
            corr += 1
            events.append(x("cuda_runtime", "cudaLaunchKernel", base + launch_at, 2.0, correlation=corr))
            events.append(x(cat, name, base + start, dur, pid=0, tid=stream, correlation=corr, stream=stream))
    events.append(x("user_annotation", "trainop.report", 100.0, 30.0))
    events.append(x("cuda_runtime", "cudaStreamSynchronize", 101.0, 24.0))
    events.append(x("cpu_op", "gloo:all_reduce", 126.0, 2.0, tid=9))
    return events


def test_a_steps_gpu_period_splits_into_training_stream_exposed_communication_exposed_copies_and_idle(
    tmp_path: pathlib.Path,
) -> None:
    summary = load().summarize_rank(trace())
    gpu = summary["gpu"]
    assert gpu["period_ms"] == pytest.approx(0.100)
    parts = [gpu[k] for k in ("train_stream_busy_ms", "nccl_exposed_ms", "other_exposed_ms", "idle_ms")]
    assert parts == pytest.approx([0.030, 0.015, 0.010, 0.045])
    assert sum(parts) == pytest.approx(gpu["period_ms"])
    assert gpu["nccl_kernel_ms"] == pytest.approx(0.015)
    assert gpu["longest_gaps"][0]["loop"] == "trainop.report / cudaStreamSynchronize"
    assert summary["host_sections_ms"]["report"] == pytest.approx(0.030 / 3)
    assert summary["blocking_per_step"]["cudaStreamSynchronize (loop)"]["count"] == pytest.approx(1 / 3)
    assert summary["collectives_per_step"]["gloo:all_reduce"] == pytest.approx(1 / 3)


def test_two_runs_render_side_by_side_with_their_difference(tmp_path: pathlib.Path) -> None:
    module = load()
    for label in ("bare", "trainer"):
        directory = tmp_path / label
        directory.mkdir()
        with gzip.open(directory / "rank0.trace.json.gz", "wt") as f:
            json.dump({"traceEvents": trace()}, f)
        (directory / "rank0.env.json").write_text(json.dumps({"torch_threads": 1 if label == "bare" else 8}))
    out = tmp_path / "summary.md"
    assert (
        module.main(
            [
                "--run",
                f"bare={tmp_path / 'bare'}",
                "--run",
                f"trainer={tmp_path / 'trainer'}",
                "--text",
                str(out),
            ]
        )
        == 0
    )
    text = out.read_text()
    assert "| GPU period per step (ms) | 0.100 | 0.100 | +0.000 |" in text
    assert "torch_threads: 1 -> 8" in text
