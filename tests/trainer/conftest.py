"""Fixtures of the trainer tests: one Ray runtime shared by every ``@pytest.mark.ray`` test.

Ray start-up is slow on small machines, so the runtime is started once, with more logical CPUs than cores
(Ray Train's controller and helpers must never wait for a CPU: with logical CPUs equal to 2 cores it
deadlocks). Ray Train polls its workers every 2 s by default; the tests make it poll every 0.5 s and skip
the preemption watcher actor, to spend less time waiting. Helpers live in ``trainer_support.py``; the
tracking tests share one real MLflow server (``mlflow_server.py``).

The session's S3 server (tests/objectstore) starts before Ray, and its credentials are in the environment
Ray starts with, under the names the operator gives a Secret's keys in every Ray container
(``trainer_config.s3_env``): every Ray worker has them as every Ray pod would, and no test passes
credentials through a config or a runtime env.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests import session_beds
from tests.objectstore.server import S3Server
from trainop.api import trainer_config

# Read by Ray Train's controller from the driver's environment when fit() starts.
_RAY_TRAIN_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
}


@pytest.fixture(scope="session")
def ray_cluster(s3_server: S3Server) -> Iterator[str]:
    """A local Ray runtime shared by every Ray test; yields its address (for driver subprocesses)."""
    import ray

    env = {
        **_RAY_TRAIN_ENV,
        **s3_server.env(trainer_config.S3_CHECKPOINT),
        **s3_server.env(trainer_config.S3_DATA),
    }
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    # address="local": a runtime of its own even while other Ray clusters run on this machine (other test
    # sessions, a cluster bed's Ray pods): without it ray.init joins the newest one and refuses num_cpus.
    context = ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    session_beds.register("trainer Ray runtime", ray.shutdown)
    try:
        yield str(context.address_info["gcs_address"])
    finally:
        session_beds.unregister("trainer Ray runtime")
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session", params=["ddp", "fsdp"])
def uninterrupted(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Any]:
    """``(strategy, final parameters)`` of the exact-resume reference (``trainer_support.uninterrupted_run``),
    once per strategy for the session: test_trainer_ray.py and test_trainer_s3.py compare against the same
    run. A test picks its strategy: ``@pytest.mark.parametrize("uninterrupted", [...], indirect=True)``."""
    import trainer_support

    strategy: str = request.param
    storage = tmp_path_factory.mktemp(f"uninterrupted-{strategy}")
    return strategy, trainer_support.uninterrupted_run(storage, strategy)
