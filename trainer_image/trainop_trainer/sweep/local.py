"""Local mode for sweeps: run a TuningSweep manifest on this machine (``trainop run sweep.yaml``).

``run_sweep_manifest`` validates the manifest with the API's loader, fits the template to the machine with
the TrainingJob local mode's own rule (``trainop_trainer.local.plan_local``: workers capped to local GPUs,
or to CPU cores with gloo), and caps ``maxConcurrentTrials`` to what the GPUs can hold at once. Every
change is printed as a note. The sweep then runs with the same driver as on a cluster
(``driver.run``), its experiment under ``<state_dir>/<name>/``; running the same manifest again restores
that experiment (finished trials are kept), ``fresh=True`` starts over.

Ray's logical CPUs are sized on purpose: one per concurrent Train worker plus headroom of 4 (and never
fewer than the cores). Trial drivers and Train controllers ask for no CPU, but every Ray actor needs a
worker process, and with logical CPUs equal to the cores of a small machine (2) Ray starts those processes
too slowly: every Train worker group timed out at start-up. With ``maxConcurrentTrials x workers + 4`` the
same sweep runs.

While it runs, a table of trials (id, state, step, the objective's last and best value, parameters) is
printed whenever it changes, from the ``trials.json`` the driver's status callback writes. At the end the
status is printed as the TuningSweep would carry it (YAML).
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import shutil
import sys
import threading
from typing import Any, TextIO

import yaml

from trainop.api import trainer_config, trainingjob, tuningsweep
from trainop_trainer import local as job_local
from trainop_trainer.sweep import layout

DEFAULT_STATE_DIR = job_local.DEFAULT_STATE_DIR
STATUS_INTERVAL_S = 1.0
HEADROOM_CPUS = 4


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _local_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def plan_sweep(
    spec: tuningsweep.TuningSweepSpec, *, workers: int | None, cpu_count: int, gpu_count: int
) -> tuple[tuningsweep.TuningSweepSpec, int, int, list[str]]:
    """Fit ``spec`` to this machine (pure): the local spec, logical CPUs, GPUs for Ray, notes."""
    job_plan = job_local.plan_local(spec.template, workers=workers, cpu_count=cpu_count, gpu_count=gpu_count)
    notes = [note for note in job_plan.notes if not note.startswith("Ray starts with")]
    concurrent = spec.max_concurrent_trials
    if job_plan.num_gpus:
        fits = max(1, gpu_count // job_plan.num_workers)
        if fits < concurrent:
            notes.append(
                f"maxConcurrentTrials {concurrent} x {job_plan.num_workers} GPU worker(s) exceeds this "
                f"machine's {gpu_count} GPU(s): running {fits} trial(s) at a time"
            )
            concurrent = fits
    local_spec = spec.model_copy(update={"template": job_plan.spec, "max_concurrent_trials": concurrent})
    logical = max(concurrent * job_plan.num_workers + HEADROOM_CPUS, cpu_count)
    notes.append(
        f"Ray starts with {logical} logical CPUs for {concurrent} concurrent trial(s) x "
        f"{job_plan.num_workers} worker(s) on {cpu_count} core(s); trial drivers take no CPU"
    )
    return local_spec, logical, job_plan.num_gpus, notes


class TrialTable:
    """Prints the table of trials from ``trials.json`` whenever it changes."""

    def __init__(self, trials_file: pathlib.Path, *, metric: str, names: list[str], out: TextIO) -> None:
        self.trials_file = trials_file
        self.metric = metric
        self.names = names
        self.out = out
        self._last = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sweep-table", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.render()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.render()

    def rows(self) -> list[dict[str, Any]]:
        try:
            rows: list[dict[str, Any]] = json.loads(self.trials_file.read_text())["trials"]
        except (OSError, ValueError, KeyError):
            return []
        return rows

    def format(self, rows: list[dict[str, Any]]) -> str:
        def num(value: Any) -> str:
            return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)

        header = ["TRIAL", "STATE", "STEP", self.metric.upper(), "BEST", *self.names]
        table = [header]
        for row in rows:
            params = row.get("parameters") or {}
            table.append(
                [
                    str(row["id"]),
                    str(row["state"]),
                    num(row.get("step")),
                    num(row.get("value")),
                    num(row.get("best")),
                    *(num(params.get(name)) for name in self.names),
                ]
            )
        widths = [max(len(line[i]) for line in table) for i in range(len(header))]
        lines = [
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
            for line in table
        ]
        errors = [f"  {row['id']}: {row['error']}" for row in rows if row.get("error")]
        return "\n".join(lines + errors)

    def render(self) -> None:
        rows = self.rows()
        if not rows:
            return
        text = self.format(rows)
        if text != self._last:
            self._last = text
            self.out.write(text + "\n\n")
            self.out.flush()


def final_status(
    *, outcome: str, reason: str | None, records: dict[str, Any], start_time: str
) -> tuningsweep.TuningSweepStatus:
    """The status the operator would show (its fields filled in as it would) plus the driver's records."""
    if outcome == "succeeded":
        phase = trainingjob.Phase.SUCCEEDED
        condition = {
            "type": "Succeeded",
            "status": "True",
            "reason": "Completed",
            "message": "sweep completed",
        }
    else:
        phase = trainingjob.Phase.FAILED
        condition = {
            "type": "Failed",
            "status": "True",
            "reason": "Interrupted" if outcome == "interrupted" else "SweepFailed",
            "message": (reason or "")[:2000],
        }
    return tuningsweep.TuningSweepStatus.model_validate(
        {
            "phase": phase,
            "conditions": [{**condition, "lastTransitionTime": _now()}],
            "attempt": 1,
            "restarts": 0,
            "startTime": start_time,
            "completionTime": _now(),
            "trials": records.get("trials"),
            "bestTrial": records.get("bestTrial"),
            "updated": records.get("updated"),
        },
        by_alias=True,
    )


