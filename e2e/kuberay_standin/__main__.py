"""``python -m e2e.kuberay_standin --kubeconfig FILE --state-dir DIR [--num-cpus N]`` (see the package)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from e2e.kuberay_standin import controller


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.kuberay_standin",
        description="Stand-in for KubeRay's controller: runs RayJobs' entrypoints on a local Ray cluster.",
    )
    parser.add_argument("--kubeconfig", type=Path, required=True, help="KubeRay's identity (admin here)")
    parser.add_argument("--state-dir", type=Path, required=True, help="claims, pod directories, logs")
    parser.add_argument("--num-cpus", type=int, default=16, help="Ray's logical CPUs (default: %(default)s)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args.state_dir.mkdir(parents=True, exist_ok=True)
    standin = controller.StandIn(kubeconfig=args.kubeconfig, state_dir=args.state_dir, num_cpus=args.num_cpus)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: standin.stopping.set())
    standin.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
