"""``spec.parallelism``: FSDP2 and HSDP sharding, activation checkpointing, compile, on real processes.

Real torchrun processes with gloo on CPU (HSDP: two torchrun agents of two processes each, as two pods of
two GPUs would be), real FSDP2 ``fully_shard``, real torch.compile (Inductor's CPU backend); nothing is
mocked. Exact resume with FSDP through Ray Train is in ``test_trainer_ray.py``.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
from typing import Any

import pytest
import torch
import trainer_support

from trainop_trainer import distributed, parallelize
from trainop_trainer.workloads import models


def torchrun(config_path: pathlib.Path, *, nproc: int, nnodes: int = 1, **env: str) -> list[str]:
    """Run the launcher on ``nnodes`` local torchrun agents of ``nproc`` processes; returns their logs."""
    port = distributed.free_port()
    agents = []
    for node in range(nnodes):
        rendezvous = ["--standalone"]
        if nnodes > 1:
            rendezvous = ["--nnodes", str(nnodes), "--node-rank", str(node), "--rdzv-backend", "c10d"]
            rendezvous += ["--rdzv-endpoint", f"127.0.0.1:{port}"]
        agents.append(
            subprocess.Popen(
                trainer_support.torchrun_command(config_path, nproc=nproc, rendezvous=rendezvous),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=trainer_support.subprocess_env(OMP_NUM_THREADS="1", **env),
            )
        )
    logs = [agent.communicate(timeout=600)[0] for agent in agents]
    return [f"rc={agent.returncode}\n{log}" for agent, log in zip(agents, logs, strict=True)]


def rc(log: str) -> int:
    return int(log.split("\n", 1)[0].removeprefix("rc="))


def test_hsdp_trains_on_two_pods_of_two_and_its_checkpoint_resumes_as_fsdp_on_two_ranks(
    tmp_path: pathlib.Path,
) -> None:
    hsdp = trainer_support.mlp_config(
        tmp_path, "hsdp", workers=2, max_steps=60, interval_steps=10, parallelism={"strategy": "hsdp"}
    )
    path = trainer_support.write_config(hsdp, tmp_path / "hsdp.json")
    # 4 ranks as 2 pods x 2: shard within a pod, replicate across; rank 3 dies after step 30's checkpoint.
    logs = torchrun(path, nproc=2, nnodes=2, TRAINOP_INJECT_FAILURE_AT_STEP="30")
    assert any(rc(log) != 0 for log in logs)
    assert "injected failure: rank 3 exits at step 30" in "".join(logs)
    step_30 = trainer_support.run_dir(hsdp) / "checkpoints" / "step_30"
    assert len(list(step_30.glob("*.distcp"))) == 4 and (step_30 / ".metadata").is_file()

    fsdp = trainer_support.with_spec(hsdp, parallelism={"strategy": "fsdp"})
    [log] = torchrun(trainer_support.write_config(fsdp, tmp_path / "fsdp.json"), nproc=2)

    assert rc(log) == 0, log[-4000:]
    assert "world size changed 4 -> 2" in log
    assert [e["step"] for e in trainer_support.events(fsdp) if e["event"] == "resume"] == [30]
    assert trainer_support.checkpoint_steps(fsdp)[-1] == 60


def _gpt_tiny() -> models.GPT:
    torch.manual_seed(0)
    return models.gpt("gpt-tiny", block_size=16, config={"vocabSize": 64, "numLayers": 4})


def test_activation_checkpointing_recomputes_the_chosen_blocks_with_the_same_gradients() -> None:
    plain, checkpointed = _gpt_tiny(), _gpt_tiny()
    blocks = models.block_names("gpt-tiny", checkpointed)
    wrapped = parallelize.apply_activation_checkpointing(checkpointed, blocks, every=2)
    tokens = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(1))

    grads: list[dict[str, Any]] = []
    for model in (plain, checkpointed):
        model(tokens).float().logsumexp(-1).mean().backward()
        # (named_parameters shows the wrapper; state_dict, which checkpoints use, does not)
        grads.append(
            {name.replace("._checkpoint_wrapped_module", ""): p.grad for name, p in model.named_parameters()}
        )

    assert wrapped == ["blocks.0", "blocks.2"]
    assert type(checkpointed.blocks[0]).__name__ == "CheckpointWrapper"
    assert type(checkpointed.blocks[1]).__name__ == "Block"
    # The state dict keeps the plain names (checkpoints do not depend on the setting).
    assert checkpointed.state_dict().keys() == plain.state_dict().keys()
    assert grads[0].keys() == grads[1].keys()
    assert all(torch.equal(grads[0][k], grads[1][k]) for k in grads[0])


def test_every_builtin_model_names_its_repeated_blocks() -> None:
    assert models.block_names("gpt-tiny", _gpt_tiny()) == ("blocks.0", "blocks.1", "blocks.2", "blocks.3")
    assert models.block_names("mlp", models.mlp(num_classes=3, config={"numLayers": 2})) == (
        "net.0",
        "net.2",
        "net.4",
    )
    resnet50 = models.block_names("resnet50", models.resnet("resnet50", num_classes=10))
    assert len(resnet50) == 3 + 4 + 6 + 3 and resnet50[0] == "layer1.0" and resnet50[-1] == "layer4.2"


@pytest.mark.slow
def test_fsdp_with_bf16_compile_and_activation_checkpointing_trains_and_resumes(
    tmp_path: pathlib.Path,
) -> None:
    config = trainer_support.mlp_config(
        tmp_path,
        "gpt-fsdp-compiled",
        workers=2,
        max_steps=6,
        interval_steps=2,
        batch_size=4,
        precision="bf16",
        workload={
            "model": "gpt-tiny",
            "dataset": {"kind": "synthetic", "sequenceLength": 32, "numSamples": 64, "numWorkers": 0},
            "config": {"vocabSize": 128},
        },
        parallelism={"strategy": "fsdp", "activationCheckpointing": {"mode": "blocks"}},
    )
    config = trainer_support.with_spec(config, compile=True)
    path = trainer_support.write_config(config, tmp_path / "trainer.json")
    [first] = torchrun(path, nproc=2, TRAINOP_INJECT_FAILURE_AT_STEP="4")
    assert rc(first) != 0 and trainer_support.checkpoint_steps(config)[-1] == 4
    assert "activation checkpointing on 2 of 2 blocks" in first
    assert re.search(r"torch\.compile: \d+ graphs captured in this process by the first training step", first)
    assert "captured no graph" not in first

    [second] = torchrun(path, nproc=2)

    assert rc(second) == 0, second[-4000:]
    assert [e["step"] for e in trainer_support.events(config) if e["event"] == "resume"] == [4]
    assert trainer_support.checkpoint_steps(config)[-1] == 6
    assert float(trainer_support.status(config)["progress"]["loss"]) > 0


def test_compile_wrapper_picks_inductors_cpp_or_python_wrapper_and_unset_leaves_inductors_own(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compileWrapper`` sets Inductor's wrapper for the graphs the worker compiles: ``cpp`` its C++ wrapper,
    ``python`` its Python one even where Inductor was set to C++ (an image's TORCHINDUCTOR_CPP_WRAPPER=1),
    unset leaves Inductor's own setting. What the setting then generates is checked on a real compile on
    the CPU (Inductor's C++ backend, gcc; a fresh compile cache, so that each graph is generated): C++
    wrappers (``inductor_entry_impl``) for the forward and backward graphs, or Python ones (``def call(``)."""
    import torch._inductor.config as inductor_config
    from torch._inductor.utils import run_and_get_code

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    config = trainer_support.mlp_config(tmp_path, "wrapper", workers=1)
    settings, generated = {}, {}
    # The config's own patch() restores the setting afterwards; pytest's monkeypatch.setattr on a torch config
    # module deletes the setting on undo ("torch._inductor.config.cpp_wrapper does not exist" in every later
    # compile of the process).
    restored = inductor_config.patch(cpp_wrapper=inductor_config.cpp_wrapper)
    with restored, trainer_support.world_of_one() as ctx:
        for wrapper, before in (("cpp", False), ("python", True), (None, True), (None, False)):
            inductor_config.cpp_wrapper = before
            fields = {"compile": True} | ({"compileWrapper": wrapper} if wrapper else {})
            spec = trainer_support.with_spec(config, **fields).spec
            parallelize.apply(torch.nn.Linear(4, 2), blocks=(), spec=spec, ctx=ctx)
            settings[(wrapper, before)] = inductor_config.cpp_wrapper
            if wrapper is None:
                continue
            torch._dynamo.reset()
            mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
            _, codes = run_and_get_code(_one_step, torch.compile(mlp))
            generated[wrapper] = [("inductor_entry_impl" in code, "def call(" in code) for code in codes]
    assert settings == {
        ("cpp", False): True,
        ("python", True): False,
        (None, True): True,
        (None, False): False,
    }
    assert generated == {"cpp": [(True, False)] * 2, "python": [(False, True)] * 2}


