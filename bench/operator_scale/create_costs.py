"""What one create of each child kind costs the kube-apiserver and etcd in CPU, as the cluster admin (a
client certificate in system:masters) and as the operator's ServiceAccount (bound to exactly
``rbac.OPERATOR_RULES``, so RBAC's escalation check runs for Roles and RoleBindings); and, as the
operator, what a server-side apply costs that creates the object, and one that finds it unchanged.

    .venv/bin/python bench/operator_scale/create_costs.py [N]   # N requests per kind and verb (default 150)

A fresh control plane (with the scale bench's audit policy, so the figures compare with run.py's); CPU
seconds from /proc. Complements request_costs.py, which replays reads and patches.
"""

from __future__ import annotations

import asyncio
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "operator"), str(Path(__file__).resolve().parent)]
import aiohttp  # noqa: E402
import run as scale  # noqa: E402  (this directory: the scale bench's harness)

N = int(sys.argv[1]) if len(sys.argv) > 1 else 150
NS = scale.NAMESPACE


def bodies(kind: str, i: int, tag: str) -> tuple[str, dict[str, Any]]:
    name = f"c{tag}-{i}"
    labels = {"app.kubernetes.io/managed-by": "trainop", "trainop.dev/job": name}
    if kind == "configmap":
        return f"/api/v1/namespaces/{NS}/configmaps", {
            "metadata": {"name": name, "labels": labels},
            "data": {"trainer.json": "{}" * 200},
        }
    if kind == "serviceaccount":
        return f"/api/v1/namespaces/{NS}/serviceaccounts", {"metadata": {"name": name, "labels": labels}}
    if kind == "role":
        return f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/roles", {
            "metadata": {"name": name, "labels": labels},
            "rules": [
                {
                    "apiGroups": ["trainop.dev"],
                    "resources": ["trainingjobs/status"],
                    "resourceNames": [name],
                    "verbs": ["get", "patch"],
                }
            ],
        }
    if kind == "rolebinding":
        return f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings", {
            "metadata": {"name": name, "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NS}],
        }
    if kind == "pvc":
        return f"/api/v1/namespaces/{NS}/persistentvolumeclaims", {
            "metadata": {"name": name, "labels": labels},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        }
    if kind == "event":
        return f"/api/v1/namespaces/{NS}/events", {
            "metadata": {"name": name},
            "involvedObject": {"kind": "TrainingJob", "name": name, "namespace": NS},
            "reason": "X",
            "message": "x",
            "type": "Normal",
        }
    raise KeyError(kind)


KINDS = {
    "configmap": ("v1", "ConfigMap"),
    "serviceaccount": ("v1", "ServiceAccount"),
    "role": ("rbac.authorization.k8s.io/v1", "Role"),
    "rolebinding": ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    "pvc": ("v1", "PersistentVolumeClaim"),
    "event": ("v1", "Event"),
}


async def run_kind(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], kind: str, tag: str, verb: str = "post"
) -> None:
    sem = asyncio.Semaphore(8)

    async def one(i: int) -> None:
        path, body = bodies(kind, i, tag)
        if verb == "post":
            request = session.post(url + path, json=body, headers=headers)
        else:  # server-side apply, as the operator sends it
            api_version, kind_name = KINDS[kind]
            body = {"apiVersion": api_version, "kind": kind_name, **body}
            request = session.patch(
                f"{url}{path}/{body['metadata']['name']}?fieldManager=trainop&force=true&fieldValidation=Strict",
                json=body,
                headers={**headers, "Content-Type": "application/apply-patch+yaml"},
            )
        async with sem, request as r:
            assert r.status in (200, 201), (r.status, await r.text())

    await asyncio.gather(*(one(i) for i in range(N)))


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        plane, _ = scale.start_plane(Path(tmp))
        try:
            scale.operator_kubeconfig(plane, scale.rbac.OPERATOR_RULES)
            token = plane.service_account_token(NS, scale.OPERATOR_SA, expiration_seconds=3600)
            pids = plane.pids()
            ctx_admin = ssl.create_default_context(cafile=str(plane.pki.ca_cert_path))
            ctx_admin.load_cert_chain(str(plane.pki.admin.cert_path), str(plane.pki.admin.key_path))
            ctx_sa = ssl.create_default_context(cafile=str(plane.pki.ca_cert_path))
            for who, ctx, headers in [
                ("admin", ctx_admin, {}),
                ("operator-sa", ctx_sa, {"Authorization": f"Bearer {token}"}),
            ]:
                verbs = [("post", "p")] + (
                    [("apply", "a"), ("apply again", "a")] if who == "operator-sa" else []
                )
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
                    for kind in ["configmap", "serviceaccount", "role", "rolebinding", "pvc", "event"]:
                        for verb, prefix in verbs if kind != "event" else verbs[:1]:
                            before = {
                                c: scale.proc_stat(pids[c])["cpu_s"] for c in ("kube-apiserver", "etcd")
                            }
                            t = time.monotonic()
                            await run_kind(
                                s, plane.server_url, headers, kind, prefix + who[0], verb.split()[0]
                            )
                            wall = time.monotonic() - t
                            after = {c: scale.proc_stat(pids[c])["cpu_s"] for c in before}
                            spent = {c: 1000 * (after[c] - before[c]) / N for c in before}
                            print(
                                f"{who:12s} {verb:12s} {kind:15s} "
                                f"apiserver {spent['kube-apiserver']:6.2f} ms  etcd {spent['etcd']:5.2f} ms  "
                                f"wall {1000 * wall / N:6.2f} ms",
                                flush=True,
                            )
        finally:
            plane.stop()


if __name__ == "__main__":
    asyncio.run(main())
