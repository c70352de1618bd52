"""Helpers of the trainer tests: job configs and readers of a run's files (imported as a module)."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import pathlib
import socket
import subprocess
import sys
import uuid
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from trainop.api import trainer_config

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES_USER = REPO / "examples" / "user_entrypoint"
PYTHON = sys.executable


def free_port_block(size: int = 2) -> int:
    """A port p such that p .. p+size-1 were free a moment ago (metrics ports are base + local rank)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + size > 65535:
            continue
        try:
            for offset in range(1, size):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
    raise RuntimeError("no free block of ports")


def mlp_config(
    storage: pathlib.Path,
    name: str,
    *,
    workers: int = 2,
    max_steps: int = 60,
    interval_steps: int | None = 10,
    interval_minutes: float | None = None,
    max_worker_failures: int = 2,
    every_steps: int = 10,
    num_samples: int = 2048,
    batch_size: int = 16,
    hidden_dim: int = 64,
    metrics_port: int | None = None,
    probe: bool = False,
    workload: dict[str, Any] | None = None,
    parallelism: dict[str, Any] | None = None,
    precision: str = "fp32",
) -> trainer_config.TrainerConfig:
    """A small deterministic CPU job: the MLP on synthetic data, fp32, gloo."""
    spec: dict[str, Any] = {
        "workload": workload
        or {
            "model": "mlp",
            "config": {"inputDim": 16, "hiddenDim": hidden_dim},
            "dataset": {"kind": "synthetic", "numSamples": num_samples, "numClasses": 10, "numWorkers": 0},
        },
        "hyperparameters": {
            "maxSteps": max_steps,
            "batchSizePerWorker": batch_size,
            "learningRate": 0.05,
            "momentum": 0.9,
            "schedule": {"kind": "cosine", "warmupSteps": 5},
            "gradientClipNorm": 1.0,
            "seed": 11,
        },
        "precision": precision,
        "parallelism": parallelism or {},
        "workers": {"replicas": workers, "gpusPerWorker": 0, "cpusPerWorker": 1},
        "checkpoint": {"intervalSteps": interval_steps, "intervalMinutes": interval_minutes, "keepLast": 20},
        "failurePolicy": {"maxWorkerFailures": max_worker_failures},
        "network": {"profile": "tcp", "probe": probe, "probeMegabytes": 1},
        "reporting": {
            "everySteps": every_steps,
            "everySeconds": 3600,
            "metricsPort": metrics_port or free_port_block(),
        },
    }
    return trainer_config.TrainerConfig.model_validate(
        {"jobName": name, "runName": name, "storagePath": str(storage), "attempt": 1, "spec": spec},
        by_alias=True,
    )


def exact_config(
    storage: pathlib.Path, strategy: str = "ddp", **overrides: Any
) -> trainer_config.TrainerConfig:
    """60 steps of the MLP, checkpoints every 10 steps, 2 workers: the same math in every exact-resume test
    (with FSDP2 the MLP's layers are sharded over the 2 ranks, and so are the checkpoints)."""
    return mlp_config(
        storage,
        "exact-resume",
        max_steps=60,
        interval_steps=10,
        parallelism={"strategy": strategy},
        **overrides,
    )


def torchrun_command(
    config_path: pathlib.Path, *, nproc: int = 2, rendezvous: Sequence[str] = ("--standalone",)
) -> list[str]:
    """The Trainer under torchrun (``trainop_trainer.launch``, no Ray) on ``nproc`` local ranks."""
    return [
        PYTHON, "-m", "torch.distributed.run", *rendezvous, "--nproc-per-node", str(nproc),
        "-m", "trainop_trainer.launch", "--config", str(config_path),
    ]  # fmt: skip


