"""The operator runs a whole job life (and a sweep's start) with exactly the permissions listed in
``trainop.controller.rbac.OPERATOR_RULES`` -- the list the Helm chart's ClusterRole is written from.
KubeRay's part is played by its stand-in (``kuberay_standin``, the tier's only mock): it writes the RayJob
statuses KubeRay would (Running, Failed, Succeeded) as the admin, not as the operator."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import operator_factories as factories
import pytest
from cluster_api import Api, wait_for
from operator_process import OperatorProcess

from trainop.controller import rbac

pytestmark = pytest.mark.controlplane


@pytest.fixture
def operator_kubeconfig(api: Api, namespace: str, control_plane: Any) -> Iterator[Any]:
    """A kubeconfig for a ServiceAccount bound to a ClusterRole of exactly OPERATOR_RULES."""
    name = f"trainop-operator-{namespace}"[:63]
    api.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        {"metadata": {"name": name}, "rules": rbac.OPERATOR_RULES},
    )
    api.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": "trainop-operator", "namespace": namespace}],
        },
    )
    token = control_plane.service_account_token(namespace, "trainop-operator")
    yield control_plane.kubeconfig_for_token(token, namespace=namespace)
    api.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{name}")
    api.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}")


def test_the_operator_needs_no_more_than_its_listed_rbac_rules(
    dedicated_operator: OperatorProcess,
    operator_kubeconfig: Any,
    api: Api,
    apply: Any,
    kuberay: Any,
    namespace: str,
) -> None:
    dedicated_operator.start(namespaces=[namespace], kubeconfig=operator_kubeconfig)
    try:
        apply(factories.manifest("mlp", namespace, spec={"ttlSecondsAfterFinished": 1}))
        apply(factories.manifest("lr", namespace, kind="TuningSweep"))
        wait_for(
            lambda: api.get(api.ray_jobs(namespace, "lr-s1")), lambda r: r is not None, what="sweep RayJob"
        )
        wait_for(
            lambda: api.get(api.ray_jobs(namespace, "mlp-a1")), lambda r: r is not None, what="RayJob a1"
        )
        kuberay.run(namespace, "mlp-a1")
        wait_for(
            lambda: (api.get(api.job(namespace, "mlp")) or {}).get("status", {}).get("phase"),
            lambda phase: phase == "Running",
            what="Running",
        )
        kuberay.fail(namespace, "mlp-a1")
        wait_for(
            lambda: api.get(api.ray_jobs(namespace, "mlp-a2")), lambda r: r is not None, what="RayJob a2"
        )
        wait_for(lambda: api.get(api.ray_jobs(namespace, "mlp-a1")), lambda r: r is None, what="a1 deleted")
        kuberay.run(namespace, "mlp-a2")
        kuberay.succeed(namespace, "mlp-a2")
        wait_for(
            lambda: api.get(api.job(namespace, "mlp")), lambda j: j is None, what="deleted after its TTL"
        )
        events = {e["reason"] for e in api.list(f"/api/v1/namespaces/{namespace}/events")}
        assert {"Running", "Restarting", "Succeeded"} <= events
        log = dedicated_operator.log_of_this_start()
        # A 403 is logged as "403 Forbidden: ..." (our client) or as kopf's APIForbiddenError; a bare
        # "403" is not searched for: timestamps' milliseconds and uids contain it by chance.
        assert "forbidden" not in log.lower(), log
    finally:
        dedicated_operator.stop()
