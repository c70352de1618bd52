"""failures.remember: a full list of pod facts still takes the fact that ends the attempt, and a pod that
waits for nodes is one Unschedulable fact however often the scheduler rewrites its message."""

from __future__ import annotations

import datetime
from typing import Any

from trainop.api.operator_status import FailureReason
from trainop.controller import failures

START = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.UTC)
ENDED = START + datetime.timedelta(hours=2)


def _pending_pod(name: str, message: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                    "lastTransitionTime": "2026-03-01T12:00:00Z",
                }
            ],
        },
    }


def _oom_pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "ray-worker", "resources": {"limits": {"memory": "8Gi"}}}]},
        "status": {
            "containerStatuses": [
                {
                    "name": "ray-worker",
                    "lastState": {
                        "terminated": {
                            "reason": "OOMKilled",
                            "exitCode": 137,
                            "finishedAt": "2026-03-01T13:00:00Z",
                        }
                    },
                }
            ]
        },
    }


def _waited_for_nodes(pods: int, messages: int) -> tuple[failures.PodFact, ...]:
    """What a reconciler remembers of ``pods`` worker pods pending while the scheduler's message changed
    ``messages`` times (one reconcile per change)."""
    kept: tuple[failures.PodFact, ...] = ()
    for n in range(messages):
        seen = [
            fact
            for p in range(pods)
            for fact in failures.pod_facts(
                _pending_pod(
                    f"mlp-a1-worker-{p}", f"0/{10 + n} nodes are available: insufficient nvidia.com/gpu"
                )
            )
        ]
        kept = failures.remember(kept, seen)
    return kept


def test_a_pod_waiting_for_nodes_is_one_fact_its_latest_message() -> None:
    kept = _waited_for_nodes(pods=2, messages=20)
    assert len(kept) == 2
    assert all("0/29 nodes" in f.message for f in kept)
    assert {f.pod for f in kept} == {"mlp-a1-worker-0", "mlp-a1-worker-1"}


def test_an_oom_after_a_long_wait_for_nodes_is_kept_and_classifies_the_failure() -> None:
    kept = _waited_for_nodes(pods=4, messages=40)
    kept = failures.remember(kept, failures.pod_facts(_oom_pod("mlp-a1-worker-3")))
    # 160 scheduler messages left one fact per pod, and the OOM is kept beside them.
    assert [(f.reason, f.pod) for f in kept] == [
        *((FailureReason.INFRA_ERROR, f"mlp-a1-worker-{p}") for p in range(4)),
        (FailureReason.OOM_KILLED, "mlp-a1-worker-3"),
    ]
    found = failures.classify_facts(kept, ended=ENDED)
    assert found is not None and found.reason == FailureReason.OOM_KILLED


def test_a_full_list_evicts_the_oldest_fact_of_the_lowest_precedence() -> None:
    # More pending pods than the list holds: every slot taken by a distinct pod's Unschedulable fact.
    infra = [
        failures.PodFact(FailureReason.INFRA_ERROR, f"pod w{i} cannot be scheduled", f"w{i}", START)
        for i in range(failures.MAX_FACTS)
    ]
    kept = failures.remember((), infra)
    assert len(kept) == failures.MAX_FACTS
    for reason in (FailureReason.PREEMPTED, FailureReason.NODE_LOST, FailureReason.OOM_KILLED):
        fact = failures.PodFact(reason, f"pod w0: {reason.value}", "w0", START)
        kept = failures.remember(kept, [fact])
        assert fact in kept
    assert len(kept) == failures.MAX_FACTS
    assert infra[0] not in kept and infra[1] not in kept and infra[2] not in kept  # the oldest went
    assert infra[3] in kept
    # A fact ranked below every kept one is the one that goes.
    full_of_oom = [
        failures.PodFact(FailureReason.OOM_KILLED, f"pod w{i} OOMKilled", f"w{i}", START)
        for i in range(failures.MAX_FACTS)
    ]
    late = failures.PodFact(FailureReason.INFRA_ERROR, "pod w0 cannot be scheduled", "w0", START)
    assert failures.remember(full_of_oom, [late]) == tuple(full_of_oom)
    # Of equal rank, the new fact stays and the oldest goes.
    newer = failures.PodFact(FailureReason.OOM_KILLED, "pod w99 OOMKilled", "w99", START)
    assert failures.remember(full_of_oom, [newer]) == (*full_of_oom[1:], newer)
