"""Without KubeRay, a job says so on its status (``RayClusterReady=False``, reason ``KubeRayNotInstalled``,
one Warning Event naming the fix), and once KubeRay's CRDs are installed the same job starts without any
user action.

A control plane of its own, started without KubeRay's CRDs (the shared planes always have them), with the
operator as its own process (``python -m trainop.controller``). No stand-in: nothing here needs a RayJob
to run, only to be created.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import operator_factories as factories
import pytest
from cluster_api import Api, wait_for

from tests.controlplane import assets, cluster, crds
from tests.reliability import operator_runner

pytestmark = pytest.mark.controlplane


@pytest.fixture
def plane_without_kuberay(control_plane_assets: assets.Assets) -> Iterator[cluster.ControlPlane]:
    plane = cluster.ControlPlane(
        assets=control_plane_assets,
        settings=cluster.ControlPlaneSettings(
            crd_paths=crds.default_crd_paths(), install_kuberay_crds=False, controller_manager=False
        ),
    )
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


def _condition(body: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    conditions = ((body or {}).get("status") or {}).get("conditions", [])
    return {c["type"]: c for c in conditions}.get(type_, {})


def test_a_job_without_kuberay_says_so_and_starts_once_kuberay_is_installed(
    plane_without_kuberay: cluster.ControlPlane, control_plane_assets: assets.Assets, tmp_path: Path
) -> None:
    plane, api = plane_without_kuberay, Api(plane_without_kuberay)
    ns = plane.create_namespace(f"no-kuberay-{uuid.uuid4().hex[:6]}")
    operator = operator_runner.Operator(
        kubeconfig=plane.kubeconfig_path, log_path=tmp_path / "operator.log", namespaces=[ns]
    )
    operator.start()
    try:
        api.create(api.job(ns), factories.manifest("mlp", ns))
        waiting = wait_for(
            lambda: api.get(api.job(ns, "mlp")),
            lambda b: _condition(b, "RayClusterReady").get("reason") == "KubeRayNotInstalled",
            timeout_s=60,
            what="RayClusterReady=False/KubeRayNotInstalled",
        )
        ready = _condition(waiting, "RayClusterReady")
        assert ready["status"] == "False"
        assert "the ray.io/v1 RayJob API is not served. Install the KubeRay operator" in ready["message"]
        assert waiting["status"]["phase"] in ("Pending", "Provisioning")
        warnings = wait_for(
            lambda: [
                e for e in api.list(f"/api/v1/namespaces/{ns}/events") if e["reason"] == "KubeRayNotInstalled"
            ],
            lambda found: len(found) >= 1,
            what="the Warning Event",
        )
        assert warnings[0]["type"] == "Warning" and warnings[0]["involvedObject"]["name"] == "mlp"
        assert operator.live()

        plane.install_crds(control_plane_assets.kuberay_crds)
        # The operator retries with backoff (0.5 s doubling, at most 60 s): within about a minute.
        wait_for(
            lambda: api.get(api.ray_jobs(ns, "mlp-a1")),
            lambda rayjob: rayjob is not None,
            timeout_s=120,
            what="the RayJob, after KubeRay's CRDs were installed",
        )
        assert "Traceback" not in operator.log()
    finally:
        operator.stop()
