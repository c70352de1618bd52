"""The experiment's parts on their own: cost arithmetic and ledger, request parsing, evaluation metrics,
the held-out split, parameter flattening, bus bandwidth. Plain functions and files; nothing mocked."""

from __future__ import annotations

import json
import math
import pathlib

import pytest
import torch

from trainop.api import experiment, trainer_config, trainingjob
from trainop_trainer import cost, evaluation, profiling, requests, tracking
from trainop_trainer.workloads import CLASSIFICATION, LANGUAGE_MODEL, datasets

USD_2_50 = trainer_config.Pricing(price_per_gpu_hour=2.5, currency="USD")


def test_cost_of_eight_gpus_for_ninety_minutes_at_2_50_per_gpu_hour_is_30() -> None:
    record = cost.cost_status(
        gpus=8, allocated_seconds=5400.0, training_seconds=4500.0, pricing=USD_2_50, updated="t"
    )
    assert (record.gpu_hours, record.estimated_cost, record.currency) == (12.0, 30.0, "USD")
    assert (record.idle_seconds, record.idle_gpu_hours) == (900.0, 2.0)
    assert record.training_seconds + record.idle_seconds == record.allocated_seconds


def test_without_a_price_gpu_hours_are_counted_and_no_cost_is_estimated() -> None:
    record = cost.cost_status(
        gpus=4,
        allocated_seconds=1800.0,
        training_seconds=1800.0,
        pricing=trainer_config.Pricing(),
        updated="t",
    )
    assert (record.gpu_hours, record.estimated_cost, record.price_per_gpu_hour, record.currency) == (
        2.0,
        None,
        None,
        None,
    )


def test_a_cpu_job_uses_no_gpu_hours_whatever_the_price() -> None:
    record = cost.cost_status(
        gpus=0, allocated_seconds=600.0, training_seconds=100.0, pricing=USD_2_50, updated="t"
    )
    assert (record.gpu_hours, record.idle_gpu_hours, record.estimated_cost) == (0.0, 0.0, 0.0)
    assert record.idle_seconds == 500.0


def test_training_time_never_exceeds_allocated_time() -> None:
    record = cost.cost_status(
        gpus=1, allocated_seconds=10.0, training_seconds=12.0, pricing=USD_2_50, updated="t"
    )
    assert (record.training_seconds, record.idle_seconds) == (10.0, 0.0)


