"""``python -m trainop_trainer.launch``: the same Trainer and Runtime under torchrun, without Ray.

For baselines and benchmarks (the GPU comparison against hand-written DDP) and for running a config on a
machine without Ray::

    torchrun --standalone --nproc-per-node 8 -m trainop_trainer.launch --config job.json
    python -m trainop_trainer.launch --config job.json          # one process, world size 1

Checkpoints, resume, metrics, status and SIGTERM handling are the ones of the Ray path (torchrun forwards
SIGTERM to every rank; each checkpoints and exits 0); like a Ray driver, rank 0 clears a stop request left
by an earlier run (``<run>/trainop/stop-requested``) before training. GPUs are used when the spec asks for
them and CUDA is available.
"""

from __future__ import annotations

import argparse
import logging
import sys
import uuid

import torch
import torch.distributed as dist

from trainop.api import trainer_config
from trainop_trainer import config as config_module
from trainop_trainer import distributed, ray_train
from trainop_trainer.logs import configure_logging
from trainop_trainer.runtime import Runtime
from trainop_trainer.step_schedule import Outcome

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainop_trainer.launch", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--config", help="TrainerConfig JSON (default: $TRAINOP_CONFIG)")
    parser.add_argument("--launch-id", default=None, help="same id on every rank (default: a fresh one)")
    args = parser.parse_args(argv)

    config = trainer_config.load(args.config)
    try:
        inject = config_module.inject_failure_from_env()
    except ValueError as exc:  # every rank says it and stops, before the process group forms
        print(f"trainop: error: {exc}", file=sys.stderr)
        return 2
    use_gpu = config.spec.workers.gpus_per_worker > 0 and torch.cuda.is_available()
    ctx = distributed.from_torchrun_env(use_gpu=use_gpu)
    configure_logging(rank=ctx.rank)
    if ctx.is_rank0:
        # A stop request belongs to the launch that received it (as ray_train.run clears it): an old one
        # would stop this launch after its first step. Only rank 0 looks for it (step_schedule).
        config_module.paths_for(config).stop_file.unlink(missing_ok=True)
    launch_id = args.launch_id or _shared_launch_id(ctx)
    launch = config_module.LaunchSettings(
        config_json=config_module.dumps(config),
        launch_id=launch_id,
        inject_failure_at_step=inject,
    )
    runtime = Runtime.start(config=config, ctx=ctx, launch=launch, report_fn=None)
    try:
        outcome = ray_train.run_workload(runtime)
    finally:
        runtime.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    log.info("launch finished: %s", outcome.value)
    return 0 if outcome in (Outcome.COMPLETED, Outcome.STOPPED, Outcome.PREEMPTED) else 1


def _shared_launch_id(ctx: distributed.WorkerContext) -> str:
    box = [uuid.uuid4().hex if ctx.is_rank0 else ""]
    if ctx.world_size > 1:
        dist.broadcast_object_list(box, src=0)
    return box[0]


if __name__ == "__main__":
    sys.exit(main())
