"""Run bench/operator_scale/run.py with the CRDs of another directory (CRD_DIR), everything else as is."""
import os, runpy, sys
from pathlib import Path
sys.path.insert(0, "/work/main")
from tests.controlplane import crds
directory = Path(os.environ["CRD_DIR"])
crds.default_crd_paths = lambda d=None: tuple(sorted(directory.glob("*.yaml")))
sys.argv = ["bench/operator_scale/run.py", *sys.argv[1:]]
runpy.run_path("/work/main/bench/operator_scale/run.py", run_name="__main__")
