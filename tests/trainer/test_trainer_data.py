"""``spec.data``: a dataset copied from a bucket prefix into the data directory, and read from there.

Against the real S3 server of tests/objectstore. The end-to-end case runs the real launcher under torchrun
with 2 ranks sharing one data directory (as the ranks of one pod do): one rank copies, the other finds the
file, and the job trains bitwise like the same job reading the same file from a local path, which is what
keeps per-rank sharding and the resumable order exact. Nothing is mocked.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import uuid
from typing import Any

import numpy as np
import pytest
import torch
import trainer_support

from tests.objectstore.server import S3Server
from trainop.api import trainer_config, trainingjob
from trainop_trainer import data_source, storage


def upload(server: S3Server, bucket: str, key: str, data: bytes) -> None:
    with server.filesystem().open_output_stream(f"{bucket}/{key}") as stream:
        stream.write(data)


def tokens(count: int = 40_000) -> bytes:
    return np.random.default_rng(3).integers(0, 1024, size=count, dtype=np.uint16).tobytes()


def data_spec(server: S3Server, bucket: str, *, prefix: str = "tokens") -> trainingjob.TrainingJobSpec:
    return trainingjob.TrainingJobSpec.model_validate(
        {
            "workload": {"model": "gpt-tiny", "dataset": {"kind": "tokens", "path": "train.bin"}},
            "hyperparameters": {"maxSteps": 10},
            "data": {
                "s3": server.bucket(bucket, prefix=prefix, secret="data-creds").model_dump(by_alias=True)
            },
        },
        by_alias=True,
    )


@pytest.fixture
def data_env(s3_server: S3Server, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    for key, value in s3_server.env(trainer_config.S3_DATA, secret="data-creds").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(trainer_config.DATA_DIR_ENV, str(tmp_path / "data"))
    return tmp_path / "data"


def test_the_first_rank_copies_the_prefix_and_the_next_finds_it_there(
    s3_server: S3Server, data_env: pathlib.Path
) -> None:
    bucket = s3_server.create_bucket(f"data-{uuid.uuid4().hex[:8]}")
    upload(s3_server, bucket, "tokens/train.bin", tokens())
    upload(s3_server, bucket, "tokens/extra/readme.txt", b"nested objects keep their directories\n")
    spec = data_spec(s3_server, bucket)
    source = storage.StoragePath(
        storage.s3_filesystem(spec.data.s3, use=trainer_config.S3_DATA), f"{bucket}/tokens"
    )  # type: ignore[union-attr]

    assert data_source.prepare(spec) == data_env
    assert (data_env / "train.bin").read_bytes() == tokens()
    assert (data_env / "extra" / "readme.txt").is_file()
    assert data_source.sync(source, data_env) == (0, 2, 0)  # a second rank, or a restarted worker group
    resolved = data_source.with_data_dir(spec, data_env)
    assert resolved.workload.dataset.path == str(data_env / "train.bin")


def test_an_empty_prefix_is_refused_naming_the_field(s3_server: S3Server, data_env: pathlib.Path) -> None:
    bucket = s3_server.create_bucket(f"data-{uuid.uuid4().hex[:8]}")
    with pytest.raises(data_source.DataSourceError, match=r"spec\.data\.s3: no objects under s3://"):
        data_source.prepare(data_spec(s3_server, bucket, prefix="typo"))


def test_an_absolute_dataset_path_is_kept_and_a_data_claim_outside_a_cluster_needs_a_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = trainingjob.TrainingJobSpec.model_validate(
        {
            "workload": {"model": "gpt-tiny", "dataset": {"kind": "tokens", "path": "/mnt/train.bin"}},
            "hyperparameters": {"maxSteps": 10},
            "data": {"existingClaim": "corpus"},
        },
        by_alias=True,
    )
    assert data_source.with_data_dir(spec, pathlib.Path("/data")).workload.dataset.path == "/mnt/train.bin"
    monkeypatch.delenv(trainer_config.DATA_DIR_ENV, raising=False)
    with pytest.raises(
        data_source.DataSourceError, match=r"spec\.data\.existingClaim 'corpus'.*TRAINOP_DATA_DIR"
    ):
        data_source.data_dir(spec)


# ------------------------------------------------------------------------------------- end to end
def gpt_tiny_config(storage_path: pathlib.Path, name: str, **spec: Any) -> trainer_config.TrainerConfig:
    base = trainer_support.mlp_config(storage_path, name, max_steps=12, interval_steps=6, batch_size=4)
    wire = json.loads(trainer_config.dumps(base))
    wire["spec"]["workload"] = {
        "model": "gpt-tiny",
        "config": {"vocabSize": 1024},
        "dataset": {"kind": "tokens", "path": spec.pop("path"), "sequenceLength": 32, "numWorkers": 0},
    }
    wire["spec"].update(spec)
    return trainer_config.TrainerConfig.model_validate(wire, by_alias=True, by_name=False)


def torchrun(
    config: trainer_config.TrainerConfig, tmp_path: pathlib.Path, **env: str
) -> subprocess.CompletedProcess[str]:
    path = trainer_support.write_config(config, tmp_path / f"{config.run_name}.json")
    return trainer_support.run_torchrun(path, **env)


@pytest.mark.slow
def test_a_tokens_dataset_from_a_bucket_trains_bitwise_like_the_same_file_on_disk(
    s3_server: S3Server, tmp_path: pathlib.Path
) -> None:
    local = tmp_path / "local" / "train.bin"
    local.parent.mkdir()
    local.write_bytes(tokens())
    bucket = s3_server.create_bucket(f"data-{uuid.uuid4().hex[:8]}")
    upload(s3_server, bucket, "corpus/train.bin", tokens())

    reference = gpt_tiny_config(tmp_path / "ref", "ref", path=str(local))
    done = torchrun(reference, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr

    data = {"s3": s3_server.bucket(bucket, prefix="corpus", secret="data-creds").model_dump(by_alias=True)}
    from_bucket = gpt_tiny_config(tmp_path / "s3run", "from-bucket", path="train.bin", data=data)
    data_dir = tmp_path / "pod-data"
    done = torchrun(
        from_bucket,
        tmp_path,
        TRAINOP_DATA_DIR=str(data_dir),
        **s3_server.env(trainer_config.S3_DATA, secret="data-creds"),
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output

    assert (data_dir / "train.bin").read_bytes() == local.read_bytes()
    assert output.count("data: copied 1 object(s)") == 1, output  # one rank copied, the other found it
    reference_model = trainer_support.final_model(reference, 12)
    bucket_model = trainer_support.final_model(from_bucket, 12)
    assert reference_model.keys() == bucket_model.keys()
    assert all(torch.equal(reference_model[k], bucket_model[k]) for k in reference_model)
