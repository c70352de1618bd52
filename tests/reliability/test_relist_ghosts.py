"""Objects deleted while the operator's watches were down: after the re-list, the operator acts as if it
had seen their DELETED events (``trainop.controller.relist``).

The apiserver is stopped (the operator's watches break), objects are deleted from etcd directly (so no
apiserver ever sends a DELETED event for them), and the apiserver is started again: its fresh watch cache
answers the operator's resumed watches ``410 Gone``, and kopf lists every resource again. kopf drops an
index entry only on a DELETED event, so without the sweep after a listing the operator would keep the
deleted objects in its cache for good -- a checkpoint claim it never creates again, a ServiceAccount its
own-writes record says is applied, a deleted job's metrics. Real kube-apiserver and etcd; no KubeRay
(nothing here needs a RayJob to run).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import operator_factories as factories
import pytest
import yaml
from cluster_api import Api, wait_for

from tests.controlplane import cluster
from tests.reliability import operator_runner

pytestmark = pytest.mark.controlplane


def uid(obj: dict[str, Any] | None) -> str | None:
    return None if obj is None else str(obj["metadata"]["uid"])


def phase_series(operator: operator_runner.Operator, namespace: str, name: str) -> list[str]:
    wanted = f'name="{name}",namespace="{namespace}"'
    return [key for key in operator.metrics() if key.startswith("trainop_job_phase{") and wanted in key]


def test_objects_deleted_while_the_watches_were_down_are_recreated_or_forgotten_after_the_relist(
    isolated_plane: cluster.ControlPlane,
    isolated_namespace: str,
    make_operator: Callable[..., operator_runner.Operator],
) -> None:
    namespace = isolated_namespace
    api = Api(isolated_plane)
    operator = make_operator(namespace)
    operator.start()
    for name in ("mlp", "doomed"):
        isolated_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(factories.manifest(name, namespace)))
    claim_path = api.core(namespace, "persistentvolumeclaims", "mlp-ckpt")
    account_path = api.core(namespace, "serviceaccounts", "mlp-trainer")
    before = wait_for(
        lambda: (api.get(claim_path), api.get(account_path), api.get(api.ray_jobs(namespace, "mlp-a1"))),
        lambda found: all(found),
        what="mlp's claim, ServiceAccount and RayJob",
    )
    wait_for(lambda: phase_series(operator, namespace, "doomed"), bool, what="doomed's phase metric")

    def delete_behind_the_apiservers_back() -> None:
        for key in (
            f"/registry/persistentvolumeclaims/{namespace}/mlp-ckpt",
            f"/registry/serviceaccounts/{namespace}/mlp-trainer",
            f"/registry/trainop.dev/trainingjobs/{namespace}/doomed",
        ):
            assert isolated_plane.etcd_delete(key) == 1, f"no {key} in etcd"

    isolated_plane.restart("kube-apiserver", down_s=1.0, while_down=delete_behind_the_apiservers_back)

    # The claim and the ServiceAccount come back, as new objects: the operator knew they were gone.
    claim, account = wait_for(
        lambda: (api.get(claim_path), api.get(account_path)),
        lambda found: all(found) and uid(found[0]) != uid(before[0]) and uid(found[1]) != uid(before[1]),
        timeout_s=90,
        what="mlp's claim and ServiceAccount created again after the re-list",
    )
    assert claim is not None and account is not None
    # The deleted job's metric series go, as its DELETED event would have made them go.
    wait_for(
        lambda: phase_series(operator, namespace, "doomed"),
        lambda series: not series,
        timeout_s=60,
        what="the deleted job's phase metric dropped",
    )
    assert phase_series(operator, namespace, "mlp"), "the live job's metrics went too"
    log = operator.log_path.read_text()
    assert "deleted while no watch was open forgotten" in log, log[-3000:]
    assert operator.running and operator.starts == 1
