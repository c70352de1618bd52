"""bench/gpu/bare_ddp.py, the hand-written DDP reference of issue #21: its GPT data.

Round 20 (docs/benchmarks-gpu.md) found that bare DDP's two alternated GPT batches were memorised (loss 2.6
after 320 steps; the trainer's stays at ln(vocabulary)) while bare's throughput fell over a run and the
trainer's did not. These tests run the reference's own code on CPU (gloo, one process, the ``--tiny`` sizes):
by default a distinct batch every step and each rank its own, as the trainer's synthetic token stream has;
``BARE_GPT_TOKENS=repeat`` the old two.
"""

from __future__ import annotations

import math
import pathlib
from types import ModuleType

import pytest
import torch
import torch.distributed as dist

from tests.unit import bench_scripts


@pytest.fixture(scope="module")
def bare() -> ModuleType:
    module = bench_scripts.load("bare_ddp.py", "bare_ddp_reference")
    module.make_tiny()  # this module object's sizes only
    return module


def test_bare_gpt_batches_are_distinct_next_token_windows_and_each_rank_has_its_own(bare: ModuleType) -> None:
    cpu = torch.device("cpu")
    _, rank0, _, _ = bare.build("gpt-compile", cpu, gpt_batches=6, rank=0)
    _, rank1, _, _ = bare.build("gpt-compile", cpu, gpt_batches=6, rank=1)
    assert len(rank0) == 6
    assert len({tuple(inputs.flatten().tolist()) for inputs, _ in rank0}) == 6
    for inputs, targets in rank0:
        assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets are the inputs shifted by one token
    assert not torch.equal(rank0[0][0], rank1[0][0])


def test_bare_gpt_stream_is_not_memorised_and_repeat_is(
    bare: ModuleType, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        losses = {}
        for tokens in ("repeat", "stream"):
            monkeypatch.setenv("BARE_GPT_TOKENS", tokens)
            result = bare.run_one(
                "gpt-compile",
                device=torch.device("cpu"),
                world_size=1,
                warmup=2,
                steps=40,
                no_ddp_at_1=False,
                compile_=False,
            )
            assert result["gpt_tokens"] == tokens
            losses[tokens] = result["loss"]
        model, _, _, _ = bare.build("gpt-compile", torch.device("cpu"), gpt_batches=1)
        chance = math.log(model.config.vocab_size)
        # Fresh uniform tokens cannot be learnt: the loss stays near chance; two batches seen 20 times each
        # are learnt well below it.
        assert losses["stream"] > 0.9 * chance, (losses, chance)
        assert losses["repeat"] < 0.75 * chance, (losses, chance)
        monkeypatch.setenv("BARE_GPT_TOKENS", "twice")
        with pytest.raises(SystemExit, match="BARE_GPT_TOKENS='twice': use stream or repeat"):
            bare.run_one(
                "gpt-compile", device=torch.device("cpu"), world_size=1, warmup=1, steps=1, no_ddp_at_1=False
            )
    finally:
        dist.destroy_process_group()
