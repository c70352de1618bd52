"""GPT-1.3B with FSDP2 on N GPUs: the bare reference against the trainer, the checkpoint stall, the finder.

    python3 bench/gpu/fsdp_suite.py --out OUT [--deadline-s 540] [--only bare2,launch2,finder2,bare1]
    python3 bench/gpu/fsdp_suite.py --table A/results.jsonl [B/results.jsonl ...]   # offline, combines calls

Run it through ``bench/gpu/run_fsdp.sh`` on the device machine, one call per GPU count (it installs the
carried wheels and sets the environment). Phases, in the order given (priority order; one that no longer
fits before the deadline is skipped and named as skipped):

- ``bareN``: ``bare_fsdp.py`` on N GPUs: GPT-XL (``gpt-xl``: 1.32B, 24 x 2048, sequence 2048), batch
  ``--batch`` per GPU, bf16 mixed precision, each block compiled, AdamW; ``--warmup`` + ``--steps`` steps.
- ``launchN``: ``torchrun -m trainop_trainer.launch`` with the same model, batch, precision, optimizer,
  ``parallelism.strategy: fsdp``, ``compile: true``, activation checkpointing off. Throughput from rank 0's
  report windows between ``--warmup`` and ``--warmup + --steps``; then a checkpoint at that step (DCP async
  save, pinned staging) and ``CKPT_AFTER`` more steps: the stall on the training thread and the time to
  commit, from the checkpointer's log lines.
- ``finderN``: the trainer with ``batchSizePerWorker: auto`` (``multipleOf`` ``--finder-step``, eager: probing
  compiled steps would recompile per shape), a few steps at the chosen batch (it fits in training, data
  loader and all); then the same job with the chosen batch + ``--finder-step`` fixed: it must run out of
  memory (the choice is within one step of the largest batch that fits).

Results go to ``OUT/results.jsonl`` and ``OUT/table.md``; MFU = tokens/s x FLOPs per token / (989 TFLOP/s x
GPUs), FLOPs per token = 6N + 12 L H Q T (as ``bare_ddp.py``). Peak memory: the bare run's allocator peaks,
NVML's memory used for the trainer (context and NCCL included).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import tarfile
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import suite  # noqa: E402  (the DDP suite's runner, NVML sampler and log formats)

MODEL = "gpt-xl"
SEQUENCE = 2048
CKPT_AFTER = 10
COMMIT_LINE = re.compile(r"checkpoint step (\d+) committed to \S+ in ([\d.]+)s")
FINDER_LINE = re.compile(r"batch size (\d+) per worker \(found\)")
OOM = re.compile(r"OutOfMemoryError|CUDA out of memory")
ESTIMATE_S = {"bare": 140.0, "launch": 170.0, "finder": 170.0}


class FsdpSuite(suite.Suite):
    batch: int = 8
    warmup: int = 20
    steps: int = 40
    finder_step: int = 1

    def record(self, result: dict[str, Any]) -> None:
        result.setdefault("gpu_name", self.sampler.names[0] if self.sampler.names else "?")
        super().record(result)

    def job(self, name: str, gpus: int, *, batch: int | str, max_steps: int, **spec: Any) -> pathlib.Path:
        self.port += 10
        hyperparameters: dict[str, Any] = {
            "maxSteps": max_steps,
            "batchSizePerWorker": batch,
            "optimizer": "adamw",
            "learningRate": 6e-4,
            "weightDecay": 0.1,
            "schedule": {"kind": "constant"},
        }
        if batch == "auto":
            hyperparameters["batchSizeSearch"] = {"multipleOf": self.finder_step, "maxBatchSize": 256}
        body = {
            "workload": {
                "model": MODEL,
                # Enough samples that no epoch ends inside a run; 2 loader workers per rank.
                "dataset": {
                    "kind": "synthetic",
                    "sequenceLength": SEQUENCE,
                    "numSamples": 256 * gpus * (max_steps + 20),
                    "numWorkers": 2,
                },
            },
            "hyperparameters": hyperparameters,
            "precision": "bf16",
            "parallelism": {"strategy": "fsdp"},
            "workers": {"replicas": 1, "gpusPerWorker": gpus, "cpusPerWorker": 8},
            "checkpoint": {"intervalMinutes": 1440, "keepLast": 1},
            "network": {"profile": "auto", "probeMegabytes": 256},
            "reporting": {"everySteps": suite.REPORT_EVERY, "everySeconds": 3600, "metricsPort": self.port},
            **spec,
        }
        run = f"{name}-{int(time.time())}"
        config = {"jobName": name, "runName": run, "storagePath": "/tmp/trainop-bench", "spec": body}
        path = self.logs / f"{name}.json"
        path.write_text(json.dumps(config, indent=1))
        return path

    def bare_fsdp(self, gpus: int) -> None:
        name = f"bare{gpus}"
        if not self.fits(name, ESTIMATE_S["bare"]):
            return
        cmd = [
            *suite.torchrun(gpus),
            str(HERE / "bare_fsdp.py"),
            "--model",
            MODEL,
            "--batch",
            str(self.batch),
        ]
        cmd += [
            "--sequence",
            str(SEQUENCE),
            "--compile",
            "--warmup",
            str(self.warmup),
            "--steps",
            str(self.steps),
        ]
        rc, text, start, end = self.run(name, cmd)
        for line in text.splitlines():
            if line.startswith("BARE "):
                self.record({**json.loads(line[len("BARE ") :]), "rc": rc, **self.sampler.window(start, end)})

    def launch(self, gpus: int) -> None:
        name = f"launch{gpus}"
        if not self.fits(name, ESTIMATE_S["launch"]):
            return
        last = self.warmup + self.steps
        config = self.job(name, gpus, batch=self.batch, max_steps=last + CKPT_AFTER, compile=True)
        # The checkpoint at step `last`: after the timed windows, before CKPT_AFTER more steps.
        data = json.loads(config.read_text())
        data["spec"]["checkpoint"] = {"intervalSteps": last, "keepLast": 1}
        config.write_text(json.dumps(data, indent=1))
        rc, text, start, end = self.run(
            name, [*suite.torchrun(gpus), "-m", "trainop_trainer.launch", "--config", str(config)]
        )
        result = trainer_windows(text, gpus=gpus, batch=self.batch, warmup=self.warmup, last=last)
        stalls = {int(m.group(1)): float(m.group(2)) for m in suite.CKPT_LINE.finditer(text)}
        commits = {int(m.group(1)): float(m.group(2)) for m in COMMIT_LINE.finditer(text)}
        result.update(
            impl="trainer-fsdp",
            workload=f"{MODEL}-compile",
            world_size=gpus,
            batch_per_gpu=self.batch,
            sequence_length=SEQUENCE,
            rc=rc,
            wall_s=end - start,
            checkpoint_stall_s=stalls.get(last),
            checkpoint_commit_s=commits.get(last),
            **self.sampler.window(start, end),
        )
        self.record(result)

    def finder(self, gpus: int) -> None:
        name = f"finder{gpus}"
        if not self.fits(name, ESTIMATE_S["finder"]):
            return
        config = self.job(name, gpus, batch="auto", max_steps=5)
        cmd = [*suite.torchrun(gpus), "-m", "trainop_trainer.launch", "--config", str(config)]
        rc, text, start, end = self.run(name, cmd)
        found = FINDER_LINE.search(text)
        result: dict[str, Any] = {"impl": "finder", "workload": MODEL, "world_size": gpus, "rc": rc}
        result["multiple_of"] = self.finder_step
        result.update(self.sampler.window(start, end))
        if found is None:
            result["error"] = "no finder line in the log"
            self.record(result)
            return
        chosen = int(found.group(1))
        run_dir = pathlib.Path("/tmp/trainop-bench") / json.loads(config.read_text())["runName"]
        choice = json.loads((run_dir / "trainop" / "batch-size.json").read_text())
        result.update(
            chosen=chosen,
            fits_in_training=rc == 0,
            budget_bytes=choice["budgetBytes"],
            probes=choice["probes"],
        )
        over = chosen + self.finder_step
        check = self.job(f"{name}-over", gpus, batch=over, max_steps=3)
        rc_over, text_over, _, _ = self.run(
            f"{name}-over", [*suite.torchrun(gpus), "-m", "trainop_trainer.launch", "--config", str(check)]
        )
        result.update(over=over, over_rc=rc_over, over_out_of_memory=bool(OOM.search(text_over)))
        result["within_one_step"] = result["fits_in_training"] and result["over_out_of_memory"]
        self.record(result)


def trainer_windows(text: str, *, gpus: int, batch: int, warmup: int, last: int) -> dict[str, Any]:
    windows: list[tuple[int, int, float]] = []
    previous = 0
    for match in suite.STEP_LINE.finditer(text):
        step, rate = int(match.group(2)), match.group(3)
        if step > previous and rate != "-":
            windows.append((previous, step, float(rate)))
        previous = max(previous, step)
    timed = [(a, b, r) for a, b, r in windows if a >= warmup and b <= last]
    if not timed:
        return {"error": "no report windows in the timed range"}
    samples = sum((b - a) * batch * gpus for a, b, _ in timed)
    seconds = sum((b - a) * batch * gpus / r for a, b, r in timed)
    return {
        "samples_per_second": samples / seconds,
        "tokens_per_second": samples / seconds * SEQUENCE,
        "timed_steps": sum(b - a for a, b, _ in timed),
        "window_rates": [round(r, 2) for _, _, r in timed],
    }


def build_table(results: list[dict[str, Any]], skipped: list[str], gpu_name: str) -> str:
    flops = next((r["flops_per_token"] for r in results if r.get("flops_per_token")), None)
    bare = {
        r["world_size"]: r for r in results if r.get("impl") == "bare-fsdp" and r.get("tokens_per_second")
    }
    lines = [
        f"Card: {gpu_name}. GPT-XL ({MODEL}, 1.32B), sequence {SEQUENCE}, bf16 (FSDP2 MixedPrecisionPolicy), "
        "blocks compiled, AdamW, no activation checkpointing.",
        "MFU = tokens/s x FLOPs per token / (989 TFLOP/s x GPUs)"
        + (f", FLOPs per token = 6N + 12 L H Q T = {flops / 1e9:.2f} G" if flops else ""),
        "",
        "| impl | GPUs | batch/GPU | tokens/s | per GPU | scaling | MFU | trainer / bare | peak GiB "
        "| ckpt stall s | ckpt commit s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in sorted(results, key=lambda r: (r.get("impl", ""), r.get("world_size", 0))):
        if r.get("impl") not in ("bare-fsdp", "trainer-fsdp") or not r.get("tokens_per_second"):
            continue
        gpus, tps = r["world_size"], r["tokens_per_second"]
        per_gpu = tps / gpus
        same_impl_one = min(
            (x for x in results if x.get("impl") == r["impl"] and x.get("tokens_per_second")),
            key=lambda x: x["world_size"],
        )
        scaling = (
            100 * per_gpu / (same_impl_one["tokens_per_second"] / same_impl_one["world_size"])
            if same_impl_one["world_size"] < gpus
            else None
        )
        mfu = 100 * per_gpu * flops / (suite.PEAK_BF16_TFLOPS * 1e12) if flops else None
        ratio = (
            100 * tps / bare[gpus]["tokens_per_second"]
            if r["impl"] == "trainer-fsdp" and gpus in bare
            else None
        )
        peak = r.get("max_reserved_gib") or r.get("nvml_peak_gib")
        lines.append(
            f"| {r['impl']} | {gpus} | {r.get('batch_per_gpu', '')} | {tps:,.0f} | {per_gpu:,.0f} | "
            f"{suite.pct(scaling)} | {suite.pct(mfu)} | {suite.pct(ratio)} | {suite.fmt(peak, 1)} | "
            f"{suite.fmt(r.get('checkpoint_stall_s'), 3)} | {suite.fmt(r.get('checkpoint_commit_s'), 2)} |"
        )
    for r in results:
        if r.get("impl") == "finder":
            probes = ", ".join(
                "{}: {}".format(
                    p["batch"], "OOM" if p["peak_bytes"] is None else f"{p['peak_bytes'] / 2**30:.1f}"
                )
                for p in r.get("probes", [])
            )
            budget_gib = suite.fmt((r.get("budget_bytes") or 0) / 2**30, 1)
            lines += [
                "",
                f"Batch-size finder ({r['world_size']} GPUs, eager, multipleOf {r.get('multiple_of')}): "
                f"chose {r.get('chosen')} per GPU (trained: {r.get('fits_in_training')}); "
                f"{r.get('over')} per GPU ran out of memory: {r.get('over_out_of_memory')} -> within one "
                f"step: {r.get('within_one_step')}. Budget {budget_gib} GiB; probes (batch: peak GiB) "
                f"{probes}.",
            ]
    if skipped:
        lines += ["", "Skipped (deadline or GPUs): " + ", ".join(skipped)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/fsdp")
    parser.add_argument("--t0", type=float, default=None)
    parser.add_argument("--deadline-s", type=float, default=540.0)
    parser.add_argument("--only", default=None, help="phases, e.g. bare2,launch2,finder2,bare1")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--finder-step", type=int, default=1)
    parser.add_argument("--table", nargs="*", default=None, help="results.jsonl files: print the table only")
    args = parser.parse_args(argv)
    if args.table is not None:
        results = suite.load_results(args.table)
        names = sorted({str(r.get("gpu_name")) for r in results if r.get("gpu_name")})
        print(build_table(results, [], "; ".join(names) or "(unknown card)"), end="")
        return 0
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = args.t0 if args.t0 is not None else time.time()
    deadline = time.monotonic() + args.deadline_s - (time.time() - started)
    sampler = suite.GpuSampler()
    sampler.start()
    bench = FsdpSuite(out=out, deadline=deadline, sampler=sampler)
    bench.batch, bench.warmup, bench.steps, bench.finder_step = (
        args.batch,
        args.warmup,
        args.steps,
        args.finder_step,
    )
    gpus = suite.visible_gpus()
    phases = args.only.split(",") if args.only else [f"bare{gpus}", f"launch{gpus}", f"finder{gpus}", "bare1"]
    for phase in phases:
        match = re.fullmatch(r"(bare|launch|finder)(\d+)", phase)
        if match is None:
            parser.error(f"unknown phase {phase!r}")
        kind, count = match.group(1), int(match.group(2))
        if count > gpus or (phase == "bare1" and gpus == 1 and f"bare{gpus}" in phases[:-1]):
            bench.skipped.append(phase)
            continue
        {"bare": bench.bare_fsdp, "launch": bench.launch, "finder": bench.finder}[kind](count)
    sampler.stop()
    table = build_table(bench.results, bench.skipped, sampler.names[0] if sampler.names else "(no NVML)")
    (out / "table.md").write_text(table)
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
        tar.add(bench.logs, arcname="logs")
    print(table, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
