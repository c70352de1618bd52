"""Ray Train's torch backend with each worker's process group set up on its own GPU (issue #21).

Ray Train (2.60) sets each worker's process group up in the worker actor's thread
(``ray.train.torch.config._setup_torch_process_group``) and sets the CUDA device only around the training
function (``TorchConfigContextManager``). CUDA's current device is per thread and 0 by default, so the
process-group set-up makes every worker create a CUDA context on GPU 0 as well as on its own: NVML listed
all four workers on GPU 0 of a 4-GPU run (docs/benchmarks-gpu.md). ``DeviceBoundTorchConfig`` is Ray's
``TorchConfig`` whose backend first sets, on every worker's actor thread, the CUDA device Ray Train gives
that worker (``ray.train.torch.get_device``: its GPU among ``CUDA_VISIBLE_DEVICES``, which Ray Train's
accelerator callback has set before the backend starts), then sets the process group up as Ray does. The
worker actors run one task at a time on one thread, so the device set by the first task is the current
device of the second.

``TRAINOP_RAY_DEVICE_BINDING=ray`` (a benchmark knob, ``config.BENCH_ENV``) keeps Ray's own backend, for an
A/B run.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import torch
from ray.train.torch import TorchConfig
from ray.train.torch.config import _TorchBackend

from trainop_trainer import config as config_module

log = logging.getLogger(__name__)

BINDING_ENV = config_module.RAY_DEVICE_BINDING_ENV
BINDINGS = ("bind", "ray")


def binding() -> str:
    """``bind`` (default) or ``ray``; one sentence on anything else."""
    value = os.environ.get(BINDING_ENV, "bind").strip() or "bind"
    if value not in BINDINGS:
        raise ValueError(f"{BINDING_ENV}={value!r}; use one of {', '.join(BINDINGS)}")
    return value


def bind_cuda_device() -> str:
    """On a worker's actor thread: make its own GPU the current CUDA device. Returns what was done."""
    import ray.train.torch

    if not torch.cuda.is_available():
        return "no CUDA"
    device = ray.train.torch.get_device()
    if device.type != "cuda":
        return f"device {device}"
    torch.cuda.set_device(device)
    return f"cuda:{device.index} (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')})"


class _DeviceBoundTorchBackend(_TorchBackend):
    def on_start(self, worker_group: Any, backend_config: Any) -> None:
        bound = worker_group.execute(bind_cuda_device)
        log.debug("CUDA device of each worker before its process group: %s", bound)
        super().on_start(worker_group, backend_config)


@dataclasses.dataclass
class DeviceBoundTorchConfig(TorchConfig):
    """Ray's ``TorchConfig`` (same fields) with the device-bound backend."""

    @property
    def backend_cls(self) -> type:
        return _DeviceBoundTorchBackend


def torch_config(timeout_s: int | None) -> Any:
    """The ``torch_config`` for a ``TorchTrainer``: device-bound unless the benchmark knob says ``ray``;
    ``timeout_s`` None keeps Ray Train's default process-group timeout."""
    cls = DeviceBoundTorchConfig if binding() == "bind" else TorchConfig
    return cls() if timeout_s is None else cls(timeout_s=timeout_s)
