"""bench/operator_scale/run.py with our CRDs read from another directory (``CRD_DIR``), everything else as is.

    git show ed5e470:crds/trainop.dev_trainingjobs.yaml > /tmp/oldcrds/trainop.dev_trainingjobs.yaml  # etc.
    CRD_DIR=/tmp/oldcrds .venv/bin/python bench/operator_scale/results/2026-11-28-crd-ab/oldcrd_floor.py \\
        --jobs 100 --variant floor --json out.json
"""

import os
import runpy
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO_ROOT))

from tests.controlplane import crds  # noqa: E402

DIRECTORY = Path(os.environ["CRD_DIR"])
crds.default_crd_paths = lambda directory=None: tuple(sorted(DIRECTORY.glob("*.yaml")))
sys.argv = [str(REPO_ROOT / "bench" / "operator_scale" / "run.py"), *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
