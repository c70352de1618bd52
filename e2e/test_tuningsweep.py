"""A TuningSweep end to end: three trials of the tiny MLP on Ray Tune, Succeeded with a best trial on status.

The sweep's RayJob runs ``python -m trainop_trainer.sweep`` (the operator's entrypoint for sweeps). If that
driver fails — or does not exist yet — the RayJob fails and this scenario fails with the RayJob's message
(Ray's last log lines of the entrypoint) in its assertion: never a skip.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import scenario as scenario_module
from e2e.scenario import Scenario, ScriptRun, acts, phase

pytestmark = pytest.mark.e2e

MANIFEST = Path(__file__).parent / "manifests" / "sweep-tiny.yaml"
SPEC = yaml.safe_load(MANIFEST.read_text())["spec"]
NUM_TRIALS: int = SPEC["numTrials"]
SEARCH = SPEC["searchSpace"]["hyperparameters.learningRate"]
RUN_TIMEOUT_S = 600


def status(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("status") or {}


def act_apply_sweep(run: Scenario) -> dict[str, Any]:
    run.apply(MANIFEST)
    finished = run.wait_for(
        lambda obj: phase(obj) in ("Succeeded", "Failed") or bool(status(obj).get("failures")),
        timeout_s=RUN_TIMEOUT_S,
        what="the sweep to finish",
    )
    return {"finished": finished}


@acts(act_apply_sweep)
def test_tuning_sweep_runs_its_trials_to_succeeded_with_a_best_trial(e2e_script: ScriptRun) -> None:
    run, facts = e2e_script.outcome()
    finished = facts["finished"]
    failures = status(finished).get("failures") or []
    assert not failures, "the sweep's RayJob failed:\n" + "\n".join(
        f"attempt {f['attempt']}: {f['reason']}: {f['message']}" for f in failures
    )
    assert phase(finished) == "Succeeded", status(finished)

    s = status(finished)
    trials = s["trials"]
    assert trials["total"] == NUM_TRIALS and trials["succeeded"] == NUM_TRIALS, trials
    assert trials["failed"] == 0 and trials["running"] == 0 and trials["pending"] == 0, trials
    best = s["bestTrial"]
    assert best["metric"] == "loss" and math.isfinite(best["value"]), best
    learning_rate = best["parameters"]["hyperparameters.learningRate"]
    assert SEARCH["lower"] <= learning_rate <= SEARCH["upper"], best
    # While it ran, `kubectl get tuningsweeps` showed trials running; at the end BEST is the best value.
    cells = [c for _, c in run.column_history()]
    assert any((c["Running"] or 0) >= 1 for c in cells if c["Phase"] == "Running"), cells
    assert cells[-1]["Best"] == best["value"], cells[-1]

    # The driver wrote trials/bestTrial with the sweep's own ServiceAccount; the operator never did.
    stored = run.get()
    assert not {"trials", "bestTrial"} & scenario_module.managed_status_fields(stored, "trainop")
    audit = run.cluster.audit_log
    if audit is not None:
        writers = audit.writers(namespace=run.namespace, resource="tuningsweeps/status", name=run.name)
        assert set(writers) == {run.trainer_identity, run.env.operator_identity}, writers
