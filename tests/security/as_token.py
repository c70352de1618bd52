"""Asking the real apiserver what a bearer token may do: SelfSubjectRulesReview, SelfSubjectAccessReview,
and plain requests whose answer (403 or not) is the proof.

Used with ServiceAccount tokens from the TokenRequest API (``ControlPlane.service_account_token``), so
authentication, RBAC and the escalation checks are the apiserver's own.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from typing import Any

from tests.controlplane import cluster

Permission = tuple[str, str, str]  # (API group, resource[/subresource], verb)


class AsToken:
    def __init__(self, plane: cluster.ControlPlane, token: str) -> None:
        self._plane = plane
        self._token = token
        self._ssl = ssl.create_default_context(cafile=str(plane.pki.ca_cert_path))

    def request(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(
            self._plane.server_url + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={
                "Authorization": f"Bearer {self._token}",
                "Content-Type": content_type,
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, context=self._ssl, timeout=30) as response:
                return int(response.status), json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as error:
            return int(error.code), json.loads(error.read() or b"{}")

    def rules(self, namespace: str) -> set[tuple[Permission, tuple[str, ...]]]:
        """Every (group, resource, verb) this token holds in ``namespace``, with resourceNames (() = any)."""
        code, review = self.request(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectRulesReview",
                "spec": {"namespace": namespace},
            },
        )
        assert code == 201, review
        assert not review["status"].get("incomplete"), review["status"]
        held = set()
        for rule in review["status"]["resourceRules"]:
            names = tuple(sorted(rule.get("resourceNames") or ()))
            for group in rule.get("apiGroups") or ():
                for resource in rule.get("resources") or ():
                    for verb in rule["verbs"]:
                        held.add(((group, resource, verb), names))
        return held

    def can(
        self,
        verb: str,
        resource: str,
        *,
        group: str = "",
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> bool:
        attributes: dict[str, str] = {"verb": verb, "resource": resource, "group": group}
        for key, value in (("namespace", namespace), ("name", name), ("subresource", subresource)):
            if value is not None:
                attributes[key] = value
        code, review = self.request(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attributes},
            },
        )
        assert code == 201, review
        return bool(review["status"]["allowed"])

    def wait_until_can(self, verb: str, resource: str, *, timeout_s: float = 60, **attributes: str) -> None:
        """Wait for the RBAC authorizer to see a grant just written: it reads Roles and bindings from
        informers, so for a moment after the POSTs it still answers from the old state (CI saw an empty
        SelfSubjectRulesReview under load)."""
        deadline = time.monotonic() + timeout_s
        while not self.can(verb, resource, **attributes):
            assert time.monotonic() < deadline, (
                f"RBAC still refuses {verb} {resource} {attributes} after {timeout_s}s"
            )
            time.sleep(0.2)


def bind_cluster_role(
    plane: cluster.ControlPlane, name: str, rules: list[dict[str, Any]], namespace: str, account: str
) -> str:
    """A ClusterRole of ``rules`` bound to ServiceAccount ``namespace/account``; returns its token."""
    for path, body in [
        ("/apis/rbac.authorization.k8s.io/v1/clusterroles", {"rules": rules}),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
            },
        ),
    ]:
        code, out = plane.request(
            "POST", path, body=json.dumps({"metadata": {"name": name}, **body}).encode()
        )
        assert code in (201, 409), out
    return plane.service_account_token(namespace, account)