def run_sweep_manifest(
    path: str | os.PathLike[str],
    *,
    workers: int | None = None,
    inject_failure_at_step: int | None = None,
    state_dir: str | os.PathLike[str] = DEFAULT_STATE_DIR,
    fresh: bool = False,
    verbose: bool = False,
    out: TextIO | None = None,
) -> int:
    """Run every TuningSweep in the manifest file locally; returns the exit code (0 the sweep succeeded,
    1 it failed, 2 invalid manifest or search space, 130 a Ctrl+C left started trials to resume).
    ``workers`` caps each trial's workers;
    ``inject_failure_at_step`` (or $TRAINOP_INJECT_FAILURE_AT_STEP) makes every trial kill one of its
    workers once (``config.injected_failure_note`` says when)."""
    out = out or sys.stdout
    return job_local.run_each(
        path,
        tuningsweep.TuningSweep,
        "sweep local mode",
        inject_failure_at_step,
        lambda sweep, inject: _run_sweep(
            sweep, workers=workers, inject=inject, state_dir=state_dir, fresh=fresh, verbose=verbose, out=out
        ),
    )


def _run_sweep(
    sweep: tuningsweep.TuningSweep,
    *,
    workers: int | None,
    inject: int | None,
    state_dir: str | os.PathLike[str],
    fresh: bool,
    verbose: bool,
    out: TextIO,
) -> int:
    from trainop_trainer import ray_train
    from trainop_trainer.logs import configure_logging
    from trainop_trainer.sweep import driver, space

    name = sweep.metadata.name
    spec, logical_cpus, gpus, notes = plan_sweep(
        sweep.spec, workers=workers, cpu_count=os.cpu_count() or 1, gpu_count=_local_gpus()
    )
    try:
        space.validate(spec)
    except space.SearchSpaceError as exc:
        print(f"trainop: error: {exc}", file=sys.stderr)
        return 2
    config = trainer_config.SweepConfig(
        sweep_name=name,
        experiment_name=name,
        storage_path=str(pathlib.Path(state_dir).resolve()),
        attempt=1,
        spec=spec,
        status_target=None,
    )
    paths = layout.SweepPaths.for_config(config)
    if fresh and paths.experiment_dir.exists():
        shutil.rmtree(paths.experiment_dir)
    paths.experiment_dir.mkdir(parents=True, exist_ok=True)
    (paths.experiment_dir / "sweep.json").write_text(trainer_config.dumps(config))
    print(f"trainop: running TuningSweep {name} locally; state in {paths.experiment_dir}", file=out)
    for note in notes:
        print(f"trainop: note: {note}", file=out)
    out.flush()
    if verbose:
        configure_logging(rank=None)
    ray_train.ensure_ray(
        num_cpus=logical_cpus, num_gpus=gpus or None, log_to_driver=verbose, quiet=not verbose
    )
    start_time = _now()
    table = TrialTable(
        paths.trials_file, metric=spec.objective.metric, names=list(spec.search_space), out=out
    )
    table.start()
    try:
        result = driver.run(config, status_interval_s=STATUS_INTERVAL_S, inject_failure_at_step=inject)
    finally:
        table.stop()
    if result.restored:
        print(
            "trainop: note: resumed the earlier experiment in the state directory (fresh=True starts over)",
            file=out,
        )
    if result.reason:
        print(f"trainop: sweep {result.outcome}: {result.reason}", file=sys.stderr)
    status = final_status(
        outcome=result.outcome, reason=result.reason, records=result.status, start_time=start_time
    )
    print(f"trainop: TuningSweep {name} {result.outcome}; status:", file=out)
    print(yaml.safe_dump({"status": status.to_wire()}, sort_keys=False).rstrip(), file=out)
    return result.exit_code
