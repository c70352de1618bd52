"""Object storage without Ray: the driver's start-up check; a checkpoint killed in the middle of its upload.

Against the real S3 server of tests/objectstore (versitygw): a wrong secret key, a bucket that does not
exist, a credentials Secret whose keys never arrived and an endpoint nobody listens on each give one
sentence with its reason, as ``status.storage`` and the StorageReady condition carry them. The interrupted
upload is a real process killed with SIGKILL while DCP streams a checkpoint's data into the bucket (and,
for comparison, onto a directory). Nothing is mocked.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid

import pytest
import trainer_support

from tests.objectstore.server import S3Server, free_port
from trainop.api import trainer_config, trainingjob
from trainop_trainer import checkpoint_store, ray_train, storage

WORKER = pathlib.Path(__file__).with_name("interrupted_save_worker.py")


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The server's credentials in this process's environment, as the operator sets them from the Secret."""
    for key, value in s3_server.env(trainer_config.S3_CHECKPOINT).items():
        monkeypatch.setenv(key, value)
    return s3_server


def job(
    tmp_path: pathlib.Path, server: S3Server, *, bucket: str | None = None
) -> trainer_config.TrainerConfig:
    return trainer_support.on_s3(trainer_support.mlp_config(tmp_path, "check"), server, bucket=bucket)


def test_the_start_up_check_passes_on_a_writable_bucket_and_leaves_nothing_behind(
    s3_env: S3Server, tmp_path: pathlib.Path
) -> None:
    config = job(tmp_path, s3_env)
    assert ray_train.check_storage(config) is None
    bucket = config.spec.checkpoint.storage.s3
    assert bucket is not None
    assert not any((s3_env.root / bucket.bucket).rglob(".trainop-write-check-*"))


def test_a_wrong_secret_key_is_access_denied_naming_the_credentials_secret(
    s3_env: S3Server, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = job(tmp_path, s3_env)
    monkeypatch.setenv(
        trainer_config.s3_env(trainer_config.S3_CHECKPOINT, "AWS_SECRET_ACCESS_KEY"), "not-the-key"
    )
    problem = ray_train.check_storage(config)
    assert problem is not None and problem.reason == "AccessDenied", problem
    assert "spec.checkpoint.storage.s3.credentialsSecret" in problem.message
    assert problem.message.count("\n") == 0


def test_a_bucket_that_does_not_exist_is_bucket_not_found(s3_env: S3Server, tmp_path: pathlib.Path) -> None:
    config = job(tmp_path, s3_env, bucket=f"missing-{uuid.uuid4().hex[:8]}")
    problem = ray_train.check_storage(config)
    assert problem is not None and problem.reason == "BucketNotFound", problem
    assert "does not exist" in problem.message and "spec.checkpoint.storage.s3.bucket" in problem.message


def test_a_credentials_secret_whose_keys_never_arrived_is_credentials_missing(
    s3_server: S3Server, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The operator's secretKeyRefs are optional: a missing Secret leaves the variables unset, the pod starts
    # and the trainer says so, instead of the pod hanging in CreateContainerConfigError.
    monkeypatch.setenv(trainer_config.s3_secret_name_env(trainer_config.S3_CHECKPOINT), "ckpt-creds")
    for key in trainer_config.S3_SECRET_KEYS:
        monkeypatch.delenv(trainer_config.s3_env(trainer_config.S3_CHECKPOINT, key), raising=False)
    problem = ray_train.check_storage(job(tmp_path, s3_server))
    assert problem is not None and problem.reason == "CredentialsMissing", problem
    assert "'ckpt-creds'" in problem.message and "AWS_ACCESS_KEY_ID" in problem.message


def test_an_endpoint_nobody_listens_on_is_endpoint_unreachable(
    s3_env: S3Server, tmp_path: pathlib.Path
) -> None:
    config = job(tmp_path, s3_env)
    spec = config.spec.model_copy(deep=True)
    assert spec.checkpoint.storage.s3 is not None
    spec.checkpoint.storage.s3.endpoint = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    problem = ray_train.check_storage(config.model_copy(update={"spec": spec}))
    assert problem is not None and problem.reason == "EndpointUnreachable", problem
    assert "spec.checkpoint.storage.s3.endpoint" in problem.message


def test_the_trainer_exits_2_with_one_line_when_its_storage_refuses_the_credentials(
    s3_server: S3Server, tmp_path: pathlib.Path
) -> None:
    config = job(tmp_path, s3_server)
    path = trainer_support.write_config(config, tmp_path / "trainer.json")
    env = trainer_support.subprocess_env(
        **s3_server.env(trainer_config.S3_CHECKPOINT, secret_key="not-the-key"), RAY_ADDRESS=""
    )
    done = subprocess.run(
        [sys.executable, "-m", "trainop_trainer", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("trainop: error:")]
    assert len(errors) == 1 and "refused the credentials" in errors[0], done.stderr


# ------------------------------------------------------------------------------ an interrupted upload
@pytest.mark.parametrize("where", ["volume", "s3"])
def test_a_checkpoint_killed_in_the_middle_of_its_upload_is_never_chosen_for_resume(
    s3_server: S3Server, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A process saves step 1 (small), then step 2 with 600 MB of state, and is SIGKILLed once tens of MB of
    step 2 are on the server (or the disk). Step 2 must never count: no commit marker, never loaded, deleted
    by the next writer; the resume takes step 1."""
    env = trainer_support.subprocess_env(OMP_NUM_THREADS="1")
    if where == "s3":
        bucket = s3_server.create_bucket(f"kill-{uuid.uuid4().hex[:8]}")
        for key, value in s3_server.env(trainer_config.S3_CHECKPOINT).items():
            monkeypatch.setenv(key, value)
            env[key] = value
        spec = s3_server.bucket(bucket)
        root: storage.RunDir = storage.for_uri(
            f"s3://{bucket}/run", bucket=spec, use=trainer_config.S3_CHECKPOINT
        )
        disk = s3_server.root / bucket  # the run's objects, and the server's in-progress multipart uploads
        argv = [str(WORKER), f"s3://{bucket}/run", spec.model_dump_json(by_alias=True)]
    else:
        root = tmp_path / "run"
        disk = root
        argv = [str(WORKER), str(root), ""]
    child = subprocess.Popen([sys.executable, *argv], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "committed 1", "the first checkpoint was not written"
        assert child.stdout.readline().strip() == "saving 2"
        deadline = time.monotonic() + 120
        while _bytes_under(disk) < 60 << 20:
            assert child.poll() is None, "the save finished before it could be interrupted"
            assert time.monotonic() < deadline, "the upload never got going"
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()

    store = checkpoint_store.CheckpointStore(root / "checkpoints")
    assert store.committed_steps() == [1]
    assert not (store.step_path(2) / ".metadata").exists()
    found = store.newest_valid()
    assert found is not None and found.step == 1
    store.remove_stale()  # what the next worker group's rank 0 does before its first save
    assert [step for step, _ in store.step_dirs()] == [1]


def _bytes_under(directory: pathlib.Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                continue
    return total


def test_the_spec_names_where_checkpoints_go_and_the_config_renders_it_as_an_s3_storage_path() -> None:
    spec = trainingjob.TrainingJobSpec.model_validate(
        {
            "workload": {"model": "mlp"},
            "hyperparameters": {"maxSteps": 10},
            "checkpoint": {"storage": {"s3": {"bucket": "ckpt", "prefix": "team-a/jobs"}}},
        },
        by_alias=True,
    )
    assert trainer_config.storage_path_for(spec) == "s3://ckpt/team-a/jobs"
