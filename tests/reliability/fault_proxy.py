"""A fault-injecting HTTP proxy in front of the real kube-apiserver: the operator talks through it.

Plain HTTP on loopback towards the operator, HTTPS (verified against the control plane's CA) towards the
apiserver; the operator authenticates with a bearer token (a ServiceAccount's), which passes through
untouched. Everything is real except the faults it injects, each a thing a production apiserver or the
network between does:

- ``write_fault_rate``: that fraction of writes (POST, PUT, PATCH, DELETE) is answered without reaching
  the apiserver, with one of 409 Conflict (PATCH only: what an optimistic-concurrency clash answers),
  429 Too Many Requests (API priority and fairness), 500 or 503 (an apiserver or etcd in trouble);
- ``lost_response_rate``: that fraction of writes *is* forwarded and applied, and then the answer is
  replaced by a 500 -- the client cannot tell that its write happened (a connection cut mid-answer);
- :meth:`freeze_watches`: every watch stream open at that moment stops delivering anything while its
  connection stays open, like a stream whose far end silently died behind a load balancer. Streams
  opened afterwards work normally.

Counters (``injected``, ``watches_opened``, ``frozen_closed_by_client``) let a test prove the faults
happened, so it cannot pass without exercising them. Random choices come from a seeded RNG.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import ssl
from pathlib import Path

import aiohttp
from aiohttp import web

from tests.controlplane import processes

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Request headers worth forwarding; hop-by-hop ones and Host are the proxy's business.
FORWARDED_REQUEST_HEADERS = ("Authorization", "Content-Type", "Accept", "User-Agent")
DROPPED_RESPONSE_HEADERS = frozenset(
    {"content-length", "transfer-encoding", "connection", "content-encoding"}
)


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason}
    body["code"] = code
    return web.Response(status=code, text=json.dumps(body), content_type="application/json")


class FaultProxy:
    def __init__(
        self,
        upstream: str,
        ca_path: Path,
        *,
        seed: int,
        write_fault_rate: float = 0.0,
        lost_response_rate: float = 0.0,
    ) -> None:
        self.upstream = upstream
        self.write_fault_rate = write_fault_rate
        self.lost_response_rate = lost_response_rate
        self.injected: collections.Counter[str] = collections.Counter()
        self.watches_opened = 0
        self.frozen_closed_by_client = 0
        self._rng = random.Random(seed)
        self._ssl = ssl.create_default_context(cafile=str(ca_path))
        self._open_watches: set[asyncio.Event] = set()  # each stream's "frozen" flag
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl, limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # Open watch streams never finish on their own: stop() must not wait aiohttp's default 60 s for them.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        port = processes.free_loopback_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def freeze_watches(self) -> int:
        """Freeze every watch stream open now; returns how many."""
        for frozen in self._open_watches:
            frozen.set()
        return len(self._open_watches)

    # --------------------------------------------------------------------------------- handling
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        is_write = request.method in WRITES
        if is_write and self._rng.random() < self.write_fault_rate:
            return self._reject(request.method)
        headers = {h: request.headers[h] for h in FORWARDED_REQUEST_HEADERS if h in request.headers}
        headers["Accept-Encoding"] = "identity"  # bodies pass through as they are
        is_watch = request.query.get("watch") in ("true", "1")
        async with self._session.request(
            request.method, self.upstream + request.path_qs, data=body or None, headers=headers
        ) as upstream:
            if is_watch and upstream.status == 200:
                return await self._stream(request, upstream)
            payload = await upstream.read()
            if is_write and upstream.status < 400 and self._rng.random() < self.lost_response_rate:
                self.injected["lost-response"] += 1
                return _status(500, "InternalError", "the response was lost (injected by the fault proxy)")
            response = web.Response(status=upstream.status, body=payload)
            for name, value in upstream.headers.items():
                if name.lower() not in DROPPED_RESPONSE_HEADERS:
                    response.headers[name] = value
            return response

    def _reject(self, method: str) -> web.Response:
        choices = ["429", "500", "503"] + (["409"] if method == "PATCH" else [])
        code = self._rng.choice(choices)
        self.injected[code] += 1
        if code == "409":
            return _status(
                409,
                "Conflict",
                "Operation cannot be fulfilled: the object has been modified; please apply your changes "
                "to the latest version and try again (injected by the fault proxy)",
            )
        if code == "429":
            response = _status(429, "TooManyRequests", "too many requests (injected by the fault proxy)")
            response.headers["Retry-After"] = "1"
            return response
        reason = "InternalError" if code == "500" else "ServiceUnavailable"
        return _status(int(code), reason, "etcdserver: leader changed (injected by the fault proxy)")

    async def _stream(self, request: web.Request, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
        self.watches_opened += 1
        frozen = asyncio.Event()
        self._open_watches.add(frozen)
        response = web.StreamResponse(status=200)
        response.content_type = upstream.headers.get("Content-Type", "application/json")
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                if frozen.is_set():
                    break
                await response.write(chunk)
            # Frozen: hold the connection open and deliver nothing, until the client gives up on it.
            # (aiohttp does not cancel a handler whose client left, so the transport is watched.)
            while frozen.is_set():
                if request.transport is None or request.transport.is_closing():
                    self.frozen_closed_by_client += 1
                    break
                await asyncio.sleep(0.1)
        except ConnectionResetError:
            pass  # the client closed a live stream (it stops, or restarts its watch)
        finally:
            self._open_watches.discard(frozen)
        return response
