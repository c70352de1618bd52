"""The keys ``spec.workload.config`` takes for each built-in model: one table for the API and the trainer.

For ``workload.model`` the trainer shapes the model from a few known keys of ``workload.config``
(``numLayers``, ``hiddenDim``...). The map is free-form in the CRD (an entrypoint or a Ray Train function
reads whatever it likes from it), so a typo such as ``hidenDim`` would be kept by the apiserver and never
read by the trainer: the job would train the default model and nobody would learn why. ``problem`` is
what ``Workload`` (``trainop validate``, local mode, the operator's re-validation) refuses with; the
trainer reads its values only through ``dimension`` and ``fraction`` with the ``Key`` names, so the keys
it reads and the keys the API admits are the same list (tests/trainer checks the trainer reads each one).

The CRD has no twin of these rules: CEL cannot see the keys of a map the schema leaves free-form
(``x-kubernetes-preserve-unknown-fields``), so the apiserver admits such a manifest and the operator fails
the job with InvalidSpec naming the key (manifest.OPERATOR_ONLY_RULES).

This module must not import the API models (trainingjob imports it); of the API it imports only ``base``
(the int64 bound), which the trainer image imports anyway.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Mapping
from typing import Any

from trainop.api import base


class Key(enum.StrEnum):
    VOCAB_SIZE = "vocabSize"
    NUM_LAYERS = "numLayers"
    NUM_HEADS = "numHeads"
    EMBED_DIM = "embedDim"
    DROPOUT = "dropout"
    MASK_TOKEN_ID = "maskTokenId"
    MLP_DIM = "mlpDim"
    PATCH_SIZE = "patchSize"
    INPUT_DIM = "inputDim"
    HIDDEN_DIM = "hiddenDim"


#: Keys whose value is a probability in [0, 1); those that may be 0 (a token id: 0 is a token like any
#: other); every other key is a positive integer.
FRACTIONS = frozenset({Key.DROPOUT})
NON_NEGATIVE = frozenset({Key.MASK_TOKEN_ID})

_GPT = (Key.VOCAB_SIZE, Key.NUM_LAYERS, Key.NUM_HEADS, Key.EMBED_DIM, Key.DROPOUT)

#: What each built-in model (workload.model's values) reads from workload.config.
KEYS: dict[str, tuple[Key, ...]] = {
    "resnet18": (),
    "resnet50": (),
    "gpt-small": _GPT,
    "gpt-medium": _GPT,
    "gpt-xl": _GPT,
    "gpt-tiny": _GPT,
    "bert-base": (*_GPT, Key.MASK_TOKEN_ID),
    "vit-b16": (Key.PATCH_SIZE, Key.NUM_LAYERS, Key.NUM_HEADS, Key.EMBED_DIM, Key.MLP_DIM),
    "mlp": (Key.INPUT_DIM, Key.HIDDEN_DIM, Key.NUM_LAYERS),
}


def _listed(keys: tuple[Key, ...]) -> str:
    """'inputDim, hiddenDim or numLayers'."""
    *others, last = [k.value for k in keys]
    return f"{', '.join(others)} or {last}" if others else last


def unknown_key(model: str, key: str) -> str:
    """The sentence for ``key``, which ``model`` does not read."""
    keys = KEYS[model]
    if not keys:
        return f"model {model} reads no workload.config keys, so {key!r} would be ignored: remove it"
    close = difflib.get_close_matches(key, [k.value for k in keys], n=1, cutoff=0.6)
    fix = f"did you mean {close[0]}?" if close else "remove it or use one of those"
    return f"model {model} does not read workload.config key {key!r} (it reads {_listed(keys)}): {fix}"


def value_problem(key: Key, value: Any) -> str | None:
    """Why ``value`` cannot be workload.config's ``key`` (a sentence starting with the key), or None."""
    if key in FRACTIONS:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            return f"{key.value} must be a number from 0 up to (not including) 1, not {value!r}"
        return None
    lowest = 0 if key in NON_NEGATIVE else 1
    if isinstance(value, bool) or not isinstance(value, int) or not lowest <= value <= base.MAX_INT64:
        what = "an integer of 0 or more" if lowest == 0 else "a positive integer"
        return f"{key.value} must be {what}, not {value!r}"
    return None


def problem(model: str, config: Mapping[str, Any]) -> str | None:
    """Why ``config`` cannot shape the built-in ``model`` (the first key at fault), or None."""
    known = {k.value: k for k in KEYS[model]}
    for name, value in config.items():
        key = known.get(name)
        if key is None:
            return unknown_key(model, name)
        found = value_problem(key, value)
        if found is not None:
            return found
    return None


def dimension(config: Mapping[str, Any], key: Key, default: int) -> int:
    """workload.config's integer ``key``, positive (0 allowed for NON_NEGATIVE keys): the trainer's reading,
    ``default`` when unset."""
    value = config.get(key.value, default)
    found = value_problem(key, value)
    if found is not None:
        raise ValueError("spec.workload.config." + found)
    result: int = value
    return result


def fraction(config: Mapping[str, Any], key: Key, default: float) -> float:
    """workload.config's number in [0, 1) ``key`` (the trainer's reading; ``default`` when unset)."""
    value = config.get(key.value, default)
    found = value_problem(key, value)
    if found is not None:
        raise ValueError("spec.workload.config." + found)
    return float(value)
