"""Goodput: the share of a job's wall time that produced training it kept.

::

    stepSeconds       = globalBatch / progress.samplesPerSecond
                        (globalBatch = progress.batchSizePerWorker x workers.replicas
                                       x hyperparameters.gradientAccumulationSteps)
    productiveSeconds = progress.step x stepSeconds
    wallSeconds       = (completionTime, or now) - startTime
    ratio             = productiveSeconds / wallSeconds   (at most 1)

``progress.step`` is the step training has reached, so steps computed after the newest checkpoint and
lost in a failure are recomputed in a later attempt without being counted twice; start-up (pods, image
pulls, Ray), backoffs, stalls and that recomputation are all in the wall time and not in the productive
time. It needs only what the operator sees (the status), no per-step record.

Limits: the step time is the last report window's pace, applied to every step (a job that sped up or
slowed down is estimated at its current pace); evaluations and checkpoint writes inside the training loop
count as productive when the trainer's throughput includes them; ``startTime`` restarts when a suspended
job resumes, so steps from before the suspension make the ratio optimistic (it is capped at 1).

This module must not talk to the API.
"""

from __future__ import annotations

import datetime

from trainop.api import trainingjob
from trainop.controller import observe


def compute(
    spec: trainingjob.TrainingJobSpec,
    progress: trainingjob.Progress | None,
    *,
    start_time: str | None,
    until: datetime.datetime,
) -> trainingjob.Goodput | None:
    """The job's goodput until ``until``; None until the trainer has reported a throughput."""
    started = observe.parse_time(start_time)
    if progress is None or started is None or not progress.samples_per_second:
        return None
    per_worker = progress.batch_size_per_worker
    if per_worker is None:
        configured = spec.hyperparameters.batch_size_per_worker
        if not isinstance(configured, int):
            return None
        per_worker = configured
    global_batch = per_worker * spec.workers.replicas * spec.hyperparameters.gradient_accumulation_steps
    step_seconds = global_batch / progress.samples_per_second
    wall = max((until - started).total_seconds(), 0.0)
    if wall <= 0.0:
        return None
    productive = min(progress.step * step_seconds, wall)
    return trainingjob.Goodput(
        ratio=round(productive / wall, 3), productive_seconds=round(productive), wall_seconds=round(wall)
    )
