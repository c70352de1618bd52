"""Which torch backend config the trainer hands Ray Train (ray_backend.py). Unit tier: no Ray runtime.

What the device binding does on GPUs (one CUDA context per worker, on its own GPU) cannot run on this
machine; the GPU benchmark checks it from NVML's process list (docs/benchmarks-gpu.md). The Ray tier's
runs (tests/trainer/test_trainer_ray.py) set every process group up through this backend on CPU."""

from __future__ import annotations

import pytest
from ray.train.torch import TorchConfig

from trainop_trainer import ray_backend


def test_the_process_groups_are_device_bound_by_default_and_keep_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ray_backend.BINDING_ENV, raising=False)
    config = ray_backend.torch_config(180)
    assert type(config) is ray_backend.DeviceBoundTorchConfig
    assert config.timeout_s == 180
    assert config.backend_cls is ray_backend._DeviceBoundTorchBackend
    assert issubclass(config.backend_cls, type(TorchConfig().backend_cls()))
    assert ray_backend.torch_config(None).timeout_s == TorchConfig().timeout_s


def test_the_benchmark_knob_keeps_rays_own_backend_and_refuses_other_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ray_backend.BINDING_ENV, "ray")
    assert type(ray_backend.torch_config(None)) is TorchConfig
    monkeypatch.setenv(ray_backend.BINDING_ENV, "gpu0")
    with pytest.raises(ValueError, match=r"TRAINOP_RAY_DEVICE_BINDING='gpu0'; use one of bind, ray"):
        ray_backend.torch_config(None)
