"""A job deleted and created again under its name, against the real apiserver: the new job takes nothing
from the old one. A reconcile decided from the deleted job's body has its writes to the owner (the
applied-spec annotation, the status) refused by the apiserver, because they carry the deleted one's uid;
and what the operator remembered writing for the deleted job's children (``own_writes``) does not stop it
writing the new job's.

The operator's ``reconcile.Reconciler`` runs in the test process (the shared operator process is stopped:
two reconcilers of one job would race) on the operator's own client, with an empty cache (no watches: the
reconciler reads its owner fresh either way). The deletion "while the reconcile is in flight" is made
right after the reconcile's GET of its owner returned, by the test, through the apiserver.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import operator_factories as factories
import pytest
from cluster_api import Api, wait_for

from tests.controlplane import cluster
from trainop.controller import acceptance, cache, kinds, kube, reconcile

pytestmark = pytest.mark.controlplane


class DeletedWhileReconciling(kube.Kube):
    """The operator's client; once ``namesake`` is set, right after its next GET of the job returned, the
    user deletes the job and creates ``namesake`` under its name (as the admin)."""

    admin: Api
    namesake: dict[str, Any] | None = None
    namesake_uid = ""

    async def get(self, resource: kube.Resource, namespace: str, name: str) -> dict[str, Any] | None:
        found = await super().get(resource, namespace, name)
        if self.namesake is not None and resource.plural == "trainingjobs":
            self.admin.delete(self.admin.job(namespace, name))
            self.namesake_uid = self.admin.create(self.admin.job(namespace), self.namesake)["metadata"]["uid"]
            self.namesake = None
        return found


@pytest.fixture
async def client(control_plane: cluster.ControlPlane, api: Api) -> AsyncIterator[DeletedWhileReconciling]:
    """The operator's client as the operator connects it (with the control plane's admin kubeconfig)."""
    connected = await DeletedWhileReconciling.connect(str(control_plane.kubeconfig_path))
    assert isinstance(connected, DeletedWhileReconciling)
    connected.admin = api
    yield connected
    await connected.close()


def reconciler(client: kube.Kube) -> reconcile.Reconciler:
    return reconcile.Reconciler(client, cache.Cache({index_id: {} for index_id in cache.INDEX_IDS}))


@pytest.mark.parametrize("accepted_before", [False, True], ids=["annotation-and-status", "status-only"])
async def test_a_reconcile_decided_from_a_deleted_job_leaves_its_namesake_untouched(
    dedicated_operator: Any,
    api: Api,
    client: DeletedWhileReconciling,
    namespace: str,
    accepted_before: bool,
) -> None:
    old = api.create(api.job(namespace), factories.manifest("mlp", namespace))
    if accepted_before:  # its accepted spec is recorded already: the reconcile writes only its status
        accepted = acceptance.serialise(kinds.parse(old).spec.to_wire())
        api.patch(
            api.job(namespace, "mlp"),
            {"metadata": {"annotations": {kinds.ANNOTATION_APPLIED_SPEC: accepted}}},
        )
    client.namesake = factories.manifest("mlp", namespace)
    key = reconcile.OwnerKey("TrainingJob", namespace, "mlp")
    operator = reconciler(client)

    result = await operator.reconcile(key)

    namesake = api.get(api.job(namespace, "mlp"))
    assert (
        namesake is not None and namesake["metadata"]["uid"] == client.namesake_uid != old["metadata"]["uid"]
    )
    assert "status" not in namesake
    assert kinds.ANNOTATION_APPLIED_SPEC not in (namesake["metadata"].get("annotations") or {})
    assert api.get(api.ray_jobs(namespace, "mlp-a1")) is None
    assert result.requeue_after == 0.0  # not a failure: the namesake is reconciled at once, from scratch

    await operator.reconcile(key)  # the namesake's own first reconcile
    recorded = api.get(api.job(namespace, "mlp"))
    assert recorded is not None and recorded["metadata"]["uid"] == client.namesake_uid
    assert (recorded["status"]["phase"], recorded["status"]["attempt"]) == ("Pending", 1)
    assert recorded["metadata"]["annotations"][kinds.ANNOTATION_APPLIED_SPEC]
    ray_job = api.get(api.ray_jobs(namespace, "mlp-a1"))
    assert ray_job is not None
    assert [r["uid"] for r in ray_job["metadata"]["ownerReferences"]] == [client.namesake_uid]


async def test_a_namesake_gets_its_config_although_the_deleted_job_had_it_written_for_the_same_attempt(
    dedicated_operator: Any, api: Api, client: kube.Kube, namespace: str
) -> None:
    """The deletion unseen by the reconciler (no DELETED event made it forget the old job: a watch that
    was away, whose re-listing shows the namesake as itself)."""
    key = reconcile.OwnerKey("TrainingJob", namespace, "mlp")
    operator = reconciler(client)
    api.create(api.job(namespace), factories.manifest("mlp", namespace))
    await operator.reconcile(key)
    config_map = api.core(namespace, "configmaps", "mlp-trainer")
    assert api.get(config_map) is not None

    api.delete(api.job(namespace, "mlp"))
    wait_for(
        lambda: api.get(config_map), lambda c: c is None, what="the garbage collector deleting the ConfigMap"
    )
    namesake = api.create(api.job(namespace), factories.manifest("mlp", namespace))
    await operator.reconcile(key)

    config = api.get(config_map)
    assert config is not None, "the namesake's RayJob would mount a ConfigMap that does not exist"
    assert [r["uid"] for r in config["metadata"]["ownerReferences"]] == [namesake["metadata"]["uid"]]
    assert config["metadata"]["annotations"][kinds.ANNOTATION_ATTEMPT] == "1"
