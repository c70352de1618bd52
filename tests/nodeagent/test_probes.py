"""Probe and hook handlers (``probes.run_handler``) against real local sockets."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator

import pytest

from tests.nodeagent import probes


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = 200 if self.path == "/healthz" else 302 if self.path == "/moved" else 503
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def _no_exec(argv: list[str], timeout_s: float) -> tuple[int | None, str]:
    raise AssertionError("not an exec handler")


def _run(handler: dict[str, object], port: int = 0) -> tuple[bool, str]:
    container = {"name": "c", "ports": [{"name": "web", "containerPort": port}]}
    return probes.run_handler(
        handler, container=container, pod_ip="127.0.0.1", timeout_s=2, run_exec=_no_exec
    )


@pytest.mark.parametrize(("path", "ok"), [("/healthz", True), ("/moved", True), ("/broken", False)])
def test_http_probe_succeeds_on_2xx_and_3xx_only(http_port: int, path: str, ok: bool) -> None:
    success, output = _run({"httpGet": {"path": path, "port": "web"}}, http_port)
    assert success is ok
    if not ok:
        assert output == "HTTP probe failed with statuscode: 503"


def test_tcp_probe_fails_on_a_closed_port_and_passes_on_a_listening_one(http_port: int) -> None:
    assert _run({"tcpSocket": {"port": http_port}}) == (True, "")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    ok, message = _run({"tcpSocket": {"port": closed}})
    assert not ok and f"dial tcp 127.0.0.1:{closed}" in message


def test_unknown_named_port_is_a_probe_failure_naming_it() -> None:
    ok, message = _run({"httpGet": {"path": "/", "port": "metrics"}})
    assert not ok and "named port 'metrics'" in message


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ((0, "fine\n"), (True, "fine")),
        ((1, "bad"), (False, "bad")),
        ((None, "2s"), (False, "command timed out: 2s")),
    ],
)
def test_exec_probe_result_is_the_commands_exit_code(
    result: tuple[int | None, str], expected: tuple[bool, str]
) -> None:
    seen: list[list[str]] = []

    def run_exec(argv: list[str], timeout_s: float) -> tuple[int | None, str]:
        seen.append(argv)
        return result

    outcome = probes.run_handler(
        {"exec": {"command": ["check", "--deep"]}}, container={}, pod_ip="", timeout_s=1, run_exec=run_exec
    )
    assert outcome == expected
    assert seen == [["check", "--deep"]]
