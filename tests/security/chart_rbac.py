"""The operator's identity as users install it: the chart's rendered ServiceAccount, ClusterRoles, bindings
and ValidatingAdmissionPolicy, applied to a test control plane; returns a token of that account.

``helm template`` renders exactly what ``helm install`` would (only the RBAC-related templates are
applied: the Deployment has nothing to run here), with a unique release name so that the cluster-scoped
objects of several tests do not collide. The policy becomes active asynchronously after it is created;
``install`` waits until it refuses a probe write (a server-side dry run of an unlabelled ConfigMap), so a
test never races it.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from tests.controlplane import cluster
from tests.security.as_token import AsToken

CHART = Path(__file__).resolve().parents[2] / "charts" / "trainop"
TEMPLATES = ("serviceaccount.yaml", "rbac.yaml", "admission-policy.yaml")


def render(
    plane: cluster.ControlPlane, *, release: str, namespace: str, values: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    args = ["template", release, str(CHART), "--namespace", namespace]
    for template in TEMPLATES:
        args += ["--show-only", f"templates/{template}"]
    for key, value in (values or {}).items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    return [doc for doc in yaml.safe_load_all(plane.helm(*args).stdout) if doc]


def install(
    plane: cluster.ControlPlane, namespace: str, *, values: dict[str, Any] | None = None
) -> tuple[AsToken, str]:
    """Apply the rendered RBAC (and policy) for a release in ``namespace``; the account's token and name."""
    release = f"t{uuid.uuid4().hex[:8]}"
    documents = render(plane, release=release, namespace=namespace, values=values)
    plane.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(documents))
    (account,) = [d["metadata"]["name"] for d in documents if d["kind"] == "ServiceAccount"]
    token = plane.service_account_token(namespace, account, create=False)
    if any(d["kind"] == "ValidatingAdmissionPolicy" for d in documents):
        wait_until_enforced(AsToken(plane, token), namespace)
    return AsToken(plane, token), token


def wait_until_enforced(operator: AsToken, namespace: str, timeout_s: float = 60) -> None:
    probe = {"metadata": {"name": f"policy-probe-{uuid.uuid4().hex[:6]}"}, "data": {}}
    deadline = time.monotonic() + timeout_s
    while True:
        code, body = operator.request("POST", f"/api/v1/namespaces/{namespace}/configmaps?dryRun=All", probe)
        if code == 403 and "ValidatingAdmissionPolicy" in body.get("message", ""):
            return
        assert time.monotonic() < deadline, f"the admission policy is not enforced after {timeout_s}s: {body}"
        time.sleep(0.2)
