"""The trainer with its run on a real S3 server: the exact-resume tests of ``test_trainer_ray.py`` again.

The storage path is ``s3://<bucket>/runs`` and the spec's ``checkpoint.storage.s3`` names the session's
versitygw (tests/objectstore); its credentials are in Ray's environment as the operator puts a Secret's keys
into every Ray container (tests/trainer/conftest.py). Everything the run writes — DCP checkpoints, the
commit marker, events, status.json, Ray Train's own files — goes to the bucket; the tests read it back
through the S3 API. Worker failures are real process deaths; nothing is mocked. The references are the
same uninterrupted torchrun runs on a local directory as in ``test_trainer_ray.py`` (once per session).
"""

from __future__ import annotations

import pathlib

import pytest
import trainer_support
from test_trainer_ray import Params, bitwise_equal

from tests.objectstore.server import S3Server
from trainop_trainer import ray_train, storage

pytestmark = pytest.mark.ray

# One strategy per test here, the other one in test_trainer_ray.py (see there): a killed worker with FSDP2
# (each rank writes its own shard to the bucket), a new attempt with DDP.


@pytest.mark.parametrize("uninterrupted", ["fsdp"], indirect=True)
def test_on_s3_a_killed_worker_is_restarted_and_training_ends_bitwise_equal_to_an_uninterrupted_run(
    ray_cluster: str, s3_server: S3Server, uninterrupted: tuple[str, Params], tmp_path: pathlib.Path
) -> None:
    strategy, reference = uninterrupted
    config = trainer_support.on_s3(trainer_support.exact_config(tmp_path, strategy), s3_server)

    result = ray_train.run(config, inject_failure_at_step=25)

    assert (result.outcome, result.step) == ("completed", 60), result
    events = trainer_support.events(config)
    assert [e["step"] for e in events if e["event"] == "resume"] == [20]
    assert len([e for e in events if e["event"] == "start"]) == 2
    status = trainer_support.status(config)
    assert status["progress"]["workerRestarts"] == 1
    assert status["checkpoint"]["path"].startswith(f"{config.storage_path}/exact-resume/checkpoints/step_")
    assert bitwise_equal(trainer_support.final_model(config, 60), reference)
    assert not (tmp_path / "exact-resume").exists()  # nothing went to the local directory


@pytest.mark.parametrize("uninterrupted", ["ddp"], indirect=True)
def test_on_s3_a_new_attempt_resumes_bitwise_exactly_from_the_bucket(
    ray_cluster: str, s3_server: S3Server, uninterrupted: tuple[str, Params], tmp_path: pathlib.Path
) -> None:
    strategy, reference = uninterrupted
    exact = trainer_support.exact_config(tmp_path, strategy, max_worker_failures=0)
    config = trainer_support.on_s3(exact, s3_server)
    first = ray_train.run(config, inject_failure_at_step=25)
    assert first.outcome == "failed", first
    assert 60 not in trainer_support.checkpoint_steps(config)

    second = ray_train.run(config.model_copy(update={"attempt": 2}))

    assert (second.outcome, second.step) == ("completed", 60), second
    starts = [e for e in trainer_support.events(config) if e["event"] == "start"]
    resumes = [e for e in trainer_support.events(config) if e["event"] == "resume"]
    assert [e["attempt"] for e in starts] == [1, 2]
    assert [(e["step"], e["launch"]) for e in resumes] == [(20, starts[1]["launch"])]
    assert bitwise_equal(trainer_support.final_model(config, 60), reference)
    # Ray Train's own run state is in the bucket too: no Ray node needs a shared volume.
    run = trainer_support.run_files(config)
    assert isinstance(run, storage.StoragePath) and any(
        info.base_name.startswith(".validate_storage_marker")
        or info.base_name == "checkpoint_manager_snapshot.json"
        for info in run.files()
    ), [info.path for info in run.files()]
