"""The GPU benchmark suite: bare DDP against the trainop trainer (Ray Train and torchrun), in one call.

    python3 bench/gpu/suite.py --out OUT [--deadline-s 540] [--only bare1,ray2,...]
    python3 bench/gpu/suite.py --table OUT/results.jsonl          # re-render the table offline

Run it through ``bench/gpu/run_all.sh`` on the device machine (it installs the carried wheels and sets
the environment). Everything does not fit one 10-minute call on 2x H200 (docs/benchmarks-gpu.md):
use ``--only bare1,bare2,ray2,ray1w8`` and ``--only allreduce,bare1,ray1,ckpt,launch2,launch1``.
Phases, in priority order; a phase whose estimate no longer fits before the deadline is skipped and
named as skipped in the table:

- ``allreduce``: standalone NCCL all-reduce (16 MiB, 256 MiB, 1 GiB) and the trainer's probe function.
- ``bare1`` / ``bare2``: ``bare_ddp.py`` on 1 and 2 GPUs (ResNet-50 eager and compiled, GPT-small
  compiled). The first compiled runs fill the Inductor cache that later runs reuse (GPT-small is compiled
  on GPU 1 by a warm-up process while ``bare1`` compiles ResNet-50 on GPU 0).
- ``ray1`` / ``ray2``: ``python -m trainop_trainer --config ...`` (the product entry point: TorchTrainer,
  ScalingConfig(num_workers=N, use_gpu=True)) joined to one local Ray head started here.
- recovery, inside ``ray2``'s ResNet-50 run after its timed steps: a checkpoint, one worker killed
  (``TRAINOP_INJECT_FAILURE_AT_STEP``), Ray Train restarts the group -> time from the kill to the first
  step after the resume, from the workers' own log timestamps.
- ``ckpt``: ``ckpt_bench.py``, GPT-small (eager: the cost is seconds per checkpoint, whatever the step
  time) on 2 GPUs: per-checkpoint cost, background (pinned snapshot) vs pageable snapshot vs sync.
- ``ray1w8``: Ray, 1 GPU, compiled ResNet-50 with 8 DataLoader workers instead of 4 (input-bound?).
- ``launch2`` / ``launch1``: ``torchrun -m trainop_trainer.launch`` (the same Trainer without Ray).

Trainer throughput comes from rank 0's report lines (``step S/T ... R samples/s``, one per 10 steps,
each window bounded by a device synchronisation): windows that start at or after ``--warmup`` steps,
total samples over total time. Peak memory of every run comes from NVML (memory used on the GPU, CUDA
context and allocator cache included), sampled every 0.2 s.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
PEAK_BF16_TFLOPS = 989.0  # H100/H200 SXM dense bf16 (datasheet); MFU is quoted against it
WARMUP = 30
STEPS = 100
REPORT_EVERY = 10
TIME = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
STEP_LINE = re.compile(TIME + r" rank0 \S+ INFO: step (\d+)/\d+ epoch \d+ loss \S+ ([\d.]+|-) samples/s")
PROBE_LINE = re.compile(r"all-reduce probe: ([\d.]+) GB/s bus bandwidth \((\d+) MiB")
CKPT_LINE = re.compile(r"checkpoint step (\d+): ([\d.]+)s on the training thread")
KILL_LINE = re.compile(
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) rank\d+ \S+ WARNING: trainop: injected failure"
)
RESUME_LINE = re.compile(
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) rank0 \S+ INFO: resuming from \S+ \(step (\d+)"
)

WORKLOADS = {
    # name: (model, compile, batch per GPU, unit)
    "resnet50": ("resnet50", False, 256, "img"),
    "resnet50-compile": ("resnet50", True, 256, "img"),
    "gpt-compile": ("gpt-small", True, 16, "tok"),
    "gpt": ("gpt-small", False, 16, "tok"),
    # The same with 8 DataLoader workers per rank instead of 4: is compiled ResNet-50 input-bound?
    "resnet50-compile-w8": ("resnet50", True, 256, "img"),
}
TRAINER_WORKLOADS = ("resnet50", "resnet50-compile", "gpt-compile")
SMOKE = False  # --smoke: tiny models on CPU (gloo), no compile: checks this script, not the GPUs


def set_smoke() -> None:
    global SMOKE, WARMUP, STEPS, REPORT_EVERY
    SMOKE, WARMUP, STEPS, REPORT_EVERY = True, 2, 4, 2
    WORKLOADS["resnet50"] = WORKLOADS["resnet50-compile"] = ("resnet18", False, 4, "img")
    WORKLOADS["gpt-compile"] = WORKLOADS["gpt"] = ("gpt-tiny", False, 2, "tok")


def ts(text: str) -> float:
    return datetime.datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


# ------------------------------------------------------------------------------------------ GPU sampler
class GpuSampler:
    """Memory used and utilisation of every GPU, every 0.2 s, through NVML."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int, float, float]] = []  # (time, gpu, GiB used, util %)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.names: list[str] = []

    def start(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.names = [str(pynvml.nvmlDeviceGetName(h)) for h in self._handles]
            self._pynvml = pynvml
        except Exception as exc:  # a missing NVML only loses the memory column
            print(f"suite: no NVML sampling ({exc})", flush=True)
            return
        self._thread.start()

    def _run(self) -> None:
        nv = self._pynvml
        while not self._stop.wait(0.2):
            now = time.time()
            for index, handle in enumerate(self._handles):
                try:
                    used = nv.nvmlDeviceGetMemoryInfo(handle).used / 2**30
                    util = float(nv.nvmlDeviceGetUtilizationRates(handle).gpu)
                except nv.NVMLError:
                    continue
                self.samples.append((now, index, used, util))

    def stop(self) -> None:
        self._stop.set()

    def window(self, start: float, end: float) -> dict[str, Any]:
        peak: dict[int, float] = {}
        for t, gpu, used, _util in self.samples:
            if start <= t <= end:
                peak[gpu] = max(peak.get(gpu, 0.0), used)
        busy = [g for g, used in peak.items() if used > 1.0]
        return {"nvml_peak_gib": max(peak.values()) if peak else None, "gpus_used": sorted(busy)}


# --------------------------------------------------------------------------------------------- suite
@dataclasses.dataclass
class Suite:
    out: pathlib.Path
    deadline: float  # time.monotonic() value
    sampler: GpuSampler
    results: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    ray_address: str | None = None
    port: int = 9400

    @property
    def logs(self) -> pathlib.Path:
        path = self.out / "logs"
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def results_file(self) -> pathlib.Path:
        return self.out / "results.jsonl"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def record(self, result: dict[str, Any]) -> None:
        self.results.append(result)
        with self.results_file.open("a") as f:
            f.write(json.dumps(result) + "\n")
        print("RESULT " + json.dumps(result), flush=True)

    def fits(self, what: str, estimate_s: float) -> bool:
        if self.left() >= estimate_s:
            return True
        self.skipped.append(what)
        print(f"suite: skipping {what}: {self.left():.0f}s left, needs ~{estimate_s:.0f}s", flush=True)
        return False

    def run(
        self, name: str, cmd: list[str], *, env: dict[str, str] | None = None
    ) -> tuple[int, str, float, float]:
        """Run ``cmd`` in its own session, output to logs/<name>.log; killed at the deadline."""
        log_path = self.logs / f"{name}.log"
        timeout = max(5.0, self.left())
        start = time.time()
        print(
            f"suite: [{time.strftime('%H:%M:%S')}] {name}: {' '.join(cmd)} ({self.left():.0f}s left)",
            flush=True,
        )
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                cwd=REPO,
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = -9
                print(f"suite: {name} killed at the deadline", flush=True)
        end = time.time()
        text = log_path.read_text(errors="replace")
        print(f"suite: {name} rc={rc} in {end - start:.1f}s", flush=True)
        if rc != 0:
            print("\n".join(text.splitlines()[-25:]), flush=True)
        return rc, text, start, end

    # ----------------------------------------------------------------------------- configs
    def trainer_config(
        self,
        name: str,
        workload: str,
        gpus: int,
        *,
        max_steps: int,
        report_every: int | None = None,
        interval_steps: int | None = None,
    ) -> pathlib.Path:
        model, compile_, batch, _unit = WORKLOADS[workload]
        self.port += 10
        if model.startswith("resnet"):
            dataset = {
                "kind": "synthetic",
                "imageSize": 32 if SMOKE else 224,
                "numWorkers": 0 if SMOKE else 4,
            }
            hp = {"optimizer": "sgd", "learningRate": 0.1, "momentum": 0.9}
        else:
            dataset = {
                "kind": "synthetic",
                "sequenceLength": 64 if SMOKE else 1024,
                "numWorkers": 0 if SMOKE else 2,
            }
            hp = {"optimizer": "adamw", "learningRate": 6e-4, "weightDecay": 0.1}
        # Enough samples that no epoch ends inside a run (an epoch boundary restarts the loader).
        dataset["numSamples"] = batch * gpus * (max_steps + 20)
        checkpoint: dict[str, Any] = {"keepLast": 2}
        checkpoint["intervalSteps" if interval_steps else "intervalMinutes"] = interval_steps or 1440
        spec = {
            "workload": {"model": model, "dataset": dataset},
            "hyperparameters": {"maxSteps": max_steps, "batchSizePerWorker": batch, **hp},
            "precision": "bf16",
            "compile": compile_,
            "workers": {"replicas": gpus, "gpusPerWorker": 0, "cpusPerWorker": 1}
            if SMOKE
            else {"replicas": 1, "gpusPerWorker": gpus, "cpusPerWorker": 8},
            "checkpoint": checkpoint,
            "network": {"profile": "auto", "probeMegabytes": 256},
            "reporting": {
                "everySteps": report_every or REPORT_EVERY,
                "everySeconds": 3600,
                "metricsPort": self.port,
            },
            "failurePolicy": {"maxWorkerFailures": 2},
        }
        run = f"{name}-{int(time.time())}"
        config = {"jobName": name, "runName": run, "storagePath": "/tmp/trainop-bench", "spec": spec}
        path = self.logs / f"{name}.json"
        path.write_text(json.dumps(config, indent=1))
        return path

    # ------------------------------------------------------------------------------ phases
    def allreduce(self) -> None:
        if not self.fits("allreduce", 30):
            return
        _, text, _, _ = self.run(
            "allreduce", [*torchrun(2), str(HERE / "allreduce.py"), "--out", str(self.results_file)]
        )
        for line in text.splitlines():
            if line.startswith("ALLREDUCE "):
                self.results.append({"impl": "allreduce", **json.loads(line[len("ALLREDUCE ") :])})

    def bare(self, gpus: int, workloads: list[str], estimate_s: float) -> None:
        if not self.fits(f"bare{gpus}", estimate_s):
            return
        if SMOKE:
            workloads = [w.removesuffix("-compile") for w in workloads]
        _, text, _, _ = self.run(
            f"bare{gpus}",
            torchrun(gpus)
            + [
                str(HERE / "bare_ddp.py"),
                "--workloads",
                ",".join(workloads),
                "--warmup",
                str(WARMUP),
                "--steps",
                str(STEPS),
            ]
            + (["--cpu", "--tiny"] if SMOKE else []),
        )
        for line in text.splitlines():
            if line.startswith("BARE "):
                result = json.loads(line[len("BARE ") :])
                self.record(result)

    def trainer(
        self, impl: str, gpus: int, workload: str, estimate_s: float, *, recovery: bool = False
    ) -> None:
        """One trainer run. With ``recovery`` (Ray only) the run goes on past the timed steps: a checkpoint
        at step WARMUP+STEPS, one worker killed 5 steps later, the group restarts and trains 25 more."""
        name = f"{impl}{gpus}-{workload}"
        if not self.fits(name, estimate_s):
            return
        last = WARMUP + STEPS
        if recovery:
            config = self.trainer_config(name, workload, gpus, max_steps=last + 30, interval_steps=last)
        else:
            config = self.trainer_config(name, workload, gpus, max_steps=last)
        env: dict[str, str] = {}
        if impl == "ray":
            if self.ray_address:
                env["RAY_ADDRESS"] = self.ray_address
            if recovery:
                env["TRAINOP_INJECT_FAILURE_AT_STEP"] = str(last + 5)
            cmd = [sys.executable, "-m", "trainop_trainer", "--config", str(config)]
        else:
            cmd = [*torchrun(gpus), "-m", "trainop_trainer.launch", "--config", str(config)]
        rc, text, start, end = self.run(name, cmd, env=env)
        kill = KILL_LINE.search(text)
        before_kill = text[: kill.start()] if kill else text
        result = parse_trainer_log(before_kill, workload=workload, gpus=gpus, warmup=WARMUP, last=last)
        result.update(impl=impl, workload=workload, world_size=gpus, rc=rc, wall_s=end - start)
        result.update(self.sampler.window(start, end))
        self.record(result)
        if recovery:
            self.record(parse_recovery(text, kill, result, workload=workload, gpus=gpus, rc=rc))

    def ckpt(self) -> None:
        name = "ckpt-gpt-2"
        if not self.fits(name, 70):
            return
        config = self.trainer_config(name, "gpt", 2, max_steps=100000)
        _, text, _, _ = self.run(
            name,
            torchrun(2)
            + [
                str(HERE / "ckpt_bench.py"),
                "--config",
                str(config),
                "--warmup",
                "30",
                "--base",
                "60",
                "--after",
                "100",
                "--repeats",
                "2",
                "--modes",
                "background,sync,pageable",
            ]
            + (["--warmup", "2", "--base", "4", "--after", "4", "--repeats", "1"] if SMOKE else []),
        )
        for line in text.splitlines():
            if line.startswith("CKPT "):
                self.record(json.loads(line[len("CKPT ") :]))

    def start_warmer(self) -> None:
        """Compile GPT-small (DDP, one process) on GPU 1 into the shared Inductor cache while ResNet-50
        compiles on GPU 0: later GPT runs load it instead of compiling. Waited for before anything else
        uses GPU 1 (``wait_warmer``); its few steps overlap only ResNet-50's compilation on GPU 0."""
        log = (self.logs / "warmer.log").open("w")
        self._warmer_start = time.time()
        self._warmer: subprocess.Popen[bytes] | None = subprocess.Popen(
            [
                *torchrun(1),
                str(HERE / "bare_ddp.py"),
                "--workloads",
                "gpt-compile",
                "--warmup",
                "2",
                "--steps",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "1", "TORCHINDUCTOR_COMPILE_THREADS": "8"},
        )

    def wait_warmer(self) -> None:
        warmer = getattr(self, "_warmer", None)
        if warmer is None:
            return
        try:
            rc = warmer.wait(timeout=max(1.0, min(240.0, self.left())))
        except subprocess.TimeoutExpired:
            os.killpg(warmer.pid, signal.SIGKILL)
            rc = warmer.wait()
        print(
            f"suite: warmer rc={rc}, ended {time.time() - self._warmer_start:.0f}s after its start",
            flush=True,
        )
        self._warmer = None

    def start_ray(self) -> None:
        rc, _, _, _ = self.run(
            "ray-start",
            [
                sys.executable,
                "-m",
                "ray.scripts.scripts",
                "start",
                "--head",
                "--port=6390",
                "--num-gpus=2",
                "--num-cpus=32",
                "--include-dashboard=false",
                "--disable-usage-stats",
            ],
        )
        if rc == 0:
            self.ray_address = "127.0.0.1:6390"
        else:
            print("suite: ray start failed; every Ray run starts its own local Ray", flush=True)

    def stop_ray(self) -> None:
        if self.ray_address:
            subprocess.run(
                [sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"],
                capture_output=True,
                timeout=60,
            )


def torchrun(gpus: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}"]


def parse_recovery(
    text: str, kill: re.Match[str] | None, timed: dict[str, Any], *, workload: str, gpus: int, rc: int
) -> dict[str, Any]:
    """Kill -> resumed group -> first report after the resume (REPORT_EVERY steps later; the first step is
    estimated by taking off REPORT_EVERY - 1 steps at the timed step time)."""
    result: dict[str, Any] = {"impl": "recovery", "workload": workload, "world_size": gpus, "rc": rc}
    resume = RESUME_LINE.search(text, kill.end()) if kill else None
    if not (kill and resume):
        result["error"] = "no kill or no resume line in the log"
        return result
    resumed_step = int(resume.group(2))
    after = [m for m in STEP_LINE.finditer(text, resume.end()) if int(m.group(2)) > resumed_step]
    result.update(resumed_from_step=resumed_step, kill_to_resume_s=ts(resume.group(1)) - ts(kill.group(1)))
    if after:
        steps = int(after[0].group(2)) - resumed_step
        to_report = ts(after[0].group(1)) - ts(kill.group(1))
        rate = timed.get("samples_per_second")
        step_s = WORKLOADS[workload][2] * gpus / rate if rate else 0.0
        result.update(
            first_report_step=int(after[0].group(2)),
            kill_to_first_report_s=to_report,
            kill_to_first_step_s=to_report - (steps - 1) * step_s,
        )
    return result


def parse_trainer_log(text: str, *, workload: str, gpus: int, warmup: int, last: int) -> dict[str, Any]:
    batch = WORKLOADS[workload][2]
    windows: list[tuple[int, int, float]] = []  # (from step, to step, rate)
    previous = 0
    for match in STEP_LINE.finditer(text):
        step = int(match.group(2))
        rate = match.group(3)
        if step > previous and rate != "-":
            windows.append((previous, step, float(rate)))
        previous = max(previous, step)
    timed = [(a, b, r) for a, b, r in windows if a >= warmup and b <= last]
    result: dict[str, Any] = {}
    if timed:
        samples = sum((b - a) * batch * gpus for a, b, _ in timed)
        seconds = sum((b - a) * batch * gpus / r for a, b, r in timed)
        result["samples_per_second"] = samples / seconds
        result["timed_steps"] = sum(b - a for a, b, _ in timed)
        result["window_rates"] = [round(r, 1) for _, _, r in timed]
        if WORKLOADS[workload][3] == "tok":
            result["tokens_per_second"] = result["samples_per_second"] * 1024
    probe = PROBE_LINE.search(text)
    if probe:
        result["probe_busbw_gbps"] = float(probe.group(1))
    stalls = [float(m.group(2)) for m in CKPT_LINE.finditer(text)]
    if stalls:
        result["final_checkpoint_stall_s"] = stalls[-1]
    return result


# -------------------------------------------------------------------------------------------- table
def build_table(results: list[dict[str, Any]], skipped: list[str], gpu_name: str) -> str:
    def find(impl: str, workload: str, gpus: int) -> dict[str, Any] | None:
        for r in results:
            same = r.get("impl") == impl and r.get("workload") == workload and r.get("world_size") == gpus
            if same and r.get("samples_per_second"):
                return r
        return None

    flops = next((r["flops_per_token"] for r in results if r.get("flops_per_token")), None)
    lines = [
        f"Card: {gpu_name}. Throughput after {WARMUP} warm-up steps over {STEPS} steps; "
        "per GPU = total / GPUs;",
        "scaling = per-GPU throughput on 2 GPUs / on 1 GPU of the same implementation; "
        "ratio = trainer / bare DDP",
        "at the same GPU count; MFU = tokens/s x FLOPs per token / (989 TFLOP/s x GPUs), FLOPs per token = "
        f"6N + 12 L H Q T = {flops / 1e6:.1f} M"
        if flops
        else "",
        "",
        "| workload | GPUs | impl | total | per GPU | scaling | ratio to bare | MFU "
        "| peak mem GiB (NVML / allocated) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for workload in ("resnet50", "resnet50-compile", "resnet50-compile-w8", "gpt-compile", "gpt"):
        unit = WORKLOADS[workload][3]
        for gpus in (1, 2):
            for impl in ("bare", "ray", "launch"):
                r = find(impl, workload, gpus)
                if r is None:
                    continue
                seq = 64 if SMOKE else 1024
                rate = r["samples_per_second"] * (seq if unit == "tok" else 1)
                per_gpu = rate / gpus
                one = find(impl, workload, 1)
                scaling = ""
                if gpus == 2 and one:
                    one_rate = one["samples_per_second"] * (seq if unit == "tok" else 1)
                    scaling = f"{100 * per_gpu / one_rate:.1f} %"
                bare = find("bare", workload.removesuffix("-w8"), gpus)
                ratio = (
                    f"{100 * r['samples_per_second'] / bare['samples_per_second']:.1f} %"
                    if bare and impl != "bare"
                    else ""
                )
                mfu = ""
                if unit == "tok" and flops:
                    mfu = f"{100 * per_gpu * flops / (PEAK_BF16_TFLOPS * 1e12):.1f} %"
                mem = r.get("nvml_peak_gib")
                alloc = r.get("peak_allocated_gib")
                mem_text = " / ".join(f"{v:.1f}" if v else "-" for v in (mem, alloc))
                label = (
                    impl
                    if r.get("rc", 0) == 0
                    else f"{impl} (killed at the deadline: {r.get('timed_steps')} steps)"
                )
                lines.append(
                    f"| {workload} | {gpus} | {label} | {rate:,.0f} {unit}/s | {per_gpu:,.0f} | {scaling} "
                    f"| {ratio} | {mfu} | {mem_text} |"
                )
    ar = [r for r in results if r.get("impl") == "allreduce"]
    if ar:
        lines += ["", "| all-reduce | MiB | bus bandwidth GB/s | ms per op |", "| --- | --- | --- | --- |"]
        for r in ar:
            lines.append(f"| {r['kind']} | {r['mib']} | {r['busbw_gbps']:.1f} | {r['ms']:.3f} |")
        probes = [
            (r["impl"], r["workload"], r["probe_busbw_gbps"]) for r in results if r.get("probe_busbw_gbps")
        ]
        for impl, workload, bw in probes:
            lines.append(f"| trainer start-up probe ({impl}, {workload}) | 256 | {bw:.1f} | |")
    ck = [r for r in results if r.get("impl") == "checkpoint"]
    if ck:
        lines += [
            "",
            "| checkpoint mode | workload | GPUs | stall s (median) | cost s (median) "
            "| cost s (each, in order) "
            "| overhead every 60 s (median) | every 10 min |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in ck:
            lines.append(
                f"| {r['mode']} | {r['workload']}{' compiled' if r['compile'] else ''} | {r['world_size']} | "
                f"{r['stall_s']:.3f} | {r['cost_s']:.3f} | {', '.join(f'{c:.3f}' for c in r['costs_s'])} "
                f"| {r['overhead_at_60s_pct']:.2f} % "
                f"| {r['overhead_at_600s_pct']:.3f} % |"
            )
    for r in (r for r in results if r.get("impl") == "recovery"):
        num = {key: f"{value:.1f}" for key, value in r.items() if isinstance(value, float)}
        lines += [
            "",
            f"Recovery (Ray Train, {r['world_size']} GPUs, {r['workload']}, rc={r.get('rc')}): "
            f"worker killed -> group resumed from step {r.get('resumed_from_step')} in "
            f"{num.get('kill_to_resume_s', '-')} s; -> first step after the resume "
            f"{num.get('kill_to_first_step_s', '-')} s (first report, step {r.get('first_report_step')}: "
            f"{num.get('kill_to_first_report_s', '-')} s).",
        ]
    if skipped:
        lines += ["", "Not run (deadline): " + ", ".join(skipped)]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "out" / "gpu"))
    parser.add_argument("--deadline-s", type=float, default=540.0, help="seconds from --t0 (default: now)")
    parser.add_argument("--t0", type=float, default=None, help="epoch seconds the budget counts from")
    parser.add_argument("--only", default=None, help="comma-separated phases")
    parser.add_argument("--table", default=None, help="render the table of a results.jsonl and exit")
    parser.add_argument("--smoke", action="store_true", help="tiny CPU models: a test of this script")
    args = parser.parse_args()
    if args.smoke:
        set_smoke()
    if args.table:
        results = [json.loads(line) for line in pathlib.Path(args.table).read_text().splitlines() if line]
        gpu = next((r["gpu"] for r in results if r.get("gpu")), "(unknown card)")
        print(build_table(results, [], gpu))
        return 0

    # Ray 2.60's `ray start` turns token authentication on unless told otherwise; drivers here carry no token.
    os.environ["RAY_AUTH_MODE"] = "disabled"
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    elapsed = time.time() - (args.t0 or time.time())
    sampler = GpuSampler()
    sampler.start()
    suite = Suite(out=out, deadline=time.monotonic() + args.deadline_s - elapsed, sampler=sampler)
    phases = (
        args.only.split(",")
        if args.only
        else [
            "allreduce",
            "bare1",
            "bare2",
            "ray1",
            "ray2",
            "ckpt",
            "launch2",
            "launch1",
        ]
    )
    gpu_name = f"{len(sampler.names)}x {sampler.names[0]}" if sampler.names else "unknown"
    print(f"suite: {gpu_name}; phases {phases}; {suite.left():.0f}s", flush=True)
    try:
        if "bare1" in phases and not SMOKE:
            suite.start_warmer()
        if any(p.startswith("ray") for p in phases):
            suite.start_ray()
        for phase in phases:
            if phase == "allreduce" and not SMOKE:
                suite.allreduce()
            elif phase == "bare1":
                # ResNet-50 compiled first: it compiles cold while the warmer compiles GPT on GPU 1.
                suite.bare(1, ["resnet50-compile", "resnet50", "gpt-compile"], 150)
                suite.wait_warmer()
            elif phase == "bare2":
                suite.wait_warmer()
                suite.bare(2, ["resnet50", "resnet50-compile", "gpt-compile"], 75)
            elif phase == "ray1w8":
                suite.trainer("ray", 1, "resnet50-compile-w8", 95)
            elif phase in ("ray1", "ray2", "launch1", "launch2"):
                suite.wait_warmer()
                impl, gpus = phase[:-1], int(phase[-1])
                for workload in TRAINER_WORKLOADS:
                    recovery = phase == "ray2" and workload == "resnet50"
                    # Measured on 2x H200 (2026-11-26): a Ray fit spends 20-40 s starting, and its workers
                    # compiled cold (33-52 s) although the Inductor cache was warm; torchrun runs load it.
                    if impl == "ray":
                        estimate = (95 if "compile" in workload else 45) + (35 if recovery else 0)
                    else:
                        estimate = 45 if "compile" in workload else 25
                    suite.trainer(impl, gpus, workload, estimate, recovery=recovery)
            elif phase == "ckpt":
                suite.ckpt()
    finally:
        suite.stop_ray()
        sampler.stop()
        table = build_table(suite.results, suite.skipped, gpu_name)
        (out / "table.md").write_text(table + "\n")
        with (out / "nvml.csv").open("w") as f:
            for t, gpu, used, util in sampler.samples:
                f.write(f"{t:.2f},{gpu},{used:.2f},{util:.0f}\n")
        with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
            tar.add(suite.logs, arcname="logs")
        for path in suite.logs.iterdir():
            path.unlink()
        suite.logs.rmdir()
        print("\n" + table, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
