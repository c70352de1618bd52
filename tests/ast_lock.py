"""A process-wide lock around ``ast.parse``: CPython 3.11's AST constructor keeps its recursion depth in
per-interpreter state, so two threads parsing at once can raise ``SystemError: AST constructor recursion
depth mismatch`` (python/cpython#106905, fixed in 3.12 only).

The e2e tier runs its scenarios' scripts in threads; a script formatting a traceback (3.11's traceback
module calls ``ast.parse`` for its ``^^^^`` markers) while pytest parses a failed test's source for its
report made pytest stop with INTERNALERROR and lose the rest of the run (CI, 2026-11-26). Both go through
``ast.parse``, so serialising it is enough.
"""

from __future__ import annotations

import ast
import sys
import threading
from typing import Any

_LOCK = threading.RLock()
_ORIGINAL = ast.parse


def _parse(*args: Any, **kwargs: Any) -> Any:
    with _LOCK:
        return _ORIGINAL(*args, **kwargs)


def install() -> None:
    """Wrap ``ast.parse`` (idempotent; a no-op on Python >= 3.12, where the bug is fixed)."""
    if sys.version_info < (3, 12) and ast.parse is _ORIGINAL:
        ast.parse = _parse


install()
