"""The trainer reads exactly the workload.config keys the API admits for each built-in model
(``trainop.api.model_config.KEYS``): a key the API admitted and the trainer never read would be dropped
silently, and a key the trainer reads that the API refuses could never be set."""

from __future__ import annotations

from typing import Any

import pytest

from trainop.api import model_config, trainingjob
from trainop_trainer import workloads

# Small values for every key, so that each model builds in a moment on a CPU.
SMALL = {
    model_config.Key.VOCAB_SIZE: 64,
    model_config.Key.NUM_LAYERS: 1,
    model_config.Key.NUM_HEADS: 2,
    model_config.Key.EMBED_DIM: 16,
    model_config.Key.DROPOUT: 0.1,
    model_config.Key.MASK_TOKEN_ID: 63,
    model_config.Key.MLP_DIM: 32,
    model_config.Key.PATCH_SIZE: 8,
    model_config.Key.INPUT_DIM: 8,
    model_config.Key.HIDDEN_DIM: 16,
}
DATASETS = {
    "resnet18": {"kind": "synthetic", "numSamples": 4, "imageSize": 32, "numClasses": 2},
    "resnet50": {"kind": "synthetic", "numSamples": 4, "imageSize": 32, "numClasses": 2},
    "vit-b16": {"kind": "synthetic", "numSamples": 4, "imageSize": 32, "numClasses": 2},
    "mlp": {"kind": "synthetic", "numSamples": 4, "numClasses": 2},
}
TOKENS = {"kind": "synthetic", "numSamples": 4, "sequenceLength": 8}


class ReadKeys(dict[str, Any]):
    """A workload.config that remembers which keys were read."""

    def __init__(self, values: dict[str, Any]) -> None:
        super().__init__(values)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)


def test_every_built_in_model_has_an_entry_in_the_table_of_keys() -> None:
    assert set(model_config.KEYS) == {m.value for m in trainingjob.BuiltinModel}


@pytest.mark.parametrize("model", sorted(model_config.KEYS))
def test_the_trainer_reads_exactly_the_keys_the_api_admits_for_the_model(model: str) -> None:
    keys = model_config.KEYS[model]
    config = {key.value: SMALL[key] for key in keys}
    spec = trainingjob.TrainingJobSpec.model_validate(
        {
            "workload": {"model": model, "dataset": DATASETS.get(model, TOKENS), "config": config},
            "hyperparameters": {"maxSteps": 1},
            "workers": {"gpusPerWorker": 0},
            "precision": "fp32",
        },
        by_alias=True,
    )
    recording = ReadKeys(config)
    object.__setattr__(spec.workload, "config", recording)  # what the trainer reads, key by key
    workloads.build(spec)
    assert recording.read == {key.value for key in keys}


def test_a_value_the_api_refuses_is_refused_by_the_trainer_with_the_same_sentence() -> None:
    """A trainer config written before the API checked the keys (or by hand) still fails on the field."""
    with pytest.raises(ValueError) as refused:
        model_config.dimension({"numLayers": "2"}, model_config.Key.NUM_LAYERS, 2)
    assert str(refused.value) == "spec.workload.config.numLayers must be a positive integer, not '2'"
