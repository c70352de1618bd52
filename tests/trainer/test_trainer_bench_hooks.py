"""Benchmark hooks and runtime switches (issue #21): the trace window, A/B blocks, the image input paths.

Real Trainer processes (``python -m trainop_trainer.launch``, gloo, world size 1), the real torch profiler,
real files; nothing is mocked.
"""

from __future__ import annotations

import gc
import gzip
import json
import logging
import os
import pathlib
import re
import subprocess
import threading
import time
import warnings

import pytest
import torch
import trainer_support

from trainop.api import trainer_config
from trainop_trainer import bench_hooks, distributed, logs, switches, trainer, workloads


def run_launch(config_path: pathlib.Path, **env: str) -> str:
    proc = subprocess.run(
        [trainer_support.PYTHON, "-m", "trainop_trainer.launch", "--config", str(config_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=trainer_support.subprocess_env(**env),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def tiny_resnet(
    storage: pathlib.Path, name: str, *, max_steps: int
) -> tuple[trainer_config.TrainerConfig, pathlib.Path]:
    config = trainer_support.mlp_config(
        storage,
        name,
        workers=1,
        max_steps=max_steps,
        interval_steps=None,
        interval_minutes=1440,
        every_steps=5,
        batch_size=4,
        workload={
            "model": "resnet18",
            "dataset": {
                "kind": "synthetic",
                "imageSize": 32,
                "numSamples": 256,
                "numClasses": 10,
                "numWorkers": 0,
            },
        },
    )
    storage.mkdir(parents=True, exist_ok=True)
    return config, trainer_support.write_config(config, storage / f"{name}.json")


def test_a_trace_window_records_the_asked_steps_and_the_loops_sections_on_every_rank(
    tmp_path: pathlib.Path,
) -> None:
    _, path = tiny_resnet(tmp_path, "traced", max_steps=10)
    trace_dir = tmp_path / "trace"
    out = run_launch(path, TRAINOP_TRACE_STEPS="4:3", TRAINOP_TRACE_DIR=str(trace_dir))

    assert "trace of 3 steps written to" in out
    with gzip.open(trace_dir / "rank0.trace.json.gz", "rt") as f:
        names = {event.get("name") for event in json.load(f)["traceEvents"]}
    assert {"trainop.step#5", "trainop.step#6", "trainop.step#7"} <= names
    assert not {"trainop.step#4", "trainop.step#8"} & names
    for part in ("data", "forward_backward", "optimizer", "metrics", "control", "report"):
        assert f"trainop.{part}" in names
    facts = json.loads((trace_dir / "rank0.env.json").read_text())
    assert facts["traced_steps"] == 3 and facts["world_size"] == 1 and facts["torch_threads"] >= 1
    assert facts["switches"] == (
        "batch_memory=slots,bucket_view=on,control_every=1,ddp_stats=start,failed_group=kill,gc=auto,"
        "input=fused,niceness=training,normalise=step,prefetch=eager,report_sync=lagged,restarts=controller"
    )


def test_a_step_timeline_writes_one_row_per_step_with_the_loops_parts_on_every_rank(
    tmp_path: pathlib.Path,
) -> None:
    _, path = tiny_resnet(tmp_path, "timeline", max_steps=10)
    directory = tmp_path / "timeline"
    out = run_launch(path, TRAINOP_TIMELINE_STEPS="3:5", TRAINOP_TIMELINE_DIR=str(directory))

    assert "step timeline of 5 steps written to" in out
    head, *rows = (json.loads(line) for line in (directory / "rank0.timeline.jsonl").read_text().splitlines())
    assert head["rank"] == 0 and head["world_size"] == 1 and head["start"] == 3 and head["steps"] == 5
    assert head["facts"]["torch_threads"] >= 1
    assert [row["step"] for row in rows] == [4, 5, 6, 7, 8]
    for row in rows:
        parts = row["sections_ms"]
        assert {"data", "forward_backward", "optimizer", "metrics", "control"} <= parts.keys()
        # The parts are inside the step: the host's time for the step holds them all.
        assert 0 < sum(parts.values()) <= row["host_ms"]
        assert row["thread_cpu_ms"] > 0 and row["process_cpu_ms"] >= 0
        assert row["voluntary_switches"] >= 0 and row["involuntary_switches"] >= 0
        assert row["gc_ms"] >= 0 and row["gc_count"] >= 0
        assert "device_ms" not in row and "lead_ms" not in row  # a CPU run has no device clock
        # No loader workers (no pin-memory thread), no autograd device thread on the CPU: the training thread.
        assert row["threads"].keys() == {"main"}
        main = row["threads"]["main"]
        assert 0 < main["run_ms"] <= row["host_ms"] + 1 and main["wait_ms"] >= 0 and main["slices"] >= 1
        assert main["cpu"] in os.sched_getaffinity(0)
        # Steal time comes in whole ticks of /proc/stat (10 ms at the usual 100 Hz), over every CPU and on the
        # CPU the thread last ran on (on bare metal both stay 0). The kernel converts each line to ticks on
        # its own, so a CPU's line may tick over while the sum's does not yet: no order between the two.
        tick_ms = 1e3 / os.sysconf("SC_CLK_TCK")
        for steal in (row["steal_ms"], main["steal_ms"]):
            assert steal >= 0 and (steal / tick_ms).is_integer()
    walls = [row["wall"] for row in rows]
    assert walls == sorted(walls)
    # Reports every 5 steps: step 5's report is timed in its row, and no other row has one.
    assert [row["step"] for row in rows if "report" in row["sections_ms"]] == [5]


def cpu_rank(rank: int, *, of: int) -> distributed.WorkerContext:
    ctx: distributed.WorkerContext = trainer_support.cpu_context(rank, of)
    return ctx


def test_a_timeline_cut_short_by_the_end_of_training_writes_the_steps_it_has(tmp_path: pathlib.Path) -> None:
    timeline = bench_hooks.Timeline(ctx=cpu_rank(3, of=4), start=2, count=10, directory=tmp_path)
    for step in range(1, 6):
        with bench_hooks.section("data"):
            gc.collect()
        timeline.after_step(step)
    assert bench_hooks._timeline is timeline
    timeline.close()
    timeline.close()  # once only
    assert bench_hooks._timeline is None
    assert bench_hooks.section("data") is bench_hooks._NO_SECTION
    head, *rows = (json.loads(line) for line in (tmp_path / "rank3.timeline.jsonl").read_text().splitlines())
    assert head["steps"] == 3 and [row["step"] for row in rows] == [3, 4, 5]
    # Step 2 started the window: its own collection is not counted; each later step's is, in its row.
    assert all(row["gc_count"] >= 1 and row["gc_ms"] > 0 for row in rows)
    assert all(row["sections_ms"]["data"] >= row["gc_ms"] for row in rows)


def test_a_followed_thread_that_ends_mid_window_is_dropped_and_the_timeline_goes_on(
    tmp_path: pathlib.Path,
) -> None:
    """A DataLoader's pin-memory thread ends with its epoch: the next step's row simply lacks it."""
    timeline = bench_hooks.Timeline(ctx=cpu_rank(0, of=1), start=1, count=5, directory=tmp_path)
    timeline.after_step(1)
    release = threading.Event()
    helper = threading.Thread(target=release.wait)
    helper.start()
    assert helper.native_id is not None
    timeline._threads["helper"] = bench_hooks._ThreadClock(helper.native_id)
    timeline._thread_last["helper"] = timeline._threads["helper"].read()
    timeline.after_step(2)
    release.set()
    helper.join()
    # join() returns when Python is done with the thread; the kernel task goes a moment later (CI of
    # 2026-11-29 read it once more). The case under test is a thread the kernel no longer has.
    gone_by = time.monotonic() + 10
    while os.path.exists(f"/proc/self/task/{helper.native_id}") and time.monotonic() < gone_by:
        time.sleep(0.01)
    assert not os.path.exists(f"/proc/self/task/{helper.native_id}"), "the task outlived join() by 10 s"
    timeline.after_step(3)
    timeline.close()
    _, *rows = (json.loads(line) for line in (tmp_path / "rank0.timeline.jsonl").read_text().splitlines())
    assert [(row["step"], sorted(row["threads"])) for row in rows] == [(2, ["helper", "main"]), (3, ["main"])]
    assert "helper" not in timeline._threads


def test_a_timeline_that_never_started_writes_nothing(tmp_path: pathlib.Path) -> None:
    timeline = bench_hooks.Timeline(ctx=cpu_rank(0, of=1), start=50, count=10, directory=tmp_path / "t")
    for step in range(1, 6):
        timeline.after_step(step)
    timeline.close()
    assert not (tmp_path / "t").exists()


def test_ab_blocks_switch_at_the_asked_steps_log_each_block_and_compute_the_same_model(
    tmp_path: pathlib.Path,
) -> None:
    plain, plain_path = tiny_resnet(tmp_path / "plain", "plain", max_steps=14)
    blocks, blocks_path = tiny_resnet(tmp_path / "blocks", "blocks", max_steps=14)
    run_launch(plain_path)
    out = run_launch(blocks_path, TRAINOP_AB_BLOCKS="4:3:input=f32,default,input=f32+control_every=2")

    lines = re.findall(r"ab block (\S+) steps (\d+)-(\d+): [\d.]+ ms/step, [\d.]+ samples/s", out)
    assert lines == [
        ("input=f32", "4", "7"),
        ("default", "7", "10"),
        ("input=f32+control_every=2", "10", "13"),
    ]
    # The variants choose between equal computations: the model is bitwise the one of a run without blocks.
    a, b = trainer_support.final_model(plain, 14), trainer_support.final_model(blocks, 14)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("input=fast", "input"),
        ("prefetch=late", "prefetch"),
        ("normalise=host", "normalise"),
        ("report_sync=never", "report_sync"),
        ("speed=1", "speed"),
        ("control_every=0", "control_every"),
        ("bucket_view=maybe", "bucket_view"),
    ],
)
def test_a_bad_switch_is_named_with_its_fix(text: str, field: str) -> None:
    with pytest.raises(ValueError, match=rf"TRAINOP_SWITCHES: .*{field}.*(choose|use)"):
        switches.parse(text)


def test_both_image_input_paths_give_the_same_values_and_the_lean_one_rounds_once_to_the_autocast_dtype() -> (
    None
):
    images = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    mean = torch.tensor(workloads._IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(workloads._IMAGENET_STD).view(1, 3, 1, 1)
    before = images.contiguous(memory_format=torch.channels_last).float().sub_(mean).div_(std)
    lean = workloads.normalise_images(images, mean, std, memory_format=torch.channels_last, dtype=None)
    low = workloads.normalise_images(
        images, mean, std, memory_format=torch.channels_last, dtype=torch.bfloat16
    )
    assert torch.equal(lean, before) and lean.is_contiguous(memory_format=torch.channels_last)
    assert low.dtype == torch.bfloat16 and torch.equal(low, before.to(torch.bfloat16))
    assert low.is_contiguous(memory_format=torch.channels_last)
    # On the CPU the input stays float32 whatever the job's precision (bitwise-resume runs compare it).
    to_device = workloads.ImageToDevice(channels_last=True, dtype=torch.bfloat16)
    x, _ = to_device((images, torch.zeros(4, dtype=torch.long)), torch.device("cpu"))
    assert x.dtype == torch.float32 and torch.equal(x, before)


def test_ray_train_cleaners_repeated_notice_becomes_one_explaining_info_line() -> None:
    logger = logging.getLogger(logs._CLEANER_LOGGER)
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Keep()
    logger.addHandler(handler)
    saved = list(logger.filters)
    try:
        logs.ray_worker_setup()
        logs.ray_worker_setup()  # idempotent: one filter
        for _ in range(5):
            logger.warning("Failed to query Ray Train Controller actor state. State API may be unavailable.")
        logger.warning("Detected that the Ray Train controller actor (x) is dead.")
    finally:
        logger.removeHandler(handler)
        logger.filters[:] = saved
    assert [(r.levelname, r.getMessage()) for r in seen] == [
        ("INFO", logs.CLEANER_EXPLANATION),
        ("WARNING", "Detected that the Ray Train controller actor (x) is dead."),
    ]


def test_fused_image_input_is_within_float32_rounding_of_the_reference_in_layout_and_dtype() -> None:
    images = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    mean = torch.tensor(workloads._IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(workloads._IMAGENET_STD).view(1, 3, 1, 1)
    reference = (images.double() - mean.double()) / std.double()
    scale, bias = workloads.fused_stats(torch.device("cpu"))
    full = workloads.normalise_images_fused(
        images, scale, bias, memory_format=torch.channels_last, dtype=None
    )
    low = workloads.normalise_images_fused(
        images, scale, bias, memory_format=torch.channels_last, dtype=torch.bfloat16
    )
    assert full.dtype == torch.float32 and full.is_contiguous(memory_format=torch.channels_last)
    # Every one of the 256 values per channel: within a few float32 ulp of the exact result.
    assert torch.allclose(full.double(), reference, rtol=0, atol=4 * torch.finfo(torch.float32).eps * 3)
    assert low.dtype == torch.bfloat16 and low.is_contiguous(memory_format=torch.channels_last)
    # Rounded once to bf16: at most one bf16 step from the exact value rounded to bf16.
    assert (low.double() - reference.to(torch.bfloat16).double()).abs().max() <= 2**-7 * 3
    assert switches.DEFAULTS["input"] == "fused" and switches.parse("input=lean") == {"input": "lean"}
    assert switches.DEFAULTS["prefetch"] == "eager" and switches.DEFAULTS["report_sync"] == "lagged"
    assert switches.DEFAULTS["normalise"] == "step"
    assert switches.parse("normalise=copy") == {"normalise": "copy"}
    assert switches.parse("prefetch=after+report_sync=device") == {
        "prefetch": "after",
        "report_sync": "device",
    }


def test_bucket_views_are_the_default_and_off_gives_ddps_own_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert switches.DEFAULTS["bucket_view"] == "on" and switches.bucket_view()
    with trainer_support.switches_from_env(monkeypatch, "bucket_view=off"):
        assert not switches.bucket_view()


def test_ddp_times_only_its_first_iterations_unless_asked_for_its_sampled_runtime_stats(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    """DDP's runtime statistics time its first 10 iterations and every 100th; on a GPU the forward after a
    timed iteration waits for the device (issue #21's dips every 100 steps). The trainer's DDP (and a user's,
    ``prepare_model``) times only the first 10 unless ``ddp_stats=sampled``. The iteration of DDP's last timed
    iteration says which: 10, or 200 after 205 steps."""
    from trainop_trainer import parallelize

    spec = trainer_support.mlp_config(tmp_path, "ddp-stats", workers=1).spec
    last_timed = {}
    with trainer_support.world_of_one() as ctx:
        for text in ("", "ddp_stats=sampled"):
            with trainer_support.switches_from_env(monkeypatch, text):
                parallel = parallelize.apply(torch.nn.Linear(4, 2), blocks=(), spec=spec, ctx=ctx)
                for _ in range(205):
                    parallel.train_model(torch.randn(3, 4)).sum().backward()
                ddp = parallel.train_model
                assert isinstance(ddp, torch.nn.parallel.DistributedDataParallel)
                last_timed[text or "default"] = ddp._get_ddp_logging_data()["iteration"]
    assert switches.DEFAULTS["ddp_stats"] == "start"
    assert last_timed == {"default": 10, "ddp_stats=sampled": 200}


def test_ray_train_workers_run_at_niceness_0_unless_asked_for_rays_default(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime env of the workers (a real Ray worker at niceness 0: test_trainer_ray's SIGTERM test)."""
    from trainop_trainer import ray_train

    config = trainer_support.mlp_config(tmp_path, "nice")
    monkeypatch.delenv(ray_train.RAY_NICENESS_ENV, raising=False)
    assert switches.DEFAULTS["niceness"] == "training"
    assert ray_train.worker_env(config)[ray_train.RAY_NICENESS_ENV] == "0"
    with trainer_support.switches_from_env(monkeypatch, "niceness=ray"):
        assert ray_train.RAY_NICENESS_ENV not in ray_train.worker_env(config)
    monkeypatch.setenv(ray_train.RAY_NICENESS_ENV, "5")  # the driver's own setting is kept
    assert ray_train.worker_env(config)[ray_train.RAY_NICENESS_ENV] == "5"


def test_synced_gc_freezes_collects_the_young_generations_at_the_same_steps_and_restores_the_collector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert switches.DEFAULTS["gc"] == "auto"
    with trainer_support.switches_from_env(monkeypatch, "gc=synced"):
        assert switches.gc_mode() == "synced"
    collections: list[int] = []

    def watch(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    assert gc.isenabled()
    gc.callbacks.append(watch)
    try:
        collector = trainer.Collector("synced")
        collector.start()
        assert not gc.isenabled() and gc.get_freeze_count() > 0 and collections == [2]
        for step in range(1, 2 * trainer.GC_EVERY_STEPS + 1):
            collector.after_step(step)
        assert collections == [2, 1, 1]  # at steps GC_EVERY_STEPS and twice that, on every rank alike
        collector.stop()
        assert gc.isenabled() and gc.get_freeze_count() == 0
        auto = trainer.Collector("auto")
        auto.start()
        auto.after_step(trainer.GC_EVERY_STEPS)
        assert gc.isenabled() and collections == [2, 1, 1]
        auto.stop()
    finally:
        gc.callbacks.remove(watch)
        gc.unfreeze()
        gc.enable()


@pytest.mark.parametrize("text", ["40", "40:0", "a:5", "40:"])
def test_a_malformed_sync_hunt_window_is_named_with_its_form(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv(bench_hooks.SYNC_DEBUG_STEPS_ENV, text)
    with pytest.raises(ValueError, match=r"TRAINOP_SYNC_DEBUG_STEPS=.*expected START:COUNT"):
        bench_hooks.BenchHooks.from_env(ctx=None, samples_per_step=1)  # type: ignore[arg-type]  # parsed first


def test_the_sync_hunt_logs_each_synchronising_stack_once_and_restores_warnings(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """CUDA's sync debug mode is stood in for (no GPU here): what it does on a sync is warn, as below."""
    modes: list[str] = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    before_show, before_filters = warnings.showwarning, list(warnings.filters)
    hunt = bench_hooks.SyncHunt(rank=1, step=40)

    def sync_here() -> None:
        warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)

    with caplog.at_level(logging.INFO, logger="trainop_trainer.bench_hooks"):
        hunt.start()
        for step in (40, 40, 41):
            hunt.step = step
            sync_here()  # the same stack every time: logged once, at its first step
        hunt.stop()
    points = [r.getMessage() for r in caplog.records if r.getMessage().startswith("sync point on rank 1")]
    assert len(points) == 1 and "at step 40" in points[0] and "in sync_here" in points[0]
    assert modes == ["warn", "default"]
    assert warnings.showwarning is before_show and list(warnings.filters) == before_filters
