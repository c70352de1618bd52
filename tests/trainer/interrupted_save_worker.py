"""A process that saves two checkpoints through the Checkpointer and is meant to be killed during the second.

    python interrupted_save_worker.py ROOT BUCKET_JSON

ROOT is a directory or ``s3://bucket/prefix`` (then BUCKET_JSON is the spec's S3Bucket, credentials in the
environment). Step 1 (a few KB) is saved and committed, then step 2 with 400 MB of tensors; the process
prints ``committed 1`` and ``saving 2`` and waits for the second save, which the test interrupts with
SIGKILL (test_trainer_storage.py).
"""

from __future__ import annotations

import datetime
import sys
from typing import Any

import torch
import torch.distributed as dist

from trainop.api import trainer_config, trainingjob
from trainop_trainer import config as config_module
from trainop_trainer import distributed, run_record, storage
from trainop_trainer.checkpointer import Checkpointer


class Blob:
    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {"small": torch.arange(16, dtype=torch.float32)}

    def state_dict(self) -> dict[str, Any]:
        return dict(self.tensors)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.tensors = dict(state_dict)


def main(root_arg: str, bucket_json: str) -> None:
    bucket = trainingjob.S3Bucket.model_validate_json(bucket_json) if bucket_json else None
    run = storage.for_uri(root_arg, bucket=bucket, use=trainer_config.S3_CHECKPOINT)
    dist.init_process_group(
        "gloo",
        rank=0,
        world_size=1,
        init_method=f"tcp://127.0.0.1:{distributed.free_port()}",
        timeout=datetime.timedelta(seconds=600),
    )
    ctx = distributed.WorkerContext(
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        node_rank=0,
        device=torch.device("cpu"),
        backend="gloo",
    )
    record = run_record.RunRecord(paths=config_module.RunPaths(run_dir=run), launch_id="kill", is_rank0=True)
    checkpointer = Checkpointer(root=run / "checkpoints", ctx=ctx, keep_last=5, record=record)
    blob = Blob()
    checkpointer.register("blob", blob)
    checkpointer.save(step=1, epoch=0, progress={}, metrics={}, wait=True)
    print("committed 1", flush=True)
    generator = torch.Generator().manual_seed(0)
    blob.tensors = {f"t{i}": torch.randn(25 << 20, generator=generator) for i in range(4)}  # 4 x 100 MB
    print("saving 2", flush=True)
    checkpointer.save(step=2, epoch=0, progress={}, metrics={}, wait=True)
    print("committed 2", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
