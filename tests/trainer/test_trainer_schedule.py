"""Learning-rate schedules: warmup, then cosine / linear / constant, as a pure function of the step."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from trainop_trainer.schedule import LearningRateSchedule


@pytest.mark.parametrize("kind", ["cosine", "linear", "constant"])
def test_warmup_ramps_linearly_to_the_base_rate_in_every_schedule(kind: str) -> None:
    schedule = LearningRateSchedule(kind=kind, total_steps=100, warmup_steps=4)
    assert [schedule.factor(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert schedule.factor(4) == 1.0


def test_cosine_decays_from_one_through_the_midpoint_to_the_minimum_ratio() -> None:
    schedule = LearningRateSchedule(kind="cosine", total_steps=110, warmup_steps=10, min_lr_ratio=0.1)
    assert schedule.factor(10) == pytest.approx(1.0)
    assert schedule.factor(60) == pytest.approx(0.1 + 0.9 * 0.5)
    assert schedule.factor(110) == pytest.approx(0.1)
    assert schedule.factor(500) == pytest.approx(0.1)  # past the end: stays at the floor


def test_linear_decays_in_equal_steps_to_the_minimum_ratio() -> None:
    schedule = LearningRateSchedule(kind="linear", total_steps=10, min_lr_ratio=0.0)
    assert [round(schedule.factor(s), 6) for s in range(0, 11, 5)] == [1.0, 0.5, 0.0]


def test_constant_stays_at_the_base_rate_after_warmup() -> None:
    schedule = LearningRateSchedule(kind="constant", total_steps=10, warmup_steps=2)
    assert {schedule.factor(s) for s in range(2, 50)} == {1.0}


@pytest.mark.parametrize("kind", ["cosine", "linear"])
def test_decaying_schedules_never_increase_after_warmup(kind: str) -> None:
    schedule = LearningRateSchedule(kind=kind, total_steps=300, warmup_steps=30, min_lr_ratio=0.05)
    factors = [schedule.factor(s) for s in range(30, 320)]
    assert all(a >= b for a, b in itertools.pairwise(factors))


def test_lambda_lr_applies_factor_of_step_s_to_the_optimizer_step_s() -> None:
    schedule = LearningRateSchedule(kind="cosine", total_steps=20, warmup_steps=3)
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    seen = []
    for _ in range(20):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([0.4 * schedule.factor(s) for s in range(20)])


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown schedule kind"):
        LearningRateSchedule(kind="exponential", total_steps=10)


def test_cosine_midpoint_value_matches_the_closed_form() -> None:
    schedule = LearningRateSchedule(kind="cosine", total_steps=8)
    assert schedule.factor(2) == pytest.approx(0.5 * (1 + math.cos(math.pi * 2 / 8)))