def run_torchrun(
    config_path: pathlib.Path, *, nproc: int = 2, timeout: float = 600, **env: str
) -> subprocess.CompletedProcess[str]:
    """:func:`torchrun_command` to its end, one OpenMP thread per rank, ``env`` added; output captured."""
    return subprocess.run(
        torchrun_command(config_path, nproc=nproc),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=subprocess_env(**{"OMP_NUM_THREADS": "1", **env}),
    )


def uninterrupted_run(storage: pathlib.Path, strategy: str) -> dict[str, Any]:
    """The reference of the exact-resume tests: :func:`exact_config`'s 60 steps on 2 ranks without
    interruption, the same Trainer under torchrun instead of Ray Train (8 s instead of 25 s here). Ray Train
    must reproduce it bit for bit, so every equality to it also checks that the launcher does not change
    the math. The final model's parameters."""
    config = exact_config(storage, strategy)
    done = run_torchrun(write_config(config, storage / "trainer.json"), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert checkpoint_steps(config)[-1] == 60
    return final_model(config, 60)


def with_spec(config: trainer_config.TrainerConfig, **fields: Any) -> trainer_config.TrainerConfig:
    """``config`` with top-level spec fields replaced (by their wire names), validated again."""
    data = config.model_dump(mode="json", by_alias=True)
    data["spec"].update(fields)
    return trainer_config.TrainerConfig.model_validate(data, by_alias=True)


def run_dir(config: trainer_config.TrainerConfig) -> pathlib.Path:
    """The run's directory on the volume (configs whose storage path is a local directory)."""
    return pathlib.Path(config.storage_path) / config.run_name


def on_s3(
    config: trainer_config.TrainerConfig, server: Any, *, bucket: str | None = None
) -> trainer_config.TrainerConfig:
    """``config`` with its run in a bucket of the S3 test server (a new one unless ``bucket`` is given): the
    storage path ``s3://<bucket>/runs``, and the spec's checkpoint.storage.s3 naming the server and a
    credentials Secret, whose keys the test puts into the environment (``server.env()``)."""
    bucket = bucket or server.create_bucket(f"run-{uuid.uuid4().hex[:12]}")
    spec = config.spec.model_copy(deep=True)
    spec.checkpoint.storage.s3 = server.bucket(bucket, prefix="runs")
    return config.model_copy(update={"storage_path": f"s3://{bucket}/runs", "spec": spec})


def run_files(config: trainer_config.TrainerConfig) -> Any:
    """The run's directory as the trainer sees it: a ``pathlib.Path``, or a ``storage.StoragePath`` in the
    bucket of an ``s3://`` storage path (read with the credentials in this process's environment)."""
    from trainop_trainer import config as config_module

    return config_module.paths_for(config).run_dir


def checkpoint_steps(config: trainer_config.TrainerConfig) -> list[int]:
    """Every ``step_<N>`` directory, committed or not."""
    from trainop_trainer import checkpoint_store

    return sorted(
        step for step, _ in checkpoint_store.CheckpointStore(run_files(config) / "checkpoints").step_dirs()
    )


def checkpoint_part(config: trainer_config.TrainerConfig, step: int, part: str) -> dict[str, Any]:
    """One part of a committed checkpoint, read from its DCP files as full CPU tensors (any world size)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    from trainop_trainer import dcp_storage, storage

    path = storage.at(run_files(config) / "checkpoints" / f"step_{step}")
    assert (path / ".metadata").is_file(), f"{path} is not a committed checkpoint"
    where: dict[str, Any] = (
        {"checkpoint_id": path.path} if path.is_local else {"storage_reader": dcp_storage.ArrowReader(path)}
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is unavailable or uninitialized")
        state: dict[str, Any] = _load_state_dict_from_keys(keys={part}, **where)[part]
    return state


def final_model(config: trainer_config.TrainerConfig, step: int) -> dict[str, Any]:
    """The model's parameters in the checkpoint of ``step``, by parameter name."""
    return checkpoint_part(config, step, "model")


def user_state(config: trainer_config.TrainerConfig, step: int) -> dict[str, Any]:
    """What a user entrypoint saved at ``step`` (as ``ctx.load_checkpoint().state`` returns it)."""
    from trainop_trainer import stateful

    part = stateful.UserState(is_rank0=True)
    part.load_state_dict(checkpoint_part(config, step, "user"))
    assert part.restored is not None
    return part.restored


@contextlib.contextmanager
def switches_from_env(monkeypatch: Any, text: str) -> Iterator[None]:
    """``TRAINOP_SWITCHES=text`` read as a process reads it at start (``switches.reset``), then the
    defaults again."""
    from trainop_trainer import switches

    monkeypatch.setenv(switches.ENV, text)
    switches.reset()
    try:
        yield
    finally:
        monkeypatch.delenv(switches.ENV)
        switches.reset()


def train_controller_logs() -> set[pathlib.Path]:
    """The Ray Train controllers' system logs of the shared Ray runtime so far: each controller writes its
    own ``logs/train/ray-train-sys-controller-<worker id>.log`` (an actor's worker process is never
    reused)."""
    import ray

    logs = pathlib.Path(ray._private.worker._global_node.get_logs_dir_path())
    return set((logs / "train").glob("ray-train-sys-controller-*.log"))


def train_controllers() -> int:
    """How many Ray Train controllers the shared Ray runtime has started so far."""
    return len(train_controller_logs())


def actors_started(class_name: str) -> int:
    """How many actors of ``class_name`` the connected Ray runtime has started so far, alive or dead (the
    GCS's actor table)."""
    import ray._private.state

    return sum(1 for actor in ray._private.state.actors().values() if actor["ActorClassName"] == class_name)


def controller_messages(before: set[pathlib.Path]) -> list[str]:
    """The messages of the controllers started since ``before`` (``train_controller_logs()``), in order."""
    messages: list[str] = []
    for path in sorted(train_controller_logs() - before):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                messages.append(str(json.loads(line).get("message", "")))
    return messages


def events(config: trainer_config.TrainerConfig) -> list[dict[str, Any]]:
    path = run_files(config) / "trainop" / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def status(config: trainer_config.TrainerConfig) -> dict[str, Any]:
    path = run_files(config) / "status.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data


def write_config(config: trainer_config.TrainerConfig, path: pathlib.Path) -> pathlib.Path:
    path.write_text(trainer_config.dumps(config))
    return path


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a child python that imports the repo's packages."""
    env = dict(os.environ)
    env.update(extra)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def launch_one(
    config: trainer_config.TrainerConfig, config_path: pathlib.Path, **env: str
) -> subprocess.CompletedProcess[str]:
    """``python -m trainop_trainer.launch --config`` as one process (world size 1, no Ray), ``env`` added to
    its environment; its output captured."""
    return subprocess.run(
        [PYTHON, "-m", "trainop_trainer.launch", "--config", str(write_config(config, config_path))],
        capture_output=True,
        text=True,
        timeout=180,
        env=subprocess_env(**env),
    )


@contextlib.contextmanager
def world_of_one() -> Iterator[Any]:
    """A gloo process group of one rank in this process (the Checkpointer's DCP collectives need one);
    yields the rank's ``WorkerContext`` on the CPU."""
    import torch.distributed as dist

    from trainop_trainer import distributed

    dist.init_process_group(
        "gloo",
        rank=0,
        world_size=1,
        init_method=f"tcp://127.0.0.1:{distributed.free_port()}",
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        yield cpu_context()
    finally:
        dist.destroy_process_group()


def cpu_context(rank: int = 0, world_size: int = 1) -> Any:
    """The ``WorkerContext`` of a rank of a one-node gloo world on the CPU (no process group is made)."""
    import torch

    from trainop_trainer import distributed

    return distributed.WorkerContext(
        rank=rank,
        world_size=world_size,
        local_rank=rank,
        local_world_size=world_size,
        node_rank=0,
        device=torch.device("cpu"),
        backend="gloo",
    )
