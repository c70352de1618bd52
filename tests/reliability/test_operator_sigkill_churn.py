"""The operator SIGKILLed at random moments while many jobs churn through their lives, restarted each
time: nothing lost (every job ends exactly as its plan says: phase, attempt, restarts, failure history),
nothing duplicated (every attempt's RayJob created once, one of each other child, one Event per restart),
nothing orphaned (no child outlives its owner, bar the checkpoint claim, kept by design). KubeRay's part
is played by the churn's watch-driven stand-in (``kuberay_async.KubeRayStandIn``, the only mock): it writes
the RayJob statuses KubeRay would (Initializing, Running, then each attempt's planned outcome).

The plans and the kill intervals come from a seeded RNG (``TRAINOP_CHURN_SEED``); the scheduling of the
processes does not, so two runs of one seed kill at different points of the same scenario -- which is the
point, and a failure report names the seed and the jobs whose invariants broke. Besides the random kills,
the operator is killed each time another sixth of the jobs has been created (``MILESTONE_KILLS``), while
the rest are still to come: so the test's "at least 5 kills" holds on any machine, however fast it runs
the churn. The test tier runs ``TRAINOP_CHURN_JOBS`` (default 30; 60 until 2026-11-29, 350 CPU-seconds,
issue #14) jobs; the nightly variant runs 200 (``bench/operator_scale/churn.py``, numbers in
docs/reliability.md).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable

import pytest

from tests.controlplane import cluster
from tests.reliability import churn, kube_async, operator_runner

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]

CHURN_JOBS = int(os.environ.get("TRAINOP_CHURN_JOBS", "30"))
CHURN_SEED = int(os.environ.get("TRAINOP_CHURN_SEED", "20261126"))
MILESTONE_KILLS = 5


async def run_churn_with_kills(
    plane: cluster.ControlPlane,
    namespace: str,
    operator: operator_runner.Operator,
    *,
    num_jobs: int,
    seed: int,
) -> tuple[list[str], float]:
    """The churn (plans from ``seed``) with the operator SIGKILLed every 1-4 s and at each sixth of the
    jobs created, and restarted at once."""
    plans = churn.plan_jobs(random.Random(seed), num_jobs, spread_s=num_jobs / 4)
    async with kube_async.AsyncApi.for_plane(plane) as api:
        scenario = churn.Churn(api, namespace, plans)
        milestones = [num_jobs * i // (MILESTONE_KILLS + 1) for i in range(1, MILESTONE_KILLS + 1)]
        disrupt = churn.kill_and_restart(
            operator, random.Random(seed + 1), progress=lambda: scenario.num_created, milestones=milestones
        )
        elapsed = await scenario.run(timeout_s=120 + 3 * num_jobs, disrupt=disrupt)
        return await churn.verify(scenario), elapsed


async def test_operator_sigkilled_at_random_moments_during_a_churn_loses_and_duplicates_nothing(
    isolated_plane: cluster.ControlPlane,
    isolated_namespace: str,
    make_operator: Callable[..., operator_runner.Operator],
) -> None:
    operator = make_operator(isolated_namespace)
    operator.start()
    problems, elapsed = await run_churn_with_kills(
        isolated_plane, isolated_namespace, operator, num_jobs=CHURN_JOBS, seed=CHURN_SEED
    )
    assert operator.kills >= MILESTONE_KILLS, (
        f"only {operator.kills} kills in {elapsed:.0f}s: the churn did not test crashes"
    )
    assert not problems, f"seed {CHURN_SEED}, {operator.kills} kills: " + "\n".join(problems[:40])
