"""The node agent's API client: JSON dicts over the kubernetes library's connection pool.

Owns requests and watches as one node identity. The kubeconfig is parsed by the ``kubernetes`` library
(``config.load_kube_config``) and requests go through its urllib3 pool (TLS, client certificates); only the
typed model layer is skipped: the agent reads and writes plain dicts, the way the kubelet works with
unstructured status patches, and decoding every pod into model objects costs CPU that 2 cores lack.

Watches (:meth:`KubeClient.watch`) list first, then stream from the list's resourceVersion, and start
over with a fresh list on 410 Gone or any error, so a caller sees a consistent stream: a ``LIST`` event
carrying every item after each (re)list, then ``ADDED``/``MODIFIED``/``DELETED``. It never polls lists
in a loop.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes
import urllib3

log = logging.getLogger(__name__)

JSON = dict[str, Any]
#: Watch server-side timeout: the apiserver ends the stream after this and the watch resumes.
_WATCH_TIMEOUT_S = 240


class ApiError(RuntimeError):
    """A non-2xx answer: ``status`` and the apiserver's ``Status`` body."""

    def __init__(self, method: str, path: str, status: int, body: JSON) -> None:
        self.status = status
        self.body = body
        self.reason = str(body.get("reason", ""))
        super().__init__(f"{method} {path}: {status} {body.get('message', body)}")


class KubeClient:
    """One identity's connection to the apiserver (thread-safe: urllib3's pool is)."""

    def __init__(self, kubeconfig: Path) -> None:
        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig), client_configuration=configuration
        )
        self.server = configuration.host.rstrip("/")
        self._api_client = kubernetes.client.ApiClient(configuration)
        self._pool: urllib3.PoolManager = self._api_client.rest_client.pool_manager
        self._headers = {"Accept": "application/json", "User-Agent": "trainop-nodeagent"}
        token = (configuration.api_key or {}).get("authorization") or (configuration.api_key or {}).get(
            "BearerToken"
        )
        if token:
            self._headers["Authorization"] = token if token.startswith("Bearer ") else f"Bearer {token}"

    def close(self) -> None:
        self._api_client.close()  # type: ignore[no-untyped-call]

    def _url(self, path: str, query: Mapping[str, object] | None) -> str:
        url = self.server + path
        if query:
            url += "?" + urllib.parse.urlencode({k: str(v) for k, v in query.items() if v is not None})
        return url

    def request(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        query: Mapping[str, object] | None = None,
        content_type: str = "application/json",
        timeout_s: float = 30,
    ) -> JSON:
        headers = dict(self._headers)
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        response = self._pool.request(
            method,
            self._url(path, query),
            body=data,
            headers=headers,
            timeout=urllib3.Timeout(total=timeout_s),
            retries=False,
        )
        payload = response.data
        decoded: JSON = json.loads(payload) if payload else {}
        if response.status >= 300:
            raise ApiError(method, path, response.status, decoded)
        return decoded

    def get(self, path: str, query: Mapping[str, object] | None = None) -> JSON:
        return self.request("GET", path, query=query)

    def create(self, path: str, body: JSON) -> JSON:
        return self.request("POST", path, body=body)

    def merge_patch(self, path: str, body: JSON) -> JSON:
        return self.request("PATCH", path, body=body, content_type="application/merge-patch+json")

    def strategic_patch(self, path: str, body: JSON) -> JSON:
        return self.request("PATCH", path, body=body, content_type="application/strategic-merge-patch+json")

    def delete(self, path: str, body: JSON | None = None) -> JSON:
        return self.request("DELETE", path, body=body)

    # ------------------------------------------------------------------------------------ watches
    def _stream(self, path: str, query: Mapping[str, object]) -> Iterator[JSON]:
        response = self._pool.request(
            "GET",
            self._url(path, {**query, "watch": "true"}),
            headers=self._headers,
            preload_content=False,
            timeout=urllib3.Timeout(connect=10, read=_WATCH_TIMEOUT_S + 30),
            retries=False,
        )
        try:
            if response.status >= 300:
                raise ApiError("WATCH", path, response.status, json.loads(response.read() or b"{}"))
            buffer = b""
            for chunk in response.stream(65536, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            response.release_conn()

    def watch(
        self,
        path: str,
        *,
        query: Mapping[str, object] | None = None,
        stop: threading.Event,
        on_error: Callable[[Exception], None] | None = None,
    ) -> Iterator[tuple[str, JSON]]:
        """Yield ``(type, object)`` for a collection: ``("LIST", {"items": [...]})`` after each (re)list,
        then ``ADDED``/``MODIFIED``/``DELETED`` from the stream. Relists after 410 Gone or any error (with
        a short back-off), until ``stop`` is set."""
        base = dict(query or {})
        backoff_s = 0.2
        while not stop.is_set():
            try:
                listed = self.get(path, base)
                resource_version = listed["metadata"]["resourceVersion"]
                yield "LIST", {"items": listed.get("items") or []}
                backoff_s = 0.2
                while not stop.is_set():
                    stream_query = {
                        **base,
                        "resourceVersion": resource_version,
                        "allowWatchBookmarks": "true",
                        "timeoutSeconds": _WATCH_TIMEOUT_S,
                    }
                    for event in self._stream(path, stream_query):
                        kind, obj = event["type"], event["object"]
                        if kind == "ERROR":
                            raise ApiError("WATCH", path, int(obj.get("code", 500)), obj)
                        resource_version = obj["metadata"]["resourceVersion"]
                        if kind != "BOOKMARK":
                            yield kind, obj
                        if stop.is_set():
                            return
            except Exception as error:  # 410 Gone, connection reset, apiserver restart: relist
                if stop.is_set():
                    return
                gone = isinstance(error, ApiError) and error.status == 410
                if on_error is not None and not gone:
                    on_error(error)
                log.log(logging.DEBUG if gone else logging.WARNING, "watch %s: %s; relisting", path, error)
                stop.wait(0 if gone else backoff_s)
                backoff_s = min(backoff_s * 2, 5.0)


def now_rfc3339() -> str:
    """Kubernetes' timestamp format (second precision, UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def micro_time(at: float | None = None) -> str:
    """``MicroTime`` (leases, events.k8s.io): microsecond precision, UTC."""
    at = time.time() if at is None else at
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1e6):06d}Z"
