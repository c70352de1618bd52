"""The Ray pods of the RayJobs the operator creates pass Pod Security ``restricted``: each pod template of
a stored RayJob, made into a Pod, is accepted by a server-side dry run in a namespace that enforces it
(and the same pod without its hardening is refused, so the check can fail)."""

from __future__ import annotations

import copy
from typing import Any

import operator_factories as factories
import pytest
from cluster_api import Api, ApiError, wait_for

pytestmark = pytest.mark.controlplane


def enforce_restricted(api: Api, namespace: str) -> None:
    labels = {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }
    api.patch(f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": labels}})


def dry_run_pod(api: Api, namespace: str, name: str, template: dict[str, Any]) -> Any:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **template["metadata"]},
        "spec": template["spec"],
    }
    return api.request("POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", pod)


def stored_templates(api: Api, namespace: str, ray_job: str) -> dict[str, dict[str, Any]]:
    stored = wait_for(
        lambda: api.get(api.ray_jobs(namespace, ray_job)), lambda r: r is not None, what=ray_job
    )
    cluster = stored["spec"]["rayClusterSpec"]
    return {
        "head": cluster["headGroupSpec"]["template"],
        "worker": cluster["workerGroupSpecs"][0]["template"],
    }


GPU = {
    "precision": "bf16",
    "workers": {
        "gpusPerWorker": 8,
        "nodeSelector": {"gpu": "h100"},
        "tolerations": [{"operator": "Exists"}],
        "priorityClassName": None,
    },
}


@pytest.mark.parametrize(
    ("kind", "spec", "ray_job"),
    [("TrainingJob", {}, "mlp-a1"), ("TrainingJob", GPU, "mlp-a1"), ("TuningSweep", {}, "mlp-s1")],
    ids=["cpu-job", "gpu-job", "sweep"],
)
def test_every_ray_pod_template_of_a_created_rayjob_passes_pod_security_restricted(
    operator: Any, api: Api, apply: Any, namespace: str, kind: str, spec: dict[str, Any], ray_job: str
) -> None:
    enforce_restricted(api, namespace)
    apply(factories.manifest("mlp", namespace, kind=kind, spec=spec))
    for group, template in stored_templates(api, namespace, ray_job).items():
        accepted = dry_run_pod(api, namespace, f"ray-{group}", template)
        assert accepted["metadata"]["name"] == f"ray-{group}"
        assert accepted["spec"]["serviceAccountName"] == template["spec"]["serviceAccountName"]


def test_the_same_pod_without_its_hardening_is_refused(
    operator: Any, api: Api, apply: Any, namespace: str
) -> None:
    enforce_restricted(api, namespace)
    apply(factories.manifest("mlp", namespace))
    template = copy.deepcopy(stored_templates(api, namespace, "mlp-a1")["worker"])
    for container in template["spec"]["containers"]:
        del container["securityContext"]
    with pytest.raises(ApiError) as refused:
        dry_run_pod(api, namespace, "unhardened", template)
    assert refused.value.code == 403 and 'violates PodSecurity "restricted' in str(refused.value)
