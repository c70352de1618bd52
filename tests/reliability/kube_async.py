"""A small asyncio client for the test control plane (admin, plain JSON) with reconnecting watches.

The reliability tests and the scale bench drive hundreds of objects at once: creating them, playing
KubeRay on their RayJobs, following their phases. Doing that with blocking requests and polling would
make the harness, not the operator, the bottleneck (and would put its own load on the apiserver that the
measurements then have to subtract). This client is aiohttp on one connection pool, and every "wait for
X" is a watch.

:meth:`AsyncApi.watch` survives what the tests do to the control plane (kube-apiserver and etcd
restarts): a broken stream is resumed from the last resourceVersion, and on ``410 Gone`` (or a restarted
apiserver that no longer has that history) it lists again and reports every object as ``SYNCED``, the
way an informer's relist does. Objects deleted while it was disconnected are reported ``DELETED`` after
the relist, so a consumer's view never keeps a ghost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp

from tests.controlplane import cluster

#: Errors that mean "the apiserver is not answering right now" (restarting, or etcd is).
TRANSIENT = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError, OSError)


class ApiStatus(Exception):
    def __init__(self, code: int, body: Mapping[str, Any]) -> None:
        super().__init__(f"{code}: {body.get('message', body)}")
        self.code = code
        self.body = body


class AsyncApi:
    def __init__(self, server_url: str, ssl_context: ssl.SSLContext, *, limit: int = 64) -> None:
        self.server_url = server_url
        self._ssl = ssl_context
        self._limit = limit
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def for_plane(cls, plane: cluster.ControlPlane, *, limit: int = 64) -> AsyncApi:
        context = ssl.create_default_context(cafile=str(plane.pki.ca_cert_path))
        context.load_cert_chain(str(plane.pki.admin.cert_path), str(plane.pki.admin.key_path))
        return cls(plane.server_url, context, limit=limit)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl, limit=self._limit),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> AsyncApi:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ----------------------------------------------------------------------------------- requests
    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
        timeout_s: float = 30,
    ) -> dict[str, Any]:
        async with self.session.request(
            method,
            self.server_url + path,
            params=dict(query or {}),
            data=None if body is None else json.dumps(body),
            headers={"Content-Type": content_type, "Accept": "application/json"},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as response:
            raw = await response.read()
            data: dict[str, Any] = json.loads(raw) if raw else {}
            if response.status >= 400:
                raise ApiStatus(response.status, data)
            return data

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            return await self.request("GET", path)
        except ApiStatus as error:
            if error.code == 404:
                return None
            raise

    async def list(self, path: str, *, selector: str = "") -> list[dict[str, Any]]:
        query = {"labelSelector": selector} if selector else {}
        return list((await self.request("GET", path, query=query)).get("items") or [])

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request("POST", path, dict(body))

    async def patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request("PATCH", path, dict(patch), content_type="application/merge-patch+json")

    async def delete(self, path: str) -> bool:
        try:
            await self.request("DELETE", path, {"propagationPolicy": "Background"})
        except ApiStatus as error:
            if error.code == 404:
                return False
            raise
        return True

    async def retrying(self, coro_factory: Any, *, attempts: int = 480, delay_s: float = 0.25) -> Any:
        """Run ``coro_factory()`` until it does not fail with a transient error or a 5xx/429 (restarts of
        the apiserver or etcd): at least two minutes of retries."""
        for attempt in range(attempts):
            try:
                return await coro_factory()
            except ApiStatus as error:
                if (error.code < 500 and error.code != 429) or attempt == attempts - 1:
                    raise
            except TRANSIENT:
                if attempt == attempts - 1:
                    raise
            await asyncio.sleep(delay_s)
        raise AssertionError("unreachable")

    # -------------------------------------------------------------------------------------- watch
    async def watch(self, path: str, *, selector: str = "") -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Events ``(type, object)`` of the collection at ``path``, forever: SYNCED for every object of a
        (re)list, then ADDED / MODIFIED / DELETED. Reconnects across apiserver and etcd restarts."""
        known: dict[str, dict[str, Any]] = {}  # uid -> last object, to report deletions missed by a relist
        version = ""
        while True:
            if not version:
                try:
                    listing = await self.request(
                        "GET", path, query={"labelSelector": selector} if selector else {}
                    )
                except (ApiStatus, *TRANSIENT):
                    await asyncio.sleep(0.2)
                    continue
                version = listing["metadata"]["resourceVersion"]
                seen = {}
                for obj in listing.get("items") or []:
                    seen[obj["metadata"]["uid"]] = obj
                    yield "SYNCED", obj
                for uid, gone in known.items():
                    if uid not in seen:
                        yield "DELETED", gone
                known = seen
            query = {"watch": "true", "allowWatchBookmarks": "true", "resourceVersion": version}
            if selector:
                query["labelSelector"] = selector
            try:
                async with self.session.get(
                    self.server_url + path,
                    params=query,
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=90),
                ) as response:
                    if response.status == 410:
                        version = ""
                        continue
                    if response.status >= 400:
                        await asyncio.sleep(0.2)
                        version = "" if response.status < 500 else version
                        continue
                    async for line in response.content:
                        event = json.loads(line)
                        kind, obj = event["type"], event["object"]
                        if kind == "ERROR":
                            version = "" if obj.get("code") == 410 else version
                            break
                        version = obj["metadata"].get("resourceVersion") or version
                        if kind == "BOOKMARK":
                            continue
                        if kind == "DELETED":
                            known.pop(obj["metadata"]["uid"], None)
                        else:
                            known[obj["metadata"]["uid"]] = obj
                        yield kind, obj
            except TRANSIENT:
                await asyncio.sleep(0.2)


async def cancel(*tasks: asyncio.Task[Any]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
