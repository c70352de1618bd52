"""A TuningSweep in local mode: Optuna (seeded) proposes learning rates, ASHA cuts the weak trials, the
driver keeps status.json (the CR's status records) and prints a live table, then the final status.

One sweep (4 trials, 2 at a time, up to 200 steps; 6, 3 and 400 until 2026-11-29: 460 CPU-seconds of
``make test``, issue #14) runs once for the module; each test checks one behaviour of its outcome
against Tune's own record of the experiment (``ExperimentAnalysis``, the trials' result.json), not against
the driver's books. The learning-rate choices are 0.3 and 0.1 (the loss falls) and 1e-5 and 3e-6 (it stays
near ln 10 ≈ 2.3), so ASHA, which stops a trial worse than its peers at a rung, has weak trials to cut.
"""

from __future__ import annotations

import dataclasses
import io
import pathlib
from typing import Any

import pytest
import yaml

from tests.sweep import sweep_support
from trainop.api import trainer_config
from trainop_trainer.sweep import driver, space

pytestmark = [pytest.mark.ray, pytest.mark.slow]

NAME = "lr-asha"
MAX_T = 200
NUM_TRIALS = 4


def manifest() -> dict[str, Any]:
    template = sweep_support.mlp_template(max_steps=MAX_T, hidden_dim=256, interval_steps=50)
    # 200 steps of this MLP train in ~0.2 s here: a report to Ray (and Tune) every 0.02 s gives ASHA results
    # at its rungs (20, 40, 80, 160). With 0.5 s a fast machine reported once, at the end (2026-11-29).
    template["reporting"]["everySeconds"] = 0.02
    return {
        "apiVersion": "trainop.dev/v1alpha1",
        "kind": "TuningSweep",
        "metadata": {"name": NAME},
        "spec": {
            "template": template,
            "searchSpace": {
                "hyperparameters.learningRate": {"type": "choice", "values": [0.3, 0.1, 1e-5, 3e-6]}
            },
            "objective": {"metric": "loss", "mode": "min"},
            "algorithm": "optuna",
            "seed": 7,
            "scheduler": {"type": "asha", "gracePeriod": 20, "maxT": MAX_T, "reductionFactor": 2},
            "numTrials": NUM_TRIALS,
            "maxConcurrentTrials": 2,
            "maxFailedTrials": 0,
        },
    }


@dataclasses.dataclass(frozen=True)
class LocalSweep:
    exit_code: int
    output: str
    experiment_dir: pathlib.Path
    status: dict[str, Any]  # <experiment>/status.json: the driver's status records
    rows: list[dict[str, Any]]  # <experiment>/trials.json: the table's rows, in Tune's creation order
    tune_trials: list[Any]  # ExperimentAnalysis(...).trials


@pytest.fixture(scope="module")
def local_sweep(sweep_ray: None, tmp_path_factory: pytest.TempPathFactory) -> LocalSweep:
    from trainop_trainer.sweep import local

    root = tmp_path_factory.mktemp("asha")
    path = root / "sweep.yaml"
    path.write_text(yaml.safe_dump(manifest()))
    out = io.StringIO()
    code = local.run_sweep_manifest(path, state_dir=root / "state", out=out)
    experiment_dir = root / "state" / NAME
    return LocalSweep(
        exit_code=code,
        output=out.getvalue(),
        experiment_dir=experiment_dir,
        status=sweep_support.read_json(experiment_dir / "status.json"),
        rows=sweep_support.read_json(experiment_dir / "trials.json")["trials"],
        tune_trials=sweep_support.tune_trials(experiment_dir),
    )


def last_step(sweep: LocalSweep, trial_id: str) -> int:
    return int(sweep_support.reported(sweep.experiment_dir, trial_id)[-1]["step"])


