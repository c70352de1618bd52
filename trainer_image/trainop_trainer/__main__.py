"""``python -m trainop_trainer``: read the config, start (or join) Ray, train, exit.

The container entry point of the trainer image. On a cluster the operator mounts the config at
/etc/trainop/trainer.json and KubeRay sets RAY_ADDRESS; by hand, ``--config`` names any TrainerConfig JSON
and a local Ray runtime is started. Exit codes: 0 completed or stopped by SIGTERM (after a checkpoint),
1 training failed, 2 the config or the entrypoint is invalid, or the checkpoint storage cannot be written
(one line on stderr says which field and why), or a TRAINOP_* variable's value is invalid (one line names
it). SIGTERM waits ``$TRAINOP_STOP_GRACE_S`` (default 25) for the workers' checkpoint, then exits 0 anyway.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

import pydantic

from trainop.api import trainer_config

log = logging.getLogger("trainop_trainer.main")

DEFAULT_STOP_GRACE_S = 25.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainop_trainer",
        description="Run a trainop TrainingJob's training on Ray Train (DDP over NCCL or gloo).",
        epilog=(
            "Environment: TRAINOP_CONFIG (config path), TRAINOP_STORAGE_PATH (overrides storagePath), "
            "RAY_ADDRESS (join that cluster), TRAINOP_INJECT_FAILURE_AT_STEP (kill one worker once, after a "
            "checkpoint), TRAINOP_STOP_GRACE_S (seconds to wait for workers after SIGTERM), "
            "TRAINOP_RAY_REPORT_MIN_INTERVAL_S (the least time between two reports to Ray Train)."
        ),
    )
    parser.add_argument(
        "--config",
        help=f"TrainerConfig JSON (default: $TRAINOP_CONFIG, else {trainer_config.DEFAULT_CONFIG_PATH})",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print the worker layout and network plan, then exit without training",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from trainop_trainer import config as config_module
    from trainop_trainer import nccl, preempt, ray_train, user
    from trainop_trainer.logs import configure_logging

    configure_logging(rank=None)
    try:
        config = trainer_config.load(args.config)
        inject = config_module.inject_failure_from_env()
        grace = config_module.stop_grace_from_env(DEFAULT_STOP_GRACE_S)
        config_module.ray_report_min_interval_from_env()  # every worker reads it: a bad value stops here
        if config.spec.workload.entrypoint is not None:
            user.resolve(config.spec.workload.entrypoint)
        if config.spec.workload.ray_train is not None:
            user.resolve(config.spec.workload.ray_train, field_name="spec.workload.rayTrain")
    except FileNotFoundError as exc:
        print(
            f"trainop: error: config file {exc.filename} not found: pass --config or set TRAINOP_CONFIG",
            file=sys.stderr,
        )
        return 2
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        print(f"trainop: error: invalid trainer config at {where}: {first['msg']}", file=sys.stderr)
        return 2
    except (user.EntrypointError, ValueError) as exc:
        print(f"trainop: error: {exc}", file=sys.stderr)
        return 2

    if args.plan:
        scaling = config_module.scaling_for(config.spec)
        network = config.spec.network
        plan = nccl.plan(network.profile.value, network.nccl_env, None)
        print(config_module.describe(config))
        print(f"scaling: {scaling}")
        print(f"network: {plan.resolved} ({plan.reason}) env={plan.env}")
        return 0

    # Before Ray: a wrong Secret or a missing bucket is one sentence on the status, not a failed checkpoint.
    problem = ray_train.check_storage(config)
    if problem is not None:
        print(f"trainop: error: {problem.message}", file=sys.stderr)
        return 2
    ray_train.ensure_ray()
    preempt.install_driver_handler(config_module.paths_for(config).stop_file, grace_s=grace)
    try:
        result = ray_train.run(config, inject_failure_at_step=inject)
        preempt.run_ended()
    except KeyboardInterrupt:  # a second SIGINT (preempt.install_driver_handler): no final checkpoint
        print("trainop: stopped by a second SIGINT, without a final checkpoint", file=sys.stderr)
        return 128 + signal.SIGINT
    if result.error:
        print(f"trainop: training failed: {result.error}", file=sys.stderr)
    else:
        log.info("training %s at step %s", result.outcome, result.step)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
