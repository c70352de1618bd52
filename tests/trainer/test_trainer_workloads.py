"""Built-in models and datasets: shapes, sizes, determinism, reading real files, resumable sampling."""

from __future__ import annotations

import pathlib
import pickle
import subprocess
from typing import Any

import numpy as np
import pytest
import torch
import trainer_support

from trainop.api import trainingjob
from trainop_trainer import data, workloads
from trainop_trainer.workloads import datasets, encoders, models


def spec(
    model: str, dataset: dict[str, object], config: dict[str, object] | None = None
) -> trainingjob.TrainingJobSpec:
    return trainingjob.TrainingJobSpec.model_validate(
        {
            "workload": {"model": model, "dataset": dataset, "config": config or {}},
            "hyperparameters": {"maxSteps": 2, "seed": 3},
            "workers": {"gpusPerWorker": 0},
            "precision": "fp32",
        },
        by_alias=True,
    )


def test_gpt_small_has_the_gpt2_small_shape_with_tied_embeddings() -> None:
    model = models.gpt("gpt-small", block_size=1024, config={})
    assert model.head.weight is model.token_embedding.weight
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(124.4e6, rel=0.01)


@pytest.mark.parametrize(
    ("build", "params"),
    [
        (lambda: models.gpt("gpt-medium", block_size=1024, config={}), 354.8e6),
        (lambda: models.gpt("gpt-xl", block_size=2048, config={}), 1313.6e6),
        (lambda: encoders.bert(block_size=512, config={}), 109.6e6),
        (lambda: encoders.vit(image_size=224, num_classes=1000, config={}), 86.6e6),
    ],
    ids=["gpt-medium", "gpt-xl", "bert-base", "vit-b16"],
)
def test_the_bigger_models_have_their_published_sizes(build: Any, params: float) -> None:
    with torch.device("meta"):  # shapes only: no memory for 1.3B parameters
        model = build()
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(params, rel=0.01)


def test_gpt_xl_has_the_gpt3_xl_shape() -> None:
    with torch.device("meta"):
        model = models.gpt("gpt-xl", block_size=2048, config={})
    config = model.config
    assert (config.num_layers, config.embed_dim, config.num_heads, config.embed_dim // config.num_heads) == (
        24,
        2048,
        16,
        128,
    )


def test_masked_tokens_mask_about_15_percent_the_same_way_for_the_same_sample() -> None:
    tokens = datasets.SyntheticTokens(num_samples=200, sequence_length=64, vocab_size=500, seed=2)
    masked = datasets.MaskedTokens(tokens, vocab_size=500, mask_token_id=499, seed=7)
    inputs, targets = masked.__getitems__(list(range(200)))
    originals, _ = tokens.__getitems__(list(range(200)))
    chosen = targets != -100
    assert 0.13 < float(chosen.float().mean()) < 0.17
    assert torch.equal(targets[chosen], originals[chosen])
    assert torch.equal(inputs[~chosen], originals[~chosen])
    replaced = inputs[chosen] == 499
    assert 0.75 < float(replaced.float().mean()) < 0.85
    again_inputs, again_targets = masked.__getitems__([17, 3])
    assert torch.equal(again_inputs, inputs[[17, 3]]) and torch.equal(again_targets, targets[[17, 3]])


def test_the_masked_lm_loss_counts_only_masked_positions() -> None:
    logits = torch.randn(2, 5, 11)
    targets = torch.full((2, 5), -100)
    targets[0, 1], targets[1, 4] = 3, 7
    expected = torch.nn.functional.cross_entropy(logits[[0, 1], [1, 4]], torch.tensor([3, 7]))
    assert torch.allclose(encoders.masked_lm_loss(logits, targets), expected)


def test_a_vit_image_size_that_is_not_a_multiple_of_the_patch_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"spec\.workload\.dataset\.imageSize 100"):
        encoders.vit(image_size=100, num_classes=10, config={})


def test_gpt_tiny_maps_tokens_to_next_token_logits() -> None:
    model = models.gpt("gpt-tiny", block_size=16, config={"vocabSize": 97})
    logits = model(torch.randint(0, 97, (3, 16)))
    assert logits.shape == (3, 16, 97)


@pytest.mark.parametrize(("name", "params"), [("resnet18", 11.7e6), ("resnet50", 25.6e6)])
def test_resnets_are_the_torchvision_ones_untrained(name: str, params: float) -> None:
    model = models.resnet(name, num_classes=1000)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(params, rel=0.01)


def test_the_same_seed_builds_the_same_model_and_data() -> None:
    job = spec("mlp", {"numSamples": 64, "numClasses": 4})
    a, b = workloads.build(job), workloads.build(job)
    assert all(
        torch.equal(x, y)
        for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values(), strict=True)
    )
    assert all(
        torch.equal(x, y)
        for x, y in zip(a.dataset.__getitems__([5, 9]), b.dataset.__getitems__([5, 9]), strict=True)
    )  # type: ignore[attr-defined]


