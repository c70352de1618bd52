"""A script of bench/gpu loaded as a module, so that unit tests can call its pure functions."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

GPU_BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "gpu"


def load(filename: str, module_name: str) -> ModuleType:
    """``bench/gpu/<filename>`` as ``module_name``: its sibling scripts importable while it loads (suite.py
    imports diagnosis.py), and registered in ``sys.modules`` (its dataclasses look their module up)."""
    sys.path.insert(0, str(GPU_BENCH))
    try:
        spec = importlib.util.spec_from_file_location(module_name, GPU_BENCH / filename)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(GPU_BENCH))
