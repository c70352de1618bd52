"""Fixtures of the sweep tests: one local Ray runtime for every ``@pytest.mark.ray`` test of this package.

It is package-scoped (ended after the last test here) so that other packages' session fixtures can start
their own runtime afterwards; if a runtime is already up it is reused as is. It starts with more logical
CPUs than the machine's 2 cores: Ray Train's worker groups time out at start-up when logical CPUs equal
cores (see docs/sweep.md), and trial drivers take none. ``address="local"`` starts a new runtime even when
another one on this machine wrote /tmp/ray/ray_current_cluster.

Environment, read when Ray starts (workers inherit it) or when a Train run starts: Ray Train polls its
workers every 0.5 s instead of 2 s and skips the preemption watcher; the trainer's floor on the time between
two reports to Ray is 0.02 s instead of 10 s (``TRAINOP_RAY_REPORT_MIN_INTERVAL_S``): a test's template
says how often (``reporting.everySeconds``, 0.5 s in ``sweep_support.mlp_template``; the ASHA test's 0.02 s,
so that its trials of a fraction of a second of training report at ASHA's rungs).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

RAY_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "TRAINOP_RAY_REPORT_MIN_INTERVAL_S": "0.02",
}
LOGICAL_CPUS = 8


@pytest.fixture(scope="package")
def sweep_ray() -> Iterator[None]:
    import ray

    if ray.is_initialized():
        yield
        return
    saved = {key: os.environ.get(key) for key in RAY_ENV}
    os.environ.update(RAY_ENV)
    ray.init(address="local", num_cpus=LOGICAL_CPUS, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
