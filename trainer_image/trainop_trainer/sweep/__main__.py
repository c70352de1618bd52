"""``python -m trainop_trainer.sweep``: read the SweepConfig, join (or start) Ray, run the sweep, exit.

A TuningSweep's RayJob entrypoint. On a cluster the operator mounts the config at
/etc/trainop/trainer.json and KubeRay sets RAY_ADDRESS; by hand, ``--config`` names any SweepConfig JSON and
a local Ray runtime is started. A new attempt (same experiment name and storage path) resumes the earlier
experiment. Exit codes: 0 the sweep succeeded; 1 it failed (more than maxFailedTrials failed trials, or no
trial reported the objective's metric; one line on stderr says which); 2 the config is invalid (one line
on stderr naming the field); 130 a SIGINT (Ctrl+C) ended the Tune run with started trials unfinished (the
next run of the same experiment resumes them).
"""

from __future__ import annotations

import argparse
import logging
import sys

import pydantic

from trainop.api import trainer_config

log = logging.getLogger("trainop_trainer.sweep.main")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainop_trainer.sweep",
        description="Run a trainop TuningSweep: Ray Tune over TorchTrainer runs of the packaged trainer.",
        epilog=(
            "Environment: TRAINOP_CONFIG (config path), TRAINOP_STORAGE_PATH (overrides storagePath), "
            "RAY_ADDRESS (join that cluster), TRAINOP_INJECT_FAILURE_AT_STEP (every trial kills one of "
            "its workers once, after a checkpoint), the Kubernetes credentials of docs/trainer.md."
        ),
    )
    parser.add_argument(
        "--config",
        help=f"SweepConfig JSON (default: $TRAINOP_CONFIG, else {trainer_config.DEFAULT_CONFIG_PATH})",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from trainop_trainer import config as config_module
    from trainop_trainer import ray_train
    from trainop_trainer.logs import configure_logging
    from trainop_trainer.sweep import driver, space

    configure_logging(rank=None)
    try:
        config = trainer_config.load_sweep(args.config)
        inject = config_module.inject_failure_from_env()
        config_module.ray_report_min_interval_from_env()  # every trial's workers read it: checked here
        space.validate(config.spec)
    except FileNotFoundError as exc:
        print(
            f"trainop: error: config file {exc.filename} not found: pass --config or set TRAINOP_CONFIG",
            file=sys.stderr,
        )
        return 2
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        print(f"trainop: error: invalid sweep config at {where}: {first['msg']}", file=sys.stderr)
        return 2
    except ValueError as exc:  # space.SearchSpaceError and a bad TRAINOP_* number (config.number_from_env)
        print(f"trainop: error: {exc}", file=sys.stderr)
        return 2

    ray_train.ensure_ray()
    result = driver.run(config, inject_failure_at_step=inject)
    if result.reason:
        print(f"trainop: sweep {config.sweep_name} failed: {result.reason}", file=sys.stderr)
    else:
        best = result.status.get("bestTrial") or {}
        log.info(
            "sweep %s succeeded: best trial %s %s=%s",
            config.sweep_name,
            best.get("id"),
            best.get("metric"),
            best.get("value"),
        )
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
