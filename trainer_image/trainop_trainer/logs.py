"""Logging of the trainer's processes: INFO lines of this package on stderr, prefixed with who wrote them.

Every line reads ``<time> rank<N> <logger> <LEVEL>: <message>`` (``driver`` instead of ``rank<N>`` in the
driver). bench/gpu/suite.py parses these lines; keep the shape.

``ray_worker_setup`` runs in every Ray worker process of a trainop driver: it turns a notice Ray Train
repeats every second on clusters without the Ray dashboard into one explaining INFO line.
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


# Ray Train's placement-group cleaner (a detached actor next to every run) asks the Ray State API once a
# second whether the Train controller still lives. A Ray cluster without its dashboard (a local Ray, or
# `ray start --include-dashboard=false`) has no State API, and the cleaner warns every second for the whole
# run: a user reads that as a failure. KubeRay's head runs the dashboard, so it does not happen there.
_CLEANER_LOGGER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"
_CLEANER_NOTICE = "Failed to query Ray Train Controller actor state"
CLEANER_EXPLANATION = (
    "trainop: Ray Train's placement-group cleaner cannot reach the Ray State API (this Ray cluster runs "
    "without its dashboard); it only acts if the Train controller crashes, and Ray releases the group when "
    "the job ends anyway, so its repeated notices are not shown"
)


class _CleanerNoticeOnce(logging.Filter):
    """The cleaner's first notice becomes one INFO line that explains it; the repetitions are dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(_CLEANER_NOTICE):
            return True
        if self.seen:
            return False
        self.seen = True
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.msg, record.args = CLEANER_EXPLANATION, ()
        return True


def ray_worker_setup() -> None:
    """Ray's ``worker_process_setup_hook`` for every Ray worker process a trainop driver starts
    (``ray_train.ensure_ray``): the cleaner's notice once, explained."""
    logger = logging.getLogger(_CLEANER_LOGGER)
    if not any(isinstance(f, _CleanerNoticeOnce) for f in logger.filters):
        logger.addFilter(_CleanerNoticeOnce())
