"""``helm upgrade`` of the operator leaves running jobs untouched (README's day-2 table, docs/install.md).

The upgrade as docs/install.md prescribes it, with the real helm against a real apiserver: the CRDs
server-side applied first, then ``helm upgrade --reset-then-reuse-values`` (with a changed value, so the
release really changes), and the operator process replaced as the Deployment's ``Recreate`` strategy
replaces its pod: the old one stops, a new one starts. Both run with only the chart ServiceAccount's
in-cluster credentials (``pod_identity``), under the chart's RBAC and admission policy.

Stand-in (declared): KubeRay's controller, as everywhere in this tier (``KubeRayStandIn`` marks the
RayJob Running). "Untouched" is checked on what a user would see: the job stays Running in attempt 1
with no restart, its RayJob is the same object with no new write from the operator, and its other
children keep their resourceVersions. The new operator is checked to have reconciled the job (its
reconcile counter) before anything is compared, so the comparison cannot pass by racing it.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import operator_factories as factories
import pytest
from cluster_api import Api, wait_for
from kuberay_standin import KubeRayStandIn

from tests.controlplane import cluster
from tests.reliability import operator_runner, pod_identity

pytestmark = pytest.mark.controlplane

CHART = Path(__file__).resolve().parents[2] / "charts" / "trainop"


def _operator(
    plane: cluster.ControlPlane, release_ns: str, account: str, job_ns: str, log: Path
) -> operator_runner.Operator:
    server = urlparse(plane.server_url)
    assert server.hostname and server.port
    identity = pod_identity.PodIdentity(
        token=plane.service_account_token(release_ns, account, create=False),
        ca_cert=plane.pki.ca_cert_path,
        namespace=release_ns,
        host=server.hostname,
        port=server.port,
    )
    return operator_runner.Operator(kubeconfig=None, log_path=log, namespaces=[job_ns], pod=identity)


def _children(api: Api, ns: str) -> dict[str, tuple[str, str]]:
    """kind/name -> (uid, resourceVersion) of every child the operator made for the job."""
    selector = "app.kubernetes.io/managed-by=trainop"
    found: dict[str, tuple[str, str]] = {}
    for kind, path in [
        ("RayJob", api.ray_jobs(ns)),
        ("ConfigMap", api.core(ns, "configmaps")),
        ("ServiceAccount", api.core(ns, "serviceaccounts")),
        ("PersistentVolumeClaim", api.core(ns, "persistentvolumeclaims")),
        ("Role", api.rbac(ns, "roles")),
        ("RoleBinding", api.rbac(ns, "rolebindings")),
    ]:
        for obj in api.list(path, selector):
            meta = obj["metadata"]
            found[f"{kind}/{meta['name']}"] = (meta["uid"], meta["resourceVersion"])
    return found


def test_a_running_job_is_untouched_by_a_helm_upgrade_that_replaces_the_operator(
    isolated_plane: cluster.ControlPlane, isolated_namespace: str, tmp_path: Path
) -> None:
    plane, job_ns, api = isolated_plane, isolated_namespace, Api(isolated_plane)
    release, release_ns = f"up{uuid.uuid4().hex[:6]}", plane.create_namespace(prefix="trainop-system-")
    account = f"{release}-trainop"
    # The CRDs are in the plane already (installed from crds/, as `kubectl apply` would).
    plane.helm("install", release, str(CHART), "-n", release_ns, "--skip-crds", "--wait=false")
    old = _operator(plane, release_ns, account, job_ns, tmp_path / "old" / "operator.log")
    old.start()
    try:
        api.create(api.job(job_ns), factories.manifest("mlp", job_ns))
        wait_for(lambda: api.get(api.ray_jobs(job_ns, "mlp-a1")), lambda r: r is not None, what="RayJob")
        KubeRayStandIn(plane).run(job_ns, "mlp-a1")
        wait_for(
            lambda: (api.get(api.job(job_ns, "mlp")) or {}).get("status", {}).get("phase"),
            lambda phase: phase == "Running",
            what="Running",
        )
        before_job: dict[str, Any] = api.get(api.job(job_ns, "mlp")) or {}
        before_children = _children(api, job_ns)
        events_before = len(api.list(f"/api/v1/namespaces/{job_ns}/events"))
    finally:
        old.stop()  # Recreate: the old pod is gone before the new one starts

    plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    plane.helm(
        "upgrade",
        release,
        str(CHART),
        "-n",
        release_ns,
        "--reset-then-reuse-values",
        "--set",
        "operator.workers=8",
    )
    revision = plane.helm("history", release, "-n", release_ns, "-o", "json").stdout
    assert '"revision":2' in revision.replace(" ", ""), revision

    new = _operator(plane, release_ns, account, job_ns, tmp_path / "new" / "operator.log")
    new.start()
    try:
        wait_for(new.reconciles, lambda count: count >= 1, timeout_s=60, what="the new operator's reconcile")
        after_job: dict[str, Any] = api.get(api.job(job_ns, "mlp")) or {}
        status, before = after_job["status"], before_job["status"]
        assert (status["phase"], status["attempt"], status["restarts"]) == ("Running", 1, 0)
        assert status["conditions"] == before["conditions"]
        assert _children(api, job_ns) == before_children  # same objects, not written again
        assert [r["metadata"]["name"] for r in api.list(api.ray_jobs(job_ns))] == ["mlp-a1"]
        assert len(api.list(f"/api/v1/namespaces/{job_ns}/events")) == events_before
        assert "Traceback" not in new.log(), new.log()[-3000:]
    finally:
        new.stop()