def test_the_ledger_adds_every_attempt_and_a_restart_continues_its_launch(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "cost.json"
    first = cost.CostLedger(path=path, launch_id="attempt-1", started_at=1000.0)
    first.training_seconds = 50.0
    first.save(now=1100.0)  # attempt 1: 100 s allocated, 50 s training, then it died
    second = cost.CostLedger(path=path, launch_id="attempt-2", started_at=2000.0)
    second.training_seconds = 20.0
    second.save(now=2030.0)
    restarted = cost.CostLedger(path=path, launch_id="attempt-2", started_at=2000.0)  # worker-group restart
    restarted.training_seconds = 5.0

    assert restarted.totals(now=2040.0) == (100.0 + 40.0, 50.0 + 20.0 + 5.0)
    assert json.loads(path.read_text())["launches"]["attempt-1"]["allocatedSeconds"] == 100.0


def test_pricing_comes_from_the_jobs_annotation_before_the_operators_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def job(annotations: dict[str, str]) -> trainingjob.TrainingJob:
        return trainingjob.TrainingJob.model_validate(
            {
                "metadata": {"name": "j", "annotations": annotations},
                "spec": {"workload": {"model": "mlp"}, "hyperparameters": {"maxSteps": 1}},
            }
        )

    monkeypatch.setenv(trainer_config.PRICE_ENV, "3.0")
    monkeypatch.setenv(trainer_config.CURRENCY_ENV, "EUR")
    assert trainer_config.pricing_for(job({})).price_per_gpu_hour == 3.0
    annotated = trainer_config.pricing_for(job({experiment.PRICE_ANNOTATION: "1.25"}))
    assert (annotated.price_per_gpu_hour, annotated.currency) == (1.25, "EUR")
    # A malformed annotation does not stop the job: the chart's price stands.
    assert trainer_config.pricing_for(job({experiment.PRICE_ANNOTATION: "cheap"})).price_per_gpu_hour == 3.0
    monkeypatch.delenv(trainer_config.PRICE_ENV)
    assert trainer_config.pricing_for(job({})).price_per_gpu_hour is None


@pytest.mark.parametrize(("value", "steps"), [("20", 20), ("5:again", 5), (" 100 ", 100)])
def test_a_profile_request_is_a_number_of_steps(value: str, steps: int) -> None:
    assert requests.profile_steps(value) == steps


@pytest.mark.parametrize("value", ["abc", "0", "101", ":3", "-4"])
def test_a_bad_profile_request_names_the_annotation_and_the_fix(value: str) -> None:
    with pytest.raises(requests.InvalidRequest) as raised:
        requests.profile_steps(value)
    assert "trainop.dev/profile" in str(raised.value) and "trainop.dev/profile=20" in str(raised.value)


def test_a_request_file_is_handed_out_once_and_not_again_after_a_restart(tmp_path: pathlib.Path) -> None:
    (tmp_path / "trainop").mkdir()
    (tmp_path / "trainop" / "profile-request").write_text("3\n")
    watcher = requests.RequestWatcher(run_dir=tmp_path, target=None)
    watcher.poll_once()
    assert watcher.post() == (3, False)
    assert watcher.post() == (0, False)  # claimed: not posted twice
    watcher.done(requests.PROFILE)
    again = requests.RequestWatcher(run_dir=tmp_path, target=None)  # a new worker group
    again.poll_once()
    assert again.post() == (0, False)
    (tmp_path / "trainop" / "profile-request").write_text("3:again")
    (tmp_path / "trainop" / "communication-report-request").write_text("1")
    again.poll_once()
    assert again.post() == (3, True)


def test_an_invalid_request_is_reported_once_and_never_posted(tmp_path: pathlib.Path) -> None:
    (tmp_path / "trainop").mkdir()
    (tmp_path / "trainop" / "profile-request").write_text("lots")
    watcher = requests.RequestWatcher(run_dir=tmp_path, target=None)
    watcher.poll_once()
    assert watcher.post() == (0, False)
    assert [(r.value, "from 1 to 100" in m) for r, m in watcher.invalid] == [("lots", True)]
    watcher.invalid.clear()
    assert watcher.post() == (0, False) and watcher.invalid == []


def test_classification_sums_count_top1_top5_and_leave_out_padded_rows() -> None:
    logits = torch.tensor(
        [
            [9.0, 1, 2, 3, 4, 5, 0],  # class 0 first: top-1 right for target 0
            [1.0, 9, 8, 7, 6, 5, 0],  # target 5: 5th best -> top-5 only
            [1.0, 2, 3, 4, 5, 6, 9],  # target 0: neither
            [9.0, 0, 0, 0, 0, 0, 0],  # padding
        ]
    )
    targets = torch.tensor([0, 5, 0, 0])
    mask = torch.tensor([True, True, True, False])
    loss_sum, top1, top5, count = evaluation._sums(logits, targets, mask, task=CLASSIFICATION).tolist()
    expected_loss = torch.nn.functional.cross_entropy(logits[:3], targets[:3], reduction="sum").item()
    assert (top1, top5, count) == (1.0, 2.0, 3.0)
    assert loss_sum == pytest.approx(expected_loss)
    metrics = evaluation._metrics(loss_sum, top1, top5, count, task=CLASSIFICATION, classes=7)
    assert metrics["accuracy"] == pytest.approx(1 / 3) and metrics["top5Accuracy"] == pytest.approx(2 / 3)


def test_language_model_metrics_give_perplexity_over_the_predicted_tokens() -> None:
    vocab = 5
    logits = torch.zeros(2, 3, vocab)  # uniform: loss log(5), perplexity 5
    targets = torch.tensor([[1, 2, evaluation.IGNORE_INDEX], [0, 0, 0]])
    mask = torch.tensor([True, False])
    loss_sum, top1, _, count = evaluation._sums(logits, targets, mask, task=LANGUAGE_MODEL).tolist()
    assert count == 2.0
    metrics = evaluation._metrics(loss_sum, top1, 0.0, count, task=LANGUAGE_MODEL, classes=vocab)
    assert metrics["loss"] == pytest.approx(math.log(vocab))
    assert metrics["perplexity"] == pytest.approx(vocab)


@pytest.mark.parametrize(
    ("size", "world", "batch", "cap", "batches"),
    [(10, 3, 2, None, 2), (10, 2, 5, None, 1), (100, 2, 5, 3, 3)],
)
def test_every_rank_runs_the_same_number_of_evaluation_batches(
    size: int, world: int, batch: int, cap: int | None, batches: int
) -> None:
    assert evaluation.batches_for(size, world_size=world, batch_size=batch, max_batches=cap) == batches
    shares = [evaluation.rank_indices(size, rank=r, world_size=world) for r in range(world)]
    assert sorted(i for share in shares for i in share) == list(range(size))


def test_the_held_out_split_is_disjoint_seeded_and_the_same_for_every_rank() -> None:
    base = datasets.SyntheticVectors(num_samples=100, input_dim=4, num_classes=3, seed=1)
    train, held = datasets.holdout_split(base, fraction=0.2, seed=7)
    train_again, held_again = datasets.holdout_split(base, fraction=0.2, seed=7)
    assert (len(train), len(held)) == (80, 20)
    assert set(train.indices).isdisjoint(held.indices)
    assert held.indices == held_again.indices and train.indices == train_again.indices
    inputs, labels = held.__getitems__([0, 1])
    assert torch.equal(inputs, base.features[held.indices[:2]])
    assert torch.equal(labels, base.labels[held.indices[:2]])
    assert datasets.holdout_split(base, fraction=0.2, seed=8)[1].indices != held.indices


def test_a_split_that_leaves_one_side_empty_says_which_field_to_change() -> None:
    base = datasets.SyntheticVectors(num_samples=3, input_dim=4, num_classes=3, seed=1)
    with pytest.raises(ValueError, match=r"spec\.evaluation\.holdoutFraction"):
        datasets.holdout_split(base, fraction=0.2, seed=0)


def test_the_resolved_spec_becomes_dotted_mlflow_parameters() -> None:
    flat = tracking.flatten(
        {"hyperparameters": {"learningRate": 0.1, "schedule": {"kind": "cosine"}}, "x": [1]}
    )
    assert flat == {
        "hyperparameters.learningRate": "0.1",
        "hyperparameters.schedule.kind": "cosine",
        "x": "[1]",
    }


@pytest.mark.parametrize(("op", "expected"), [("all_reduce", 1.5), ("all_gather", 0.75), ("broadcast", 1.0)])
def test_bus_bandwidth_follows_nccl_tests(op: str, expected: float) -> None:
    # 1 GB in 1 s on 4 ranks: algbw 1 GB/s.
    assert profiling.bus_bandwidth(op, size=10**9, seconds=1.0, world_size=4) == pytest.approx(expected)


def _digits_spec(evaluation: dict[str, object]) -> trainingjob.TrainingJobSpec:
    return trainingjob.TrainingJobSpec.model_validate(
        {
            "workload": {"model": "mlp", "dataset": {"kind": "digits"}},
            "hyperparameters": {"maxSteps": 10},
            "evaluation": evaluation,
        }
    )


def test_a_workload_with_evaluation_holds_out_a_split_or_reads_the_evaluation_dataset() -> None:
    from trainop_trainer import workloads

    split = workloads.build(_digits_spec({"everySteps": 5, "holdoutFraction": 0.2}))
    assert (len(split.dataset), len(split.eval_dataset or [])) == (1438, 359)  # type: ignore[arg-type]
    separate = workloads.build(_digits_spec({"everySteps": 5, "dataset": {"kind": "digits"}}))
    assert (len(separate.dataset), len(separate.eval_dataset or [])) == (1797, 1797)  # type: ignore[arg-type]
    assert workloads.build(_digits_spec({"everySteps": 5})).task == "classification"


def test_digits_with_another_class_count_is_refused_naming_the_field() -> None:
    from trainop_trainer import workloads

    spec = trainingjob.TrainingJobSpec.model_validate(
        {
            "workload": {"model": "mlp", "dataset": {"kind": "digits", "numClasses": 7}},
            "hyperparameters": {"maxSteps": 1},
        }
    )
    with pytest.raises(ValueError, match=r"spec\.workload\.dataset\.numClasses 7 does not fit kind digits"):
        workloads.build(spec)
