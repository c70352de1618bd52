"""``python -m trainop_trainer.sweep``: the RayJob entrypoint refuses a bad config before Ray starts."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

from trainop.api import trainer_config

SPEC = {
    "template": {"workload": {"model": "mlp"}, "hyperparameters": {"maxSteps": 10}},
    "searchSpace": {"hyperparameters.learningRate": {"type": "loguniform", "lower": 1e-4, "upper": 0.1}},
    "objective": {"metric": "accuracy", "mode": "max"},
}


def run_entrypoint(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainop_trainer.sweep", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"},
    )


def test_an_objective_metric_the_trainer_does_not_report_exits_2_naming_the_field(
    tmp_path: pathlib.Path,
) -> None:
    # The API refuses such a sweep (so does the CRD): this config is one an older operator could have written.
    valid = {**SPEC, "objective": {**SPEC["objective"], "metric": "loss"}}
    config = trainer_config.SweepConfig.model_validate(
        {"sweepName": "s", "experimentName": "s", "storagePath": str(tmp_path), "spec": valid}, by_alias=True
    )
    raw = json.loads(trainer_config.dumps(config))
    raw["spec"]["objective"]["metric"] = "accuracy"
    path = tmp_path / "trainer.json"
    path.write_text(json.dumps(raw))
    done = run_entrypoint("--config", str(path))
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("trainop: error: ") and "Traceback" not in done.stderr, done.stderr
    assert "spec.objective.metric 'accuracy' is not reported by the built-in trainer: use one of" in last
    assert not (tmp_path / "s").exists()  # nothing started


def test_a_missing_config_exits_2_saying_how_to_pass_one(tmp_path: pathlib.Path) -> None:
    done = run_entrypoint("--config", str(tmp_path / "nope.json"))
    assert done.returncode == 2
    assert "config file" in done.stderr and "pass --config or set TRAINOP_CONFIG" in done.stderr