def test_synthetic_images_are_uint8_and_normalised_on_the_device_in_channels_last() -> None:
    workload = workloads.build(spec("resnet18", {"imageSize": 32, "numSamples": 16, "numClasses": 10}))
    images, labels = workload.dataset.__getitems__([0, 1, 2])  # type: ignore[attr-defined]
    assert images.dtype == torch.uint8 and images.shape == (3, 3, 32, 32) and labels.shape == (3,)
    x, _ = workload.to_device((images, labels), torch.device("cpu"))
    assert x.dtype == torch.float32 and x.is_contiguous(memory_format=torch.channels_last)
    assert abs(float(x.mean())) < 1.0


def test_synthetic_tokens_shift_targets_by_one() -> None:
    dataset = datasets.SyntheticTokens(num_samples=10, sequence_length=8, vocab_size=50, seed=1)
    inputs, targets = dataset.__getitems__([4])
    assert torch.equal(inputs[0, 1:], targets[0, :-1])


def test_cifar10_batches_are_read_from_the_pickled_python_files(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (5, 3072), dtype=np.uint8)
    with (tmp_path / "data_batch_1").open("wb") as f:
        pickle.dump({b"data": raw, b"labels": [0, 1, 2, 3, 9]}, f)
    dataset = datasets.Cifar10(str(tmp_path))
    images, labels = dataset.__getitems__([4, 0])
    assert len(dataset) == 5 and labels.tolist() == [9, 0]
    assert torch.equal(images[0], torch.from_numpy(raw[4].reshape(3, 32, 32)))


def test_a_cifar10_path_without_batches_names_the_field() -> None:
    with pytest.raises(FileNotFoundError, match=r"spec\.workload\.dataset\.path"):
        datasets.Cifar10("/nonexistent")


def test_token_files_are_memory_mapped_uint16_windows(tmp_path: pathlib.Path) -> None:
    tokens = np.arange(100, dtype=np.uint16)
    (tmp_path / "train.bin").write_bytes(tokens.tobytes())
    dataset = datasets.TokenFile(str(tmp_path / "train.bin"), sequence_length=10, vocab_size=128)
    inputs, targets = dataset.__getitems__([2])
    assert len(dataset) == 9
    assert inputs[0].tolist() == list(range(20, 30)) and targets[0].tolist() == list(range(21, 31))


def test_a_token_file_with_ids_beyond_the_vocabulary_asks_for_vocab_size(tmp_path: pathlib.Path) -> None:
    (tmp_path / "t.bin").write_bytes(np.array([1, 2, 5000, 3] * 10, dtype=np.uint16).tobytes())
    with pytest.raises(ValueError, match="vocabSize"):
        datasets.TokenFile(str(tmp_path / "t.bin"), sequence_length=4, vocab_size=1024)


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_the_sampler_resumed_mid_epoch_yields_exactly_the_rest_of_the_epoch(rank: int) -> None:
    dataset = datasets.SyntheticVectors(num_samples=101, input_dim=2, num_classes=2, seed=0)
    full = data.ResumableDistributedSampler(dataset, num_replicas=3, rank=rank, seed=5)
    resumed = data.ResumableDistributedSampler(dataset, num_replicas=3, rank=rank, seed=5)
    for epoch in (0, 1):
        full.set_epoch(epoch)
        resumed.set_epoch(epoch)
        resumed.set_start_index(7)
        assert list(resumed) == list(full)[7:]
        assert len(resumed) == len(full) - 7
    assert list(full) != list(data.ResumableDistributedSampler(dataset, num_replicas=3, rank=rank, seed=50))


@pytest.mark.parametrize(
    ("model", "dataset", "config"),
    [
        ("resnet18", {"imageSize": 32, "numSamples": 64, "numClasses": 10, "numWorkers": 0}, {}),
        ("gpt-tiny", {"sequenceLength": 32, "numSamples": 64, "numWorkers": 0}, {"vocabSize": 128}),
        (
            "vit-b16",
            {"imageSize": 32, "numSamples": 64, "numClasses": 10, "numWorkers": 0},
            {"patchSize": 8, "numLayers": 2, "numHeads": 4, "embedDim": 64, "mlpDim": 128},
        ),
        (
            "bert-base",
            {"sequenceLength": 32, "numSamples": 64, "numWorkers": 0},
            {"vocabSize": 128, "numLayers": 2, "numHeads": 4, "embedDim": 64},
        ),
    ],
)
def test_each_builtin_model_trains_and_checkpoints_under_the_launcher(
    tmp_path: pathlib.Path, model: str, dataset: dict[str, object], config: dict[str, object]
) -> None:
    job = trainer_support.mlp_config(
        tmp_path,
        f"smoke-{model}",
        workers=1,
        max_steps=4,
        interval_steps=2,
        batch_size=4,
        workload={"model": model, "dataset": {"kind": "synthetic", **dataset}, "config": config},
    )
    path = trainer_support.write_config(job, tmp_path / "trainer.json")
    done = subprocess.run(
        [trainer_support.PYTHON, "-m", "trainop_trainer.launch", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=trainer_support.subprocess_env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert trainer_support.checkpoint_steps(job) == [2, 4]
    assert trainer_support.status(job)["progress"]["loss"] > 0
