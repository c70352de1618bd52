"""Logging of the trainer's processes: INFO lines of this package on stderr, prefixed with who wrote them.

Every line reads ``<time> rank<N> <logger> <LEVEL>: <message>`` (``driver`` instead of ``rank<N>`` in the
driver). bench/gpu/suite.py parses these lines; keep the shape.
"""

from __future__ import annotations

import logging


def configure_logging(*, rank: int | None) -> None:
    """INFO logs of this package to stderr, prefixed with the rank (idempotent)."""
    logger = logging.getLogger("trainop_trainer")
    if any(getattr(h, "_trainop", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler()
    where = "driver" if rank is None else f"rank{rank}"
    handler.setFormatter(logging.Formatter(f"%(asctime)s {where} %(name)s %(levelname)s: %(message)s"))
    handler._trainop = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
