"""The batch-size finder (``batchSizePerWorker: auto``): the search, the learning-rate rules, and the trainer.

The search is a pure function of a measurement; its tests feed it memory curves (the peak bytes of a step
at each batch size) and check what it concludes and what it had to try. The trainer tests run the real
finder on CPU under the launcher (the memory gauge is the process's peak resident memory); the GPU
benchmark (bench/gpu) checks the finder's choice against the device by trying one step more.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest
import torch
import trainer_support

from trainop.api import trainingjob
from trainop_trainer import batch_finder

MiB = 1 << 20


def linear(fixed: int, per_sample: int, *, out_of_memory_above: int | None = None) -> batch_finder.Measure:
    def measure(batch: int) -> int | None:
        if out_of_memory_above is not None and batch > out_of_memory_above:
            return None
        return fixed + per_sample * batch

    return measure


@pytest.mark.parametrize(("multiple_of", "expected"), [(1, 137), (8, 136), (32, 128)])
def test_on_a_linear_curve_the_choice_is_the_largest_multiple_that_fits_and_nothing_bigger_was_tried(
    multiple_of: int, expected: int
) -> None:
    budget = 1000 * MiB + 137 * 10 * MiB
    batch, probes = batch_finder.search(
        linear(1000 * MiB, 10 * MiB),
        budget=budget,
        multiple_of=multiple_of,
        max_batch=4096,
        verify_next=False,
    )
    assert batch == expected
    assert all(p.fits(budget) for p in probes)  # only batches predicted to fit were run
    assert len(probes) <= 12


def test_verifying_the_next_step_shows_that_one_step_more_does_not_fit() -> None:
    budget = 1000 * MiB + 137 * 10 * MiB
    batch, probes = batch_finder.search(
        linear(1000 * MiB, 10 * MiB), budget=budget, multiple_of=8, max_batch=4096, verify_next=True
    )
    assert batch == 136
    assert [p.batch for p in probes if not p.fits(budget)] == [144]


def test_an_out_of_memory_error_below_the_predicted_batch_is_bisected_down_to_a_batch_that_ran() -> None:
    budget = 10_000 * MiB
    measure = linear(1000 * MiB, 10 * MiB, out_of_memory_above=300)  # fragmentation, another process...
    batch, probes = batch_finder.search(
        measure, budget=budget, multiple_of=4, max_batch=4096, verify_next=True
    )
    assert batch == 300
    assert any(p.peak_bytes is None for p in probes)


def test_memory_that_grows_faster_than_linearly_is_still_never_chosen_beyond_the_budget() -> None:
    def measure(batch: int) -> int:
        return 500 * MiB + 2 * MiB * batch + (batch * batch) * MiB // 50

    budget = 3000 * MiB
    batch, _ = batch_finder.search(measure, budget=budget, multiple_of=1, max_batch=4096, verify_next=True)
    assert measure(batch) <= budget < measure(batch + 1)


def test_the_limit_of_the_search_caps_the_batch() -> None:
    batch, _ = batch_finder.search(
        linear(MiB, MiB), budget=1 << 40, multiple_of=16, max_batch=200, verify_next=True
    )
    assert batch == 192


def test_a_budget_that_not_even_the_smallest_batch_fits_is_one_sentence_naming_the_fix() -> None:
    with pytest.raises(batch_finder.BatchSizeError, match="does not fit the memory budget") as caught:
        batch_finder.search(
            linear(5000 * MiB, MiB), budget=4000 * MiB, multiple_of=8, max_batch=64, verify_next=True
        )
    assert "activation checkpointing" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("rule", "expected"), [("constant", 0.1), ("linear", 0.4), ("sqrt", 0.2)])
def test_the_learning_rate_follows_the_chosen_rule(rule: str, expected: float) -> None:
    hp = trainingjob.Hyperparameters.model_validate(
        {
            "maxSteps": 1,
            "learningRate": 0.1,
            "batchSizePerWorker": "auto",
            "batchSizeSearch": {"learningRateRule": rule, "referenceBatchSize": 16},
        },
        by_alias=True,
    )
    assert batch_finder.learning_rate_for(hp, 64) == pytest.approx(expected)


# ------------------------------------------------------------------------------------- in the trainer
def launch(config: object, path: pathlib.Path, **env: str) -> subprocess.CompletedProcess[str]:
    trainer_support.write_config(config, path)  # type: ignore[arg-type]
    return subprocess.run(
        [trainer_support.PYTHON, "-m", "trainop_trainer.launch", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=trainer_support.subprocess_env(OMP_NUM_THREADS="1", **env),
    )


def test_auto_trains_with_the_found_batch_and_rule_and_probing_changes_nothing_else(
    tmp_path: pathlib.Path,
) -> None:
    base = trainer_support.mlp_config(tmp_path / "auto", "auto", workers=1, max_steps=30, interval_steps=10)
    auto = trainer_support.with_spec(
        base,
        hyperparameters={
            **base.spec.hyperparameters.model_dump(mode="json", by_alias=True),
            "batchSizePerWorker": "auto",
            "schedule": {"kind": "constant"},
            # 2048 samples on one worker: the cap is the search limit, not the memory of this small MLP.
            "batchSizeSearch": {
                "maxBatchSize": 48,
                "multipleOf": 16,
                "learningRateRule": "linear",
                "referenceBatchSize": 16,
            },
        },
    )
    done = launch(auto, tmp_path / "auto.json", TRAINOP_INJECT_FAILURE_AT_STEP="20")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "batch size 48 per worker (found)" in done.stderr
    choice = json.loads((trainer_support.run_dir(auto) / "trainop" / "batch-size.json").read_text())
    assert choice["batchSizePerWorker"] == 48 and choice["learningRate"] == pytest.approx(0.15)
    assert [p["batch"] for p in choice["probes"]][:2] == [16, 32]

    resumed = launch(auto, tmp_path / "auto.json")

    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "batch size 48 per worker (chosen earlier in this run)" in resumed.stderr
    progress = trainer_support.status(auto)["progress"]
    assert (progress["batchSizePerWorker"], progress["learningRate"]) == (48, pytest.approx(0.15))
    # The same run with the batch and learning rate given: bitwise the same model, so the probes left
    # parameters, optimizer state and random generators as they found them.
    given = trainer_support.with_spec(
        base.model_copy(update={"storage_path": str(tmp_path / "given")}),
        hyperparameters={
            **base.spec.hyperparameters.model_dump(mode="json", by_alias=True),
            "batchSizePerWorker": 48,
            "learningRate": 0.15,
            "schedule": {"kind": "constant"},
        },
    )
    assert launch(given, tmp_path / "given.json").returncode == 0
    ours, reference = trainer_support.final_model(auto, 30), trainer_support.final_model(given, 30)
    assert all(torch.equal(ours[k], reference[k]) for k in reference)


@pytest.mark.slow
def test_on_cpu_the_memory_per_worker_bounds_the_batch_within_one_step(tmp_path: pathlib.Path) -> None:
    """ResNet-18 at 64 px takes a few MB per sample: 1500 MiB per worker, not the search limit, decides."""
    config = trainer_support.mlp_config(
        tmp_path,
        "memory-bound",
        workers=1,
        max_steps=3,
        interval_steps=100,
        workload={
            "model": "resnet18",
            "dataset": {
                "kind": "synthetic",
                "imageSize": 64,
                "numSamples": 4096,
                "numClasses": 10,
                "numWorkers": 0,
            },
        },
    )
    hyperparameters = config.spec.hyperparameters.model_dump(mode="json", by_alias=True)
    hyperparameters.update(
        {"batchSizePerWorker": "auto", "batchSizeSearch": {"multipleOf": 8, "maxBatchSize": 1024}}
    )
    config = trainer_support.with_spec(
        config,
        hyperparameters=hyperparameters,
        workers={"replicas": 1, "gpusPerWorker": 0, "cpusPerWorker": 1, "memoryPerWorker": "1500Mi"},
    )
    done = launch(config, tmp_path / "trainer.json")
    assert done.returncode == 0, done.stderr[-3000:]

    choice = json.loads((trainer_support.run_dir(config) / "trainop" / "batch-size.json").read_text())
    chosen, budget = choice["batchSizePerWorker"], choice["budgetBytes"]
    peaks = {p["batch"]: p["peak_bytes"] for p in choice["probes"]}
    assert 8 < chosen < 1024 and chosen % 8 == 0
    assert peaks[chosen] <= budget == 1500 * MiB
    assert peaks[chosen + 8] is None or peaks[chosen + 8] > budget  # one step more did not fit
    assert trainer_support.status(config)["progress"]["batchSizePerWorker"] == chosen
