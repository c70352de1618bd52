"""pytest plugin: one hypothesis seed per run for the property tests, printed and reproducible.

The property tests (``@hypothesis.seed(property_seed.SEED)``, ``derandomize=False``) draw new examples on
every run, CI included, so that each run explores inputs no earlier run tried. The seed is
``$TRAINOP_PROPERTY_SEED`` when set, else a fresh random one; the pytest header shows it, and every failed
test's report repeats it with the command that replays the same examples:

    TRAINOP_PROPERTY_SEED=<seed> make test PYTEST_ARGS="-k <test>"

hypothesis also keeps failing examples in ``.hypothesis/`` and replays them first on the same machine.
This module must not import hypothesis strategies or tests: it only owns the seed.
"""

from __future__ import annotations

import os
import random
from collections.abc import Generator

import pytest

SEED_ENV = "TRAINOP_PROPERTY_SEED"
SEED = int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(2**32))


def pytest_report_header(config: pytest.Config) -> str:
    return f"property tests: hypothesis seed {SEED} (replay with {SEED_ENV}={SEED})"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        report.sections.append(
            (
                "property seed",
                f"hypothesis seed {SEED}: rerun with {SEED_ENV}={SEED} to draw the same examples",
            )
        )
    return report
