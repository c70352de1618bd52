"""A TuningSweep is reconciled by the same code as a TrainingJob: its own children, RBAC on
tuningsweeps/status only, one RayJob running the sweep driver sized for the concurrent trials, and the
same restart semantics. The driver's status fields (trials, bestTrial) are never touched.
KubeRay's part is played by its stand-in (``kuberay_standin``, the tier's only mock): it writes the RayJob
statuses KubeRay would (Running, Failed, Succeeded) on the sweep's driver RayJobs."""

from __future__ import annotations

import json
from typing import Any

import operator_factories as factories
import pytest
from cluster_api import Api, wait_for

pytestmark = pytest.mark.controlplane


def sweep_status(api: Api, namespace: str) -> dict[str, Any]:
    body = api.get(api.job(namespace, "lr", plural="tuningsweeps"))
    assert body is not None
    return body.get("status") or {}


def wait_phase(api: Api, namespace: str, phase: str) -> dict[str, Any]:
    return wait_for(
        lambda: sweep_status(api, namespace), lambda s: s.get("phase") == phase, what=f"phase {phase}"
    )


def test_a_sweep_gets_its_driver_rayjob_config_and_rbac_and_restarts_like_a_job(
    operator: Any, api: Api, apply: Any, kuberay: Any, namespace: str, control_plane: Any
) -> None:
    apply(factories.manifest("lr", namespace, kind="TuningSweep", spec={"maxConcurrentTrials": 3}))
    ray_job = wait_for(
        lambda: api.get(api.ray_jobs(namespace, "lr-s1")), lambda r: r is not None, what="RayJob"
    )
    assert (
        ray_job["spec"]["entrypoint"] == "python -m trainop_trainer.sweep --config /etc/trainop/trainer.json"
    )
    assert ray_job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 6  # 3 trials x 2 workers
    role = api.get(api.rbac(namespace, "roles", "lr-sweep"))
    assert role is not None and role["rules"][0]["resources"] == ["tuningsweeps/status"]
    config = api.get(api.core(namespace, "configmaps", "lr-sweep"))
    assert config is not None
    driver = json.loads(config["data"]["trainer.json"])
    assert (driver["sweepName"], driver["experimentName"], driver["statusTarget"]["plural"]) == (
        "lr",
        "lr",
        "tuningsweeps",
    )

    kuberay.run(namespace, "lr-s1")
    wait_phase(api, namespace, "Running")
    token = control_plane.service_account_token(namespace, "lr-sweep", create=False)
    driver_patch = {
        "status": {
            "trials": {"total": 4, "running": 2, "succeeded": 2},
            "bestTrial": {"id": "t1", "metric": "loss", "value": 0.12},
        }
    }
    control_plane.kubectl(
        "patch",
        "tuningsweep",
        "lr",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(driver_patch),
        kubeconfig_path=control_plane.kubeconfig_for_token(token, namespace=namespace),
    )

    kuberay.fail(namespace, "lr-s1")
    wait_for(lambda: api.get(api.ray_jobs(namespace, "lr-s2")), lambda r: r is not None, what="attempt 2")
    kuberay.run(namespace, "lr-s2")
    kuberay.succeed(namespace, "lr-s2")
    status = wait_phase(api, namespace, "Succeeded")
    assert (status["attempt"], status["restarts"]) == (2, 1)
    assert status["trials"]["succeeded"] == 2 and status["bestTrial"]["value"] == 0.12
    assert "workers" not in status
    rows = control_plane.kubectl("get", "tuningsweeps", "-n", namespace, "--no-headers").stdout.split()
    assert rows[:5] == ["lr", "Succeeded", "4", "2", "0.12"]


def test_a_sweep_and_a_job_of_the_same_name_do_not_share_children(
    operator: Any, api: Api, apply: Any, namespace: str
) -> None:
    apply(factories.manifest("lr", namespace))
    apply(factories.manifest("lr", namespace, kind="TuningSweep"))
    wait_for(
        lambda: (api.get(api.ray_jobs(namespace, "lr-a1")), api.get(api.ray_jobs(namespace, "lr-s1"))),
        lambda pair: all(pair),
        what="both RayJobs",
    )
    claims = sorted(c["metadata"]["name"] for c in api.list(api.core(namespace, "persistentvolumeclaims")))
    assert claims == ["lr-ckpt", "lr-sweep-ckpt"]
