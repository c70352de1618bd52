"""No credential, token or secret value reaches a TrainingJob's status, an Event, the operator's log or its
metrics -- with the operator at ``--verbose`` (its most talkative), through a job's whole life (running,
a failure, a restart, success) and an invalid sweep. KubeRay's part is played by its stand-in
(``kuberay_standin.KubeRayStandIn``, the only mock): it writes the RayJob statuses KubeRay would (Running,
Failed with a Ray message, Succeeded).

Canaries planted where secrets live: the operator's own bearer token (a ServiceAccount token in its
kubeconfig), secret-looking variables in its environment, a Secret in the job's namespace, and values
in a job's ``network.ncclEnv``. The last one must reach the Ray pods (checked: otherwise the test would
prove nothing about the operator handling it) and nothing else the operator writes.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import operator_factories as factories
import pytest
from cluster_api import Api, wait_for
from kuberay_standin import KubeRayStandIn

from tests.controlplane import cluster, kubeconfig
from tests.reliability import operator_runner
from tests.security import chart_rbac

pytestmark = pytest.mark.controlplane


def canary(what: str) -> str:
    return f"{what}-CANARY-{uuid.uuid4().hex}"


def test_no_token_environment_secret_or_spec_value_appears_in_status_events_logs_or_metrics(
    isolated_plane: cluster.ControlPlane,
    isolated_namespace: str,
    make_operator: Callable[..., operator_runner.Operator],
    tmp_path: Path,
) -> None:
    ns, api = isolated_namespace, Api(isolated_plane)
    _, token = chart_rbac.install(isolated_plane, ns)  # the chart's RBAC and admission policy
    secrets = {
        "operator token": token,
        "operator token signature": token.rsplit(".", 1)[1],
        "environment AWS key": canary("wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY"),
        "environment password": canary("db-password"),
        "Secret in the namespace": canary("secret-object"),
        "ncclEnv value": canary("nccl-value"),
    }
    api.create(
        f"/api/v1/namespaces/{ns}/secrets",
        {"metadata": {"name": "db"}, "stringData": {"password": secrets["Secret in the namespace"]}},
    )
    operator = make_operator(
        ns,
        kubeconfig=kubeconfig.write(
            tmp_path / "operator.kubeconfig",
            server=isolated_plane.server_url,
            ca_cert_path=isolated_plane.pki.ca_cert_path,
            token=token,
            namespace=ns,
            user="trainop-operator",
        ),
        args=["--verbose"],
        env={
            "AWS_SECRET_ACCESS_KEY": secrets["environment AWS key"],
            "TRAINOP_DB_PASSWORD": secrets["environment password"],
        },
    )
    operator.start()
    kuberay = KubeRayStandIn(isolated_plane)
    nccl = {"network": {"ncclEnv": {"NCCL_IB_HCA": secrets["ncclEnv value"]}}}

    # A whole life: running, a failure whose message KubeRay reports, a restart, success.
    api.create(api.job(ns), factories.manifest("mlp", ns, spec=nccl))
    wait_for(lambda: api.get(api.ray_jobs(ns, "mlp-a1")), lambda r: r is not None, what="RayJob a1")
    kuberay.run(ns, "mlp-a1")
    kuberay.fail(ns, "mlp-a1", message="NCCL error: unhandled system error")
    wait_for(lambda: api.get(api.ray_jobs(ns, "mlp-a2")), lambda r: r is not None, what="RayJob a2")
    kuberay.run(ns, "mlp-a2")
    kuberay.succeed(ns, "mlp-a2")
    wait_for(
        lambda: (api.get(api.job(ns, "mlp")) or {}).get("status", {}).get("phase"), lambda p: p == "Succeeded"
    )
    # And an invalid one the apiserver admits (a sweep whose grid does not match numTrials: an operator-only
    # rule), with the same secret-looking value in its template.
    sweeps = api.job(ns, plural="tuningsweeps")
    broken = factories.manifest(
        "broken", ns, kind="TuningSweep", spec={**factories.GRID_SIZE_MISMATCH, "template": nccl}
    )
    api.create(sweeps, broken)
    wait_for(
        lambda: (api.get(f"{sweeps}/broken") or {}).get("status", {}).get("phase"), lambda p: p == "Failed"
    )

    # Positive control: the spec's value did pass through the operator, into the Ray pods' env.
    rayjob = json.dumps(api.get(api.ray_jobs(ns, "mlp-a2")))
    assert secrets["ncclEnv value"] in rayjob

    written = {
        "statuses": json.dumps([obj.get("status") for obj in [*api.list(api.job(ns)), *api.list(sweeps)]]),
        "events": json.dumps(api.list(f"/api/v1/namespaces/{ns}/events")),
        "operator log": operator.log(),
        "operator metrics": json.dumps(operator.metrics()),
    }
    assert len(written["operator log"].splitlines()) > 20, "the verbose log is suspiciously short"
    leaks = [
        (what, where) for what, value in secrets.items() for where, text in written.items() if value in text
    ]
    assert not leaks, leaks
    assert "Bearer " not in written["operator log"]