def test_asha_stops_weak_trials_before_max_t_and_the_status_counts_them_early_stopped(
    local_sweep: LocalSweep,
) -> None:
    assert local_sweep.exit_code == 0, local_sweep.output
    ids = [t.trial_id for t in local_sweep.tune_trials]
    assert len(ids) == NUM_TRIALS and all(t.status == "TERMINATED" for t in local_sweep.tune_trials)
    cut = {i for i in ids if last_step(local_sweep, i) < MAX_T}
    assert cut, "ASHA stopped no trial before maxT"
    states = {row["id"]: row["state"] for row in local_sweep.rows}
    assert {i for i, s in states.items() if s == "earlyStopped"} == cut
    assert {i for i, s in states.items() if s == "succeeded"} == set(ids) - cut
    assert local_sweep.status["trials"] == {
        "total": NUM_TRIALS,
        "pending": 0,
        "running": 0,
        "succeeded": NUM_TRIALS - len(cut),
        "failed": 0,
        "earlyStopped": len(cut),
    }
    # The trials it cut are the weak ones: each ended worse than the best value of the sweep.
    best = local_sweep.status["bestTrial"]["value"]
    for trial_id in cut:
        assert sweep_support.reported(local_sweep.experiment_dir, trial_id)[-1]["loss"] > best


def test_best_trial_is_the_best_loss_observed_among_the_completed_trials(local_sweep: LocalSweep) -> None:
    observed = {
        t.trial_id: min(r["loss"] for r in sweep_support.reported(local_sweep.experiment_dir, t.trial_id))
        for t in local_sweep.tune_trials
        if t.status == "TERMINATED"
    }
    lowest = min(observed.values())
    # Trials with the same learning rate train identically, so ties are real: the earlier trial wins.
    tied = [row["id"] for row in local_sweep.rows if observed.get(row["id"]) == lowest]
    best = local_sweep.status["bestTrial"]
    assert (best["id"], best["metric"], best["value"]) == (tied[0], "loss", lowest)
    best_id = best["id"]
    config = next(t.config for t in local_sweep.tune_trials if t.trial_id == best_id)
    assert best["parameters"] == {"hyperparameters.learningRate": config["hyperparameters.learningRate"]}
    # The checkpoint is the best trial's newest one, written by its own trainer run.
    checkpoints = local_sweep.experiment_dir / "trials" / f"{NAME}-{best_id}" / "checkpoints"
    newest = max(checkpoints.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    assert pathlib.Path(best["checkpoint"]) == newest and (newest / "manifest.json").is_file()


def test_optuna_with_a_seed_proposes_the_same_parameter_sequence_again(local_sweep: LocalSweep) -> None:
    config = trainer_config.SweepConfig.model_validate_json(
        (local_sweep.experiment_dir / "sweep.json").read_text(), by_alias=True, by_name=False
    )
    by_id = {t.trial_id: t.config["hyperparameters.learningRate"] for t in local_sweep.tune_trials}
    swept = [by_id[row["id"]] for row in local_sweep.rows]  # in the order Tune created the trials

    def replay(seed: int) -> list[float]:
        spec = config.spec.model_copy(update={"seed": seed})
        searcher = driver.search_algorithm(spec)
        searcher.set_search_properties("loss", "min", space.param_space(spec))
        proposed = []
        for index in range(len(swept)):
            suggestion = searcher.suggest(f"replay-{index}")
            proposed.append(suggestion["hyperparameters.learningRate"])
            searcher.on_trial_complete(f"replay-{index}", result={"loss": 1.0, "step": 1})
        return proposed

    assert replay(7) == swept
    assert replay(8) != swept  # the seed is what makes it repeat


def test_local_mode_prints_the_trial_table_as_it_changes_and_the_final_status(
    local_sweep: LocalSweep,
) -> None:
    output = local_sweep.output
    assert "trainop: note: Ray starts with" in output
    tables = [block for block in output.split("\n\n") if block.lstrip().startswith("TRIAL")]
    assert len(tables) >= 2, output  # printed again whenever it changed
    columns = ["TRIAL", "STATE", "STEP", "LOSS", "BEST", "hyperparameters.learningRate"]
    assert all(table.splitlines()[0].split() == columns for table in tables)
    final_rows = {line.split()[0]: line.split()[1] for line in tables[-1].splitlines()[1:]}
    assert final_rows == {row["id"]: row["state"] for row in local_sweep.rows}
    shown = yaml.safe_load(output.split(f"trainop: TuningSweep {NAME} succeeded; status:\n", 1)[1])["status"]
    assert shown["phase"] == "Succeeded"
    assert (shown["trials"], shown["bestTrial"]) == (
        local_sweep.status["trials"],
        local_sweep.status["bestTrial"],
    )
