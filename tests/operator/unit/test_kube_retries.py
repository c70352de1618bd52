"""The operator's API client (``kube.Kube``) retries what the apiserver could not serve right now -- 429, 5xx,
a dropped connection -- and nothing else: a 409 Conflict or a 422 goes to the reconcile at once.

Against a real HTTP server on loopback (aiohttp) that answers from a script, through the same
``kubernetes.aio`` transport the operator uses.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio
from aiohttp import web
from kubernetes.aio import client as aio_client

from trainop.controller import kube

Answer = Callable[[web.Request], web.StreamResponse]


def status(code: int, **headers: str) -> Answer:
    def answer(request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {"kind": "Status", "code": code, "message": f"scripted {code}"}, status=code, headers=headers
        )

    return answer


def ok(request: web.Request) -> web.StreamResponse:
    return web.json_response({"kind": "ConfigMap", "metadata": {"name": "x"}})


def hang_up(request: web.Request) -> web.StreamResponse:
    assert request.transport is not None
    request.transport.close()  # the connection drops, as when an apiserver restarts mid-request
    return web.Response()


class Script:
    def __init__(self) -> None:
        self.answers: list[Answer] = []
        self.calls: list[tuple[str, float]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.calls.append((request.method, time.monotonic()))
        return self.answers.pop(0)(request)


@pytest_asyncio.fixture(loop_scope="function")  # serve on the test's own loop (the default is the session's)
async def server(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Script, kube.Kube]]:
    monkeypatch.setattr(kube, "RETRY_DELAYS_SECONDS", (0.01, 0.02, 0.03))
    script = Script()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", script.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    configuration = aio_client.Configuration(host=f"http://127.0.0.1:{port}")
    client = kube.Kube(aio_client.ApiClient(configuration))
    yield script, client
    await client.close()
    await runner.cleanup()


@pytest.mark.parametrize(
    "first", [status(503), status(500), status(429), hang_up], ids=["503", "500", "429", "hang-up"]
)
async def test_a_request_the_apiserver_could_not_serve_now_is_retried(
    server: tuple[Script, kube.Kube], first: Answer
) -> None:
    script, client = server
    script.answers = [first, first, ok]
    assert await client.create(kube.CONFIG_MAPS, "ns", {"metadata": {"name": "x"}}) == {
        "kind": "ConfigMap",
        "metadata": {"name": "x"},
    }
    assert [method for method, _ in script.calls] == ["POST"] * 3


@pytest.mark.parametrize("code", [409, 422, 403, 404])
async def test_conflicts_and_refusals_are_not_retried_but_reach_the_reconcile(
    server: tuple[Script, kube.Kube], code: int
) -> None:
    script, client = server
    script.answers = [status(code), ok]
    with pytest.raises(kube.ApiError) as raised:
        await client.patch(kube.CONFIG_MAPS, "ns", "x", {"data": {}})
    assert raised.value.status == code and len(script.calls) == 1


async def test_retry_after_is_honoured_and_a_lasting_5xx_fails_after_a_few_tries(
    server: tuple[Script, kube.Kube],
) -> None:
    script, client = server
    script.answers = [status(429, **{"Retry-After": "1"})] + [status(503)] * len(kube.RETRY_DELAYS_SECONDS)
    with pytest.raises(kube.ApiError) as raised:
        await client.get(kube.CONFIG_MAPS, "ns", "x")
    assert raised.value.status == 503
    assert len(script.calls) == len(kube.RETRY_DELAYS_SECONDS) + 1
    assert script.calls[1][1] - script.calls[0][1] >= 0.95  # waited the 1 s the apiserver asked for
