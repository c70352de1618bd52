"""``spec.workload.rayTrain`` on an S3 storage path: Ray Train's ``RunConfig`` reaches the spec's bucket.

The built-in loop hands Ray Train the filesystem of ``checkpoint.storage.s3`` (endpoint, region, the
credentials of the environment); a Ray Train function's run must get the same, not pyarrow's defaults (AWS
in the SDK's region). The RunConfig is built without Ray running (constructing pyarrow's S3 client connects
to nothing); nothing is mocked.
"""

from __future__ import annotations

from typing import Any

import pyarrow.fs as pafs
import pytest

from trainop.api import trainer_config
from trainop_trainer import raytrain_function


def s3_function_config() -> trainer_config.TrainerConfig:
    spec: dict[str, Any] = {
        "workload": {"rayTrain": "trainop_ray_example.digits:train_loop_per_worker", "config": {}},
        "hyperparameters": {"epochs": 1},
        "workers": {"replicas": 2, "gpusPerWorker": 0, "cpusPerWorker": 1},
        "checkpoint": {
            "keepLast": 2,
            "storage": {
                "s3": {
                    "bucket": "ckpts",
                    "prefix": "runs",
                    "endpoint": "http://objects.example.internal:9000",
                    "region": "eu-test-1",
                    "credentialsSecret": "s3-creds",
                }
            },
        },
        "network": {"profile": "tcp", "probe": False},
    }
    return trainer_config.TrainerConfig.model_validate(
        {"jobName": "fn", "runName": "fn", "storagePath": "s3://ckpts/runs", "attempt": 1, "spec": spec},
        by_alias=True,
    )


def test_a_ray_train_functions_run_config_uses_the_specs_s3_endpoint_region_and_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    use = trainer_config.S3_CHECKPOINT
    monkeypatch.setenv(trainer_config.s3_secret_name_env(use), "s3-creds")
    monkeypatch.setenv(trainer_config.s3_env(use, "AWS_ACCESS_KEY_ID"), "the-key-id")
    monkeypatch.setenv(trainer_config.s3_env(use, "AWS_SECRET_ACCESS_KEY"), "the-secret")

    run_config = raytrain_function.run_config(s3_function_config(), worker_env={}, callbacks=[])

    assert run_config.name == "fn"
    assert run_config.storage_path == "ckpts/runs"
    filesystem = run_config.storage_filesystem
    assert isinstance(filesystem, pafs.S3FileSystem)
    options = filesystem.__reduce__()[1][0]  # the S3 client's settings, as pyarrow pickles them
    assert options["endpoint_override"] == "objects.example.internal:9000"
    assert options["scheme"] == "http"
    assert options["region"] == "eu-test-1"
    assert (options["access_key"], options["secret_key"]) == ("the-key-id", "the-secret")
    assert run_config.checkpoint_config.num_to_keep == 2


def test_a_ray_train_functions_run_config_on_a_volume_is_the_plain_storage_path(tmp_path: Any) -> None:
    config = s3_function_config()
    spec = config.spec.model_copy(deep=True)
    spec.checkpoint.storage.s3 = None
    config = config.model_copy(update={"storage_path": str(tmp_path), "spec": spec})

    run_config = raytrain_function.run_config(config, worker_env={}, callbacks=[])

    assert run_config.storage_path == str(tmp_path)
    assert run_config.storage_filesystem is None
