"""N -> M: a checkpoint saved by N ranks resumes on M ranks; DCP re-cuts the FSDP2 shards.

Real torchrun processes, gloo on CPU, the trainer's own ``Checkpointer`` and parts (``resharding_worker.py``):
FSDP2-sharded model and AdamW state saved by 2 ranks, then loaded by 3 ranks and by 1 rank (FSDP2) and by 2
ranks as DDP (full tensors); the full state after loading must equal, bit for bit, the full state that was
saved. The built-in Trainer resuming on another world size is in ``test_trainer_launch.py``.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest
import trainer_support

WORKER = pathlib.Path(__file__).with_name("resharding_worker.py")


def torchrun(nproc: int, *args: str) -> None:
    done = subprocess.run(
        [
            trainer_support.PYTHON,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            str(WORKER),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=trainer_support.subprocess_env(OMP_NUM_THREADS="1"),
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]


@pytest.fixture(scope="module")
def saved_by_two_ranks(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("reshard")
    torchrun(2, "save", str(directory))
    assert (directory / "checkpoints" / "step_3" / ".metadata").is_file()
    return directory


@pytest.mark.parametrize(("world_size", "layout"), [(3, "fsdp"), (1, "fsdp"), (2, "ddp")])
def test_fsdp_state_saved_on_2_ranks_loads_exactly_on_another_world_size_or_layout(
    saved_by_two_ranks: pathlib.Path, world_size: int, layout: str
) -> None:
    torchrun(world_size, "load", str(saved_by_two_ranks), layout)
    result = json.loads((saved_by_two_ranks / f"load-{world_size}-{layout}.json").read_text())
    assert (result["step"], result["train_state_step"], result["saved_world_size"]) == (3, 3, 2)
    assert result["keys_equal"] and result["mismatched"] == []
