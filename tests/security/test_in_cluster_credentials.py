"""The operator and the trainer authenticate the way they do in a pod: the ServiceAccount token and CA at
/var/run/secrets/kubernetes.io/serviceaccount and KUBERNETES_SERVICE_HOST/PORT, nothing else.

Every other test hands them a kubeconfig or TRAINOP_KUBE_* variables (e2e strips
KUBERNETES_SERVICE_HOST); this one gives them only what the kubelet would (``pod_identity``: a private
mount namespace with the three files, no KUBECONFIG, an empty HOME). The operator holds the chart's
identity (rendered RBAC and admission policy); the trainer holds the job's own ServiceAccount, which the
operator created. A RayJob created by the operator, and a progress record on the job's status written by
the trainer's status sink, can only come from those credentials.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import urlparse

import operator_factories as factories
import pytest
from cluster_api import Api, wait_for

from tests.controlplane import cluster
from tests.reliability import operator_runner, pod_identity
from tests.security import chart_rbac

pytestmark = pytest.mark.controlplane

TRAINER_STATUS_SCRIPT = textwrap.dedent(
    """
    import sys
    from trainop.api import trainer_config
    from trainop_trainer import status

    sink = status.KubernetesSink(trainer_config.StatusTarget(namespace=sys.argv[1], name=sys.argv[2]))
    reporter = status.StatusReporter([sink])
    reporter.progress(
        step=7, total_steps=50, epoch=0, loss=0.5, samples_per_second=10.0, eta_seconds=4.0, worker_restarts=0
    )
    reporter.close(timeout_s=60)
    assert sink.patches_sent == 1, sink.patches_sent
    """
)


def _identity(plane: cluster.ControlPlane, namespace: str, token: str) -> pod_identity.PodIdentity:
    server = urlparse(plane.server_url)
    assert server.hostname and server.port
    return pod_identity.PodIdentity(
        token=token,
        ca_cert=plane.pki.ca_cert_path,
        namespace=namespace,
        host=server.hostname,
        port=server.port,
    )


def test_the_operator_and_the_trainer_work_with_only_a_pods_service_account_credentials(
    isolated_plane: cluster.ControlPlane, isolated_namespace: str, tmp_path: Path
) -> None:
    plane, ns, api = isolated_plane, isolated_namespace, Api(isolated_plane)
    _, operator_token = chart_rbac.install(plane, ns)
    operator = operator_runner.Operator(
        kubeconfig=None,
        log_path=tmp_path / "operator" / "operator.log",
        namespaces=[ns],
        pod=_identity(plane, ns, operator_token),
    )
    operator.start()
    try:
        api.create(api.job(ns), factories.manifest("mlp", ns))
        wait_for(
            lambda: api.get(api.ray_jobs(ns, "mlp-a1")),
            lambda rayjob: rayjob is not None,
            timeout_s=60,
            what="the RayJob the in-cluster operator creates",
        )
    finally:
        operator.stop()
    assert "Traceback" not in operator.log(), operator.log()[-3000:]

    # The trainer, as rank 0 in a Ray pod: the job's own ServiceAccount, which the operator created.
    trainer_token = plane.service_account_token(ns, "mlp-trainer", create=False)
    argv, env = _identity(plane, ns, trainer_token).wrap(
        [sys.executable, "-c", TRAINER_STATUS_SCRIPT, ns, "mlp"],
        {key: value for key, value in os.environ.items() if not key.startswith("TRAINOP_KUBE")},
        tmp_path / "trainer",
    )
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    progress = (api.get(api.job(ns, "mlp")) or {}).get("status", {}).get("progress", {})
    assert (progress.get("step"), progress.get("totalSteps")) == (7, 50), json.dumps(progress)
