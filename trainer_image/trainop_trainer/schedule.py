"""Learning-rate schedules: linear warmup, then cosine, linear or constant, as a pure function of the step.

``LearningRateSchedule`` is the multiplier handed to ``torch.optim.lr_scheduler.LambdaLR``; being a plain
callable object of the step alone, it has no hidden state, so resuming at step N gives the same learning
rate as training straight through N. The optimizer step with index ``s`` (0-based) uses ``factor(s)``.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class LearningRateSchedule:
    kind: str  # "cosine" | "linear" | "constant" (trainingjob.ScheduleKind values)
    total_steps: int
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("cosine", "linear", "constant"):
            raise ValueError(f"unknown schedule kind {self.kind!r}")
        if self.total_steps < 1:
            raise ValueError("total_steps must be >= 1")

    def factor(self, step: int) -> float:
        """Multiplier of the base learning rate for the optimizer step ``step`` (0-based)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.kind == "constant":
            return 1.0
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, max(0.0, (step - self.warmup_steps) / decay_steps))
        shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if self.kind == "cosine" else 1.0 - progress
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * shape

    def __call__(self, step: int) -> float:
        return self.factor(step)
