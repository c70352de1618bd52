"""Nightly churn: the SIGKILL churn of the reliability tier at full size (200 jobs), and its numbers.

    .venv/bin/python bench/operator_scale/churn.py [--jobs 200] [--seed 20261126] [--json out.json]

The same scenario, checks and helpers as ``tests/reliability/test_operator_sigkill_churn.py`` (which runs
60 jobs to stay inside the test tier's time): a fresh control plane, the operator as a process, every
job's life from a seeded plan (fail / succeed / suspend+resume / delete), KubeRay's stand-in, the operator
SIGKILLed every 1-4 s and restarted at once. Exits non-zero when an invariant breaks, printing which;
otherwise prints how long the churn took, how many kills it survived and the operator's reconcile counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [
    str(REPO_ROOT),
    str(REPO_ROOT / "tests" / "operator"),
    str(REPO_ROOT / "tests" / "operator" / "integration"),
]

from tests.controlplane import assets, cluster, crds  # noqa: E402
from tests.reliability import operator_runner  # noqa: E402
from tests.reliability.test_operator_sigkill_churn import run_churn_with_kills  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=20261126)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainop-churn-") as tmp:
        plane = cluster.ControlPlane(
            assets=assets.ensure(build=False),
            settings=cluster.ControlPlaneSettings(crd_paths=crds.default_crd_paths(), root_dir=Path(tmp)),
        )
        plane.start()
        try:
            namespace = plane.create_namespace("churn")
            operator = operator_runner.Operator(
                kubeconfig=plane.kubeconfig_path, log_path=Path(tmp) / "operator.log", namespaces=[namespace]
            )
            operator.start()
            load_before = os.getloadavg()
            started = time.monotonic()
            problems, churn_s = asyncio.run(
                run_churn_with_kills(plane, namespace, operator, num_jobs=args.jobs, seed=args.seed)
            )
            result = {
                "jobs": args.jobs,
                "seed": args.seed,
                "churn_s": round(churn_s, 1),
                "total_s_with_checks": round(time.monotonic() - started, 1),
                "operator_kills": operator.kills,
                "operator_starts": operator.starts,
                "reconciles_since_last_start": {r: operator.reconciles(r) for r in ("success", "error")},
                "problems": problems,
                "machine": f"{platform.node()}, {os.cpu_count()} cores",
                "load_average": {"before": load_before, "after": os.getloadavg()},
            }
            operator.stop()
        finally:
            plane.stop()
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