class _OwnForward(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class _NotCompiled(_OwnForward):
    @torch.compiler.disable  # type: ignore[untyped-decorator]
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


def test_a_compile_that_captured_no_graph_is_one_warning_naming_the_field(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``parallelize.check_compiled`` after the first step: real torch.compile of DDP on a gloo world of one.
    A module with its own forward is captured (INFO with the count); one whose forward torch.compile may not
    trace captures nothing, and rank 0 logs one WARNING naming spec.compile (locally, torch 2.15, DDP around
    an ``nn.Sequential`` compiled nothing: Dynamo skips torch's own forward after DDP's graph break)."""
    from torch._dynamo.utils import counters
    from torch.nn.parallel import DistributedDataParallel

    monkeypatch.setitem(counters, "stats", type(counters["stats"])())  # this test's captures only
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    spec = trainer_support.with_spec(trainer_support.mlp_config(tmp_path, "c", workers=1), compile=True).spec
    caplog.set_level("INFO", logger="trainop_trainer.parallelize")
    with trainer_support.world_of_one():
        torch._dynamo.reset()
        _one_step(torch.compile(DistributedDataParallel(_NotCompiled())))
        assert not parallelize.check_compiled(spec, "mlp", rank0=True)
        assert not parallelize.check_compiled(spec, "mlp", rank0=False)
        _one_step(torch.compile(DistributedDataParallel(_OwnForward())))
        assert parallelize.check_compiled(spec, "mlp", rank0=True)
    torch._dynamo.reset()
    ours = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == parallelize.log.name]
    warnings = [message for level, message in ours if level == "WARNING"]
    assert warnings == [parallelize.NOTHING_COMPILED % "mlp"], ours
    assert "spec.compile is true, but torch.compile captured no graph" in warnings[0]
    assert ours[-1][0] == "INFO" and ours[-1][1].startswith("torch.compile: "), ours
    config = trainer_support.mlp_config(tmp_path, "e", workers=1)
    eager = trainer_support.with_spec(config, compile=False).spec
    assert parallelize.check_compiled(eager, "mlp", rank0=True)  # nothing to check without compile


def _one_step(model: Any) -> None:
    model(torch.randn(3, 4)).sum().backward()
