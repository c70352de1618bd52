"""A small dict-in, dict-out async client for the Kubernetes API, on ``kubernetes.aio``'s ApiClient.

The operator handles every object as plain JSON (its builders return dicts, its observations read
dicts), so it uses the official client's transport, authentication and kubeconfig/in-cluster loading,
but not its generated model classes: one code path serves ConfigMaps, RBAC, claims, pods, our CRs and
KubeRay's RayJobs alike. Writes use ``fieldValidation=Strict`` so that a typo in a builder fails loudly
instead of being pruned by the apiserver, and a fixed field manager (``trainop``), which is also the
field owner of server-side apply (:meth:`Kube.apply`).

Every request has a deadline (``REQUEST_TIMEOUT_SECONDS``): a connection that went silent (an apiserver
restarted behind a load balancer, a half-open TCP connection) fails the reconcile, which is retried,
instead of holding one of the few reconcile workers for aiohttp's default five minutes.

Like client-go, a request the apiserver could not serve right now -- 429 (API priority and fairness), a
5xx, a refused or reset connection -- is retried here a few times (``RETRY_DELAYS_SECONDS``, or the
answer's Retry-After, capped), before it fails the reconcile and the per-owner backoff takes over. Unlike
client-go this includes writes whose outcome is unknown (a 500 after the write was applied): every write
of this operator is safe to repeat (deterministic names, so a repeated create is a 409 its caller handles;
server-side applies of a whole desired object; deletes with a uid precondition). The owner's status, a
JSON patch with its uid as a test (``incarnation``), is the exception: repeated after it was applied, a
removal in it finds nothing to remove and the repeat is refused (422); the reconcile then fails and runs
again from a fresh read, which finds the status written, and a transition's counters
(``metrics.record_failure`` and the like, counted after the status write) miss that one transition. A 409
Conflict is never retried here: the reconcile decides again.

This module must not decide anything; it only speaks HTTP.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
from kubernetes.aio import client as aio_client
from kubernetes.aio import config as aio_config

FIELD_MANAGER = "trainop"
#: No single request of the operator's may take longer (the apiserver itself gives up after 60 s).
REQUEST_TIMEOUT_SECONDS = 30.0
#: Pauses before retrying a request that got 429, a 5xx or a refused/reset connection.
RETRY_DELAYS_SECONDS = (0.2, 0.5, 1.0)
_MAX_RETRY_AFTER_SECONDS = 2.0
#: Objects per page of a LIST.
LIST_PAGE = 500


@dataclasses.dataclass(frozen=True)
class Resource:
    """An API resource: ``Resource("ray.io/v1", "rayjobs")``."""

    api_version: str
    plural: str

    def path(self, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
        prefix = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        path = f"{prefix}/namespaces/{namespace}/{self.plural}"
        if name is not None:
            path += f"/{name}"
        if subresource is not None:
            path += f"/{subresource}"
        return path

    def collection(self, namespace: str | None) -> str:
        """The objects of one namespace, or (None) of every namespace."""
        if namespace is not None:
            return self.path(namespace)
        prefix = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        return f"{prefix}/{self.plural}"


CONFIG_MAPS = Resource("v1", "configmaps")
CLAIMS = Resource("v1", "persistentvolumeclaims")
PODS = Resource("v1", "pods")
SERVICE_ACCOUNTS = Resource("v1", "serviceaccounts")
EVENTS = Resource("v1", "events")
ROLES = Resource("rbac.authorization.k8s.io/v1", "roles")
ROLE_BINDINGS = Resource("rbac.authorization.k8s.io/v1", "rolebindings")
RAY_JOBS = Resource("ray.io/v1", "rayjobs")
RAY_CLUSTERS = Resource("ray.io/v1", "rayclusters")
BY_KIND: Mapping[str, Resource] = {
    "ConfigMap": CONFIG_MAPS,
    "PersistentVolumeClaim": CLAIMS,
    "Pod": PODS,
    "ServiceAccount": SERVICE_ACCOUNTS,
    "Role": ROLES,
    "RoleBinding": ROLE_BINDINGS,
    "RayJob": RAY_JOBS,
    "RayCluster": RAY_CLUSTERS,
}


def in_cluster(kubeconfig: str | None) -> bool:
    return kubeconfig is None and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


async def load_configuration(kubeconfig: str | None) -> aio_client.Configuration:
    """In a pod: the ServiceAccount; elsewhere: ``kubeconfig``, else $KUBECONFIG, else ~/.kube/config."""
    configuration = aio_client.Configuration()
    if in_cluster(kubeconfig):
        aio_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        path = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        await aio_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, client_configuration=configuration
        )
    return configuration


class ApiError(Exception):
    """A non-2xx answer: ``status`` is the HTTP code, ``message`` the apiserver's sentence."""

    def __init__(self, status: int, reason: str, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


def namespace_terminating(error: ApiError) -> bool:
    """The apiserver refused a create because the namespace is being deleted (its objects go with it)."""
    return error.status == 403 and "because it is being terminated" in error.message


class Kube:
    def __init__(self, api_client: aio_client.ApiClient) -> None:
        self._api = api_client

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> Kube:
        return cls(aio_client.ApiClient(await load_configuration(kubeconfig)))

    async def close(self) -> None:
        await self._api.close()  # type: ignore[no-untyped-call]

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        for delay in (*RETRY_DELAYS_SECONDS, None):
            try:
                return await self._request_once(
                    method, path, query=query, body=body, content_type=content_type
                )
            except ApiError as error:
                if delay is None or not (error.status == 429 or error.status >= 500):
                    raise
                delay = min(error.retry_after or delay, _MAX_RETRY_AFTER_SECONDS)
            except aiohttp.ClientConnectionError:  # refused, reset: the apiserver is restarting
                if delay is None:
                    raise
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _request_once(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str,
    ) -> dict[str, Any]:
        # The URL and the (possibly refreshed) credentials from the client; the body is not handed to
        # param_serialize, whose model sanitising would walk every plain-JSON body recursively (a
        # quarter of the operator's request CPU): the transport JSON-encodes the dict once.
        method, url, headers, _, _ = await self._api.param_serialize(
            method,
            path,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = await self._api.call_api(
            method, url, headers, body, None, _request_timeout=REQUEST_TIMEOUT_SECONDS
        )
        raw = await response.read()  # type: ignore[no-untyped-call]
        if response.status >= 400:
            # Not every error is a Status object: a path of an API group that is not served (KubeRay not
            # installed) answers 404 with the plain text "404 page not found".
            try:
                status: Any = json.loads(raw) if raw else {}
            except ValueError:
                status = None
            status = status if isinstance(status, dict) else {}
            raise ApiError(
                response.status,
                str(status.get("reason") or response.reason),
                str(status.get("message") or bytes(raw).decode(errors="replace").strip()),
                retry_after=_seconds(response.getheader("Retry-After")),  # type: ignore[no-untyped-call]
            )
        data: dict[str, Any] = json.loads(raw) if raw else {}
        return data

    # ---------------------------------------------------------------------------------------- verbs
    async def get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self.request("GET", resource.path(namespace, name))
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    async def list(
        self, resource: Resource, namespace: str | None, *, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Objects of a namespace (None: of every namespace) matching ``label_selector`` (server-side;
        None: all), fetched LIST_PAGE at a time; [] when the resource type is not installed."""
        items: list[dict[str, Any]] = []
        query = {"limit": str(LIST_PAGE)}
        if label_selector is not None:
            query["labelSelector"] = label_selector
        while True:
            try:
                data = await self.request("GET", resource.collection(namespace), query=query)
            except ApiError as error:
                if error.status == 404:
                    return []
                raise
            items.extend(data.get("items") or [])
            token = (data.get("metadata") or {}).get("continue")
            if not token:
                return items
            query["continue"] = token

    async def create(self, resource: Resource, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request(
            "POST",
            resource.path(namespace),
            query={"fieldManager": FIELD_MANAGER, "fieldValidation": "Strict"},
            body=dict(body),
        )

    async def patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386): lists are replaced whole, null removes a key."""
        return await self.request(
            "PATCH",
            resource.path(namespace, name, subresource),
            query={"fieldManager": FIELD_MANAGER, "fieldValidation": "Strict"},
            body=dict(patch),
            content_type="application/merge-patch+json",
        )

    async def json_patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        operations: Sequence[Mapping[str, Any]],
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """A JSON patch (RFC 6902): its ``test`` operations are preconditions; any one that fails, or an
        operation on a path the object lacks, fails the whole patch (422, with no word of which)."""
        return await self.request(
            "PATCH",
            resource.path(namespace, name, subresource),
            query={"fieldManager": FIELD_MANAGER, "fieldValidation": "Strict"},
            body=[dict(operation) for operation in operations],
            content_type="application/json-patch+json",
        )

    async def apply(self, resource: Resource, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of ``body`` as field manager ``trainop``, forcing ownership of its fields.

        Creates the object if it does not exist; otherwise sets every field in ``body`` and removes the
        fields ``trainop`` applied before and ``body`` no longer has. Fields set by other managers and not
        in ``body`` are left alone. Answers the object as stored.
        """
        return await self.request(
            "PATCH",
            resource.path(namespace, body["metadata"]["name"]),
            query={"fieldManager": FIELD_MANAGER, "fieldValidation": "Strict", "force": "true"},
            body=dict(body),
            # JSON is YAML: the apply content type takes either.
            content_type="application/apply-patch+yaml",
        )

    async def delete(self, resource: Resource, namespace: str, name: str, *, uid: str | None = None) -> bool:
        """Delete in the background (the garbage collector removes dependents); False when already gone.

        With ``uid``, only that incarnation of the object is deleted (a precondition), never a namesake.
        """
        body: dict[str, Any] = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": "Background",
        }
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", resource.path(namespace, name), body=body)
        except ApiError as error:
            if error.status in (404, 409):
                return False
            raise
        return True


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:  # an HTTP date: rare, and the default delay will do
        return None
