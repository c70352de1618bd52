"""The ``TorchTrainer`` every trainop run builds: Ray Train's, less the Ray Data helpers it does not use.

**Datasets.** Ray Train 2.60's ``DataParallelTrainer`` adds a ``DatasetsCallback`` to every run, datasets or
not, and that callback starts a ``DatasetManager`` actor for each worker group
(``before_init_train_context``), on the controller's node: one more Ray worker process per group start (per
attempt, and again per in-attempt restart) that imports Ray Data, about 2 s of CPU. The trainer feeds its
ranks with its own DataLoader (``data.py``) and never passes Ray Datasets, so :class:`LeanTorchTrainer` leaves
the callback out when the run has none; with datasets it is Ray's trainer unchanged. A user's own Ray Train
function (``raytrain_function.py``) keeps Ray's ``TorchTrainer`` as is.

**Autoscaling requests.** Ray Train's fixed-size scaling policy registers the run's resources with Ray Data's
``AutoscalingCoordinator`` when the controller starts and again every 20 s while it runs: a detached actor
(one more Ray worker process per Ray cluster, importing Ray Data) whose requests only a Ray autoscaler reads.
trainop's RayClusters run without one (``enableInTreeAutoscaling: false``, operator/trainop/controller/
rayjob.py: KubeRay sizes the cluster from the job), and a local Ray has none. On a busy node that actor's
first start can take longer than the 5 s the controller waits for it, and the controller then logs a
``GetTimeoutError`` traceback ("Failed to send resource request ..."), which reads as a failure and is not
one. :class:`FixedSize` is Ray's fixed-size policy (the same decisions) without those requests; an elastic
scaling config keeps Ray's own policy.

The hooks, ``_create_default_callbacks`` and ``_initialize_and_run_controller(scaling_policy=...)``, are
private to Ray Train: where one or the classes are missing (another Ray version) the trainer is Ray's as is,
and :func:`lean` says so (a unit test asserts it).
"""

from __future__ import annotations

from typing import Any

from ray.train.torch import TorchTrainer

_DatasetsCallback: type | None
try:
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback as _DatasetsCallback
except ImportError:  # another Ray Train: nothing to leave out
    _DatasetsCallback = None

_FixedScalingPolicy: type | None
try:
    from ray.train.v2._internal.execution.scaling_policy.fixed import (
        FixedScalingPolicy as _FixedScalingPolicy,
    )
except ImportError:  # another Ray Train: its policy as is
    _FixedScalingPolicy = None

_HOOKS = ("_create_default_callbacks", "_initialize_and_run_controller")


def _fixed_size_policy(base: type) -> type:
    class FixedSize(base):  # type: ignore[misc]
        """Ray's fixed-size scaling policy (same decisions), without registering resource requests with
        the ``AutoscalingCoordinator`` actor: no Ray autoscaler reads them (see the module's docstring)."""

        # Ray's creates the coordinator's client (and the actor) here; without a client its shutdown and
        # abort hooks cancel nothing.
        def after_controller_start(self, train_run_context: Any) -> None:
            del train_run_context

        def _maybe_send_resource_request(self) -> None:
            return None

    return FixedSize


FixedSize: type | None = _fixed_size_policy(_FixedScalingPolicy) if _FixedScalingPolicy is not None else None


class LeanTorchTrainer(TorchTrainer):
    """``TorchTrainer`` without a ``DatasetManager`` actor per worker group when it has no datasets."""

    def _create_default_callbacks(self) -> list[Any]:
        callbacks: list[Any] = super()._create_default_callbacks()  # type: ignore[misc]
        if _DatasetsCallback is None or getattr(self, "datasets", None):
            return callbacks
        return [callback for callback in callbacks if not isinstance(callback, _DatasetsCallback)]

    def _initialize_and_run_controller(self, **controller_init_kwargs: Any) -> Any:
        controller_init_kwargs["scaling_policy"] = fixed_size(controller_init_kwargs.get("scaling_policy"))
        return super()._initialize_and_run_controller(**controller_init_kwargs)  # type: ignore[misc]


def fixed_size(policy: Any) -> Any:
    """:class:`FixedSize` in place of Ray's fixed-size policy (same scaling config); any other as it is."""
    kind: Any = type(policy)
    if FixedSize is None or kind is not _FixedScalingPolicy:
        return policy
    return FixedSize(policy.scaling_config)


def lean() -> bool:
    """Whether this Ray Train has the hooks and the classes that :class:`LeanTorchTrainer` relies on."""
    return (
        _DatasetsCallback is not None
        and FixedSize is not None
        and all(callable(getattr(TorchTrainer, hook, None)) for hook in _HOOKS)
    )
