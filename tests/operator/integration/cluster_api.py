"""Dict-level access to the test control plane's apiserver (as the admin), and polling for outcomes."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from tests.controlplane import cluster

T = TypeVar("T")


class Api:
    """Admin access to the apiserver as plain JSON (the control plane's raw request)."""

    def __init__(self, plane: cluster.ControlPlane) -> None:
        self.plane = plane

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        code, out = self.plane.request(method, path, body=data, content_type=content_type)
        if code >= 400:
            raise ApiError(code, out)
        return out

    def get(self, path: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", path)  # type: ignore[no-any-return]
        except ApiError as error:
            if error.code == 404:
                return None
            raise

    def list(self, path: str, selector: str = "") -> list[dict[str, Any]]:
        query = f"?labelSelector={selector}" if selector else ""
        return list(self.request("GET", path + query)["items"])

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", path, body)  # type: ignore[no-any-return]

    def patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", path, patch, "application/merge-patch+json")  # type: ignore[no-any-return]

    def delete(self, path: str) -> None:
        self.request("DELETE", path)

    # Paths of the objects the tests look at.
    @staticmethod
    def job(namespace: str, name: str = "", plural: str = "trainingjobs") -> str:
        return f"/apis/trainop.dev/v1alpha1/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")

    @staticmethod
    def ray_jobs(namespace: str, name: str = "") -> str:
        return f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs" + (f"/{name}" if name else "")

    @staticmethod
    def core(namespace: str, plural: str, name: str = "") -> str:
        return f"/api/v1/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")

    @staticmethod
    def rbac(namespace: str, plural: str, name: str = "") -> str:
        return f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/{plural}" + (
            f"/{name}" if name else ""
        )


class ApiError(Exception):
    def __init__(self, code: int, body: dict[str, Any]) -> None:
        super().__init__(f"{code}: {body.get('message', body)}")
        self.code = code
        self.body = body


def user_claim(name: str) -> dict[str, Any]:
    """A claim as a user creates it: no label or owner reference of the operator's."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }


def contains(stored: Any, desired: Any) -> bool:
    """Whether ``stored`` has every field of ``desired`` (the apiserver adds defaults; lists match item by
    item): a stored child that still holds all we sent was not pruned by its schema."""
    if isinstance(desired, dict):
        return isinstance(stored, dict) and all(contains(stored.get(k), v) for k, v in desired.items())
    if isinstance(desired, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(desired)
            and all(contains(s, d) for s, d in zip(stored, desired, strict=True))
        )
    return bool(stored == desired)


def wait_for(
    fetch: Callable[[], T], until: Callable[[T], bool], *, timeout_s: float = 20, what: str = ""
) -> T:
    """Poll ``fetch`` until ``until(value)``; fail with the last value seen."""
    deadline = time.monotonic() + timeout_s
    value = fetch()
    while not until(value):
        if time.monotonic() > deadline:
            pytest.fail(
                f"timed out after {timeout_s}s waiting for {what or until}; last value: {value!r}"[:4000]
            )
        time.sleep(0.05)
        value = fetch()
    return value
