"""What a job costs: GPU-hours, an estimated price, and the GPU time spent not training.

Two clocks, kept per launch (one driver process: an attempt) in a ledger on the volume
(``<run>/trainop/cost.json``), so that every attempt adds to the same account:

- **allocated**: from the driver's start (``LaunchSettings.started_at``: the RayJob's entrypoint starts once
  KubeRay has the Ray cluster, workers included) until now; it goes on through worker-group restarts;
- **training**: the sum of the wall time between consecutive optimizer steps of each worker group (a
  step's share of evaluation, reports and checkpoint stalls included), from the first step on.

``idle = allocated - training``: start-up (image already pulled; Ray, the process group, model and data),
worker-group restarts, and everything between attempts that still held the workers. Time before the
driver starts (pods pending, images pulling) and after the last report of a failed attempt is not seen by
the trainer, so the account is a lower bound; the operator's own view of pod lifetimes would close that gap.

``cost_status`` is pure (unit-tested with a known price and run time); ``CostLedger`` is rank 0's
bookkeeping. No torch, no ray: the driver uses it too.
"""

from __future__ import annotations

import json
import logging
import pathlib
import time

from trainop.api import experiment, trainer_config

log = logging.getLogger(__name__)

LEDGER = "cost.json"


def cost_status(
    *,
    gpus: int,
    allocated_seconds: float,
    training_seconds: float,
    pricing: trainer_config.Pricing,
    updated: str,
) -> experiment.CostStatus:
    """``status.cost`` for ``gpus`` GPUs allocated ``allocated_seconds``, ``training_seconds`` of it
    training."""
    allocated = max(0.0, allocated_seconds)
    training = min(max(0.0, training_seconds), allocated)
    idle = allocated - training
    gpu_hours = gpus * allocated / 3600.0
    price = pricing.price_per_gpu_hour
    return experiment.CostStatus(
        gpus=gpus,
        allocated_seconds=round(allocated, 1),
        training_seconds=round(training, 1),
        idle_seconds=round(idle, 1),
        gpu_hours=round(gpu_hours, 6),
        idle_gpu_hours=round(gpus * idle / 3600.0, 6),
        price_per_gpu_hour=price,
        currency=pricing.currency if price is not None else None,
        estimated_cost=None if price is None else round(gpu_hours * price, 4),
        updated=updated,
    )


class CostLedger:
    """Rank 0's account of one run: every launch's allocated and training seconds, on the volume."""

    def __init__(self, *, path: pathlib.Path, launch_id: str, started_at: float) -> None:
        self.path = path
        self.launch_id = launch_id
        self.started_at = started_at
        self._launches: dict[str, dict[str, float]] = {}
        try:
            self._launches = {
                str(k): {kk: float(vv) for kk, vv in v.items()}
                for k, v in json.loads(path.read_text()).get("launches", {}).items()
            }
        except (OSError, ValueError, AttributeError):
            self._launches = {}
        # Training seconds this launch's earlier worker groups accounted (a restart continues the sum).
        self._training_before = self._launches.get(launch_id, {}).get("trainingSeconds", 0.0)
        self.training_seconds = 0.0  # this worker group's

    def totals(self, now: float | None = None) -> tuple[float, float]:
        """(allocated, training) seconds over every launch, this one up to ``now``."""
        now = time.time() if now is None else now
        allocated = sum(
            v.get("allocatedSeconds", 0.0) for k, v in self._launches.items() if k != self.launch_id
        )
        training = sum(
            v.get("trainingSeconds", 0.0) for k, v in self._launches.items() if k != self.launch_id
        )
        return allocated + max(
            0.0, now - self.started_at
        ), training + self._training_before + self.training_seconds

    def save(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        self._launches[self.launch_id] = {
            "allocatedSeconds": max(0.0, now - self.started_at),
            "trainingSeconds": self._training_before + self.training_seconds,
            "startedAt": self.started_at,
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps({"launches": self._launches}, indent=2, sort_keys=True))
            tmp.replace(self.path)
        except OSError as exc:
            log.warning("cost ledger %s not written (%s); status.cost may undercount", self.path, exc)
