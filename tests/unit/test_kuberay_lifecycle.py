"""The operator tier's KubeRay stand-in writes what the real KubeRay wrote on the cluster bed.

tests/data/kuberay-v1.5.0-rayjob-lifecycle.json is a recording of KubeRay v1.5.0's real controller (the
e2e tier checks the real controller against it at every run, tests/kuberay_lifecycle.py). Here the
stand-in's statuses, patch after patch, must look the same to the operator: the same states in the same
order, the same keys set, the same reason and start of the message.
"""

from __future__ import annotations

import pytest

from tests import kuberay_lifecycle

# Ray's message for a killed entrypoint, as the real controller copied it (the rest is Ray's log tail).
KILLED = "Job entrypoint command failed with exit code 137, last available logs (truncated to 20,000 chars):"


@pytest.mark.parametrize(("outcome", "message"), [("succeeded", ""), ("failed", KILLED)])
def test_the_stand_in_writes_what_the_real_kuberay_wrote(outcome: str, message: str) -> None:
    patches = kuberay_lifecycle.lifecycle("job-a1", "ns", outcome=outcome, message=message)
    observed = kuberay_lifecycle.observe(kuberay_lifecycle.merged(patches))
    recorded = kuberay_lifecycle.golden()[outcome]
    assert kuberay_lifecycle.differences(observed, recorded) == []


def test_a_stand_in_that_skips_a_state_or_a_key_is_caught() -> None:
    """The comparison could pass by not looking: a state left out, or a key the operator reads missing,
    must be reported."""
    patches = kuberay_lifecycle.lifecycle("job-a1", "ns", outcome="succeeded")
    recorded = kuberay_lifecycle.golden()["succeeded"]
    skipped = kuberay_lifecycle.observe(
        kuberay_lifecycle.merged([p for p in patches if p.get("jobStatus") != "PENDING"])
    )
    assert kuberay_lifecycle.differences(skipped, recorded)
    whole = kuberay_lifecycle.merged(patches)
    without_cluster = [{k: v for k, v in status.items() if k != "rayClusterName"} for status in whole]
    assert kuberay_lifecycle.differences(kuberay_lifecycle.observe(without_cluster), recorded)


def test_a_watch_that_started_late_is_compared_from_the_first_state_it_saw() -> None:
    patches = kuberay_lifecycle.lifecycle("job-a1", "ns", outcome="succeeded")
    late = kuberay_lifecycle.observe(kuberay_lifecycle.merged(patches))[2:]
    assert kuberay_lifecycle.differences(late, kuberay_lifecycle.golden()["succeeded"]) == []
