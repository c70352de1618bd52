"""The ``TorchTrainer`` every trainop run builds: Ray Train's, less the Ray Data helper it does not use.

Ray Train 2.60's ``DataParallelTrainer`` adds a ``DatasetsCallback`` to every run, datasets or not, and that
callback starts a ``DatasetManager`` actor for each worker group (``before_init_train_context``), on the
controller's node: one more Ray worker process per group start (per attempt, and again per in-attempt
restart) that imports Ray Data, about 2 s of CPU. The trainer feeds its ranks with its own DataLoader
(``data.py``) and never passes Ray Datasets, so :class:`LeanTorchTrainer` leaves the callback out when the
run has none; with datasets it is Ray's trainer unchanged. A user's own Ray Train function
(``raytrain_function.py``) keeps Ray's ``TorchTrainer`` as is.

The hook, ``_create_default_callbacks``, is private to Ray Train: where it or the callback class is missing
(another Ray version) the trainer is Ray's as is, and :func:`lean` says so (a unit test asserts it).
"""

from __future__ import annotations

from typing import Any

from ray.train.torch import TorchTrainer

_DatasetsCallback: type | None
try:
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback as _DatasetsCallback
except ImportError:  # another Ray Train: nothing to leave out
    _DatasetsCallback = None

_HOOK = "_create_default_callbacks"


class LeanTorchTrainer(TorchTrainer):
    """``TorchTrainer`` without a ``DatasetManager`` actor per worker group when it has no datasets."""

    def _create_default_callbacks(self) -> list[Any]:
        callbacks: list[Any] = super()._create_default_callbacks()  # type: ignore[misc]
        if _DatasetsCallback is None or getattr(self, "datasets", None):
            return callbacks
        return [callback for callback in callbacks if not isinstance(callback, _DatasetsCallback)]


def lean() -> bool:
    """Whether this Ray Train has the hook and the callback that :class:`LeanTorchTrainer` relies on."""
    return _DatasetsCallback is not None and callable(getattr(TorchTrainer, _HOOK, None))
