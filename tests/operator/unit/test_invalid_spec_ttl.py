"""The state machine: ttlSecondsAfterFinished deletes a job that Failed because its spec never validated,
reading the TTL from the stored spec; an invalid TTL there is no TTL, never a crash."""

from __future__ import annotations

import copy
import datetime
from typing import Any

import operator_factories as factories
import pytest
import state_machine_cases as cases

from trainop.api.trainingjob import Phase
from trainop.controller import acceptance, state_machine

NOW = cases.NOW

# Valid for the CRD's schema, refused by the models: fp16 needs GPUs.
INVALID_JOB: dict[str, Any] = factories.job(spec={"precision": "fp16"})


def _decide(body: dict[str, Any], *, now: datetime.datetime = NOW) -> state_machine.Transition:
    assert acceptance.evaluate(body).resource is None  # never validated, nothing accepted
    return cases.decide(body, now=now)


def _job(ttl: object) -> dict[str, Any]:
    body = copy.deepcopy(INVALID_JOB)
    body["spec"]["ttlSecondsAfterFinished"] = ttl
    return body


def test_a_job_failed_for_an_invalid_spec_is_requeued_for_its_ttl_then_deleted() -> None:
    body = _job(30)
    failed = _decide(body)
    assert failed.status.phase == Phase.FAILED
    assert (failed.delete_owner, failed.requeue_after) == (False, 30.0)
    stored = {**body, "status": failed.status.to_wire()}
    early = _decide(stored, now=NOW + datetime.timedelta(seconds=10))
    assert (early.delete_owner, early.requeue_after, early.events) == (False, 20.0, ())
    due = _decide(stored, now=NOW + datetime.timedelta(seconds=30))
    assert (due.delete_owner, due.requeue_after) == (True, None)
    assert due.status.phase == Phase.FAILED


def test_a_zero_ttl_deletes_it_on_the_reconcile_that_fails_it() -> None:
    failed = _decide(_job(0))
    assert failed.status.phase == Phase.FAILED
    assert failed.delete_owner is True
    assert [e.reason for e in failed.events] == ["Failed", "InvalidSpec"]


@pytest.mark.parametrize("ttl", [None, -5, "30", 30.5, True, 2**31, {"seconds": 30}])
def test_an_unusable_ttl_in_the_stored_spec_is_no_ttl(ttl: object) -> None:
    body = _job(ttl)
    failed = _decide(body)
    assert failed.status.phase == Phase.FAILED
    later = _decide({**body, "status": failed.status.to_wire()}, now=NOW + datetime.timedelta(days=400))
    assert (later.delete_owner, later.requeue_after) == (False, None)
