"""Test hooks: a small HTTP API on a unix socket (``<state-dir>/control.sock``) and its client.

What a failure scenario needs and a kubelet never offers:

- ``POST /kill`` ``{"namespace", "pod", "container", "signal": "KILL", "process": "main"}``: signal a
  container's main process (``"main"``), every process in it (``"all"``), or those whose command line
  contains a string (e.g. ``"trainop_trainer"``: the trainer inside a Ray worker). ``"STOP"`` hangs a
  process. Answers ``{"pids": [...]}``; the container's exit then follows from what the process does;
- ``POST /lose-node`` ``{"node"}``: every process of the node's pods is SIGKILLed, its sandboxes are torn
  down, its Lease and status stop: the node is gone, the API objects are left as they were, and the
  node-lifecycle controller marks it Unknown after its grace period;
- ``POST /exec`` ``{"namespace", "pod", "container", "command": [...]}``: run a command inside a running
  container, answering ``{"exitCode", "output"}`` (what ``kubectl exec`` does, without the apiserver);
- ``GET /pods``: pods, containers and their pids; ``GET /healthz``.

Only root can reach the socket (mode 0600 in the state dir).
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import signal
import socket
import socketserver
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
JSON = dict[str, Any]
Handler = Callable[[JSON], JSON]


class HookError(RuntimeError):
    """A hook request was refused (no such pod or container, bad signal): HTTP 400 with the message."""


def parse_signal(value: str | int) -> int:
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    name = str(value).upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    try:
        return int(signal.Signals[name])
    except KeyError:
        raise HookError(f"unknown signal {value!r}") from None


class ControlServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: Path, routes: dict[tuple[str, str], Handler]) -> None:
        path.unlink(missing_ok=True)
        super().__init__(str(path), _ControlHandler)
        os.chmod(path, 0o600)
        self.routes = routes

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="control", daemon=True)
        thread.start()
        return thread


class _ControlHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ControlServer

    def address_string(self) -> str:
        return "control.sock"

    def log_message(self, format: str, *args: Any) -> None:
        log.info("control: " + format, *args)

    def _answer(self, status: int, payload: JSON) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _dispatch(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}") if length else {}
        handler = self.server.routes.get((method, self.path.split("?")[0]))
        if handler is None:
            self._answer(404, {"error": f"no route {method} {self.path}"})
            return
        try:
            self._answer(200, handler(body))
        except HookError as error:
            self._answer(400, {"error": str(error)})
        except Exception as error:
            log.exception("control %s %s", method, self.path)
            self._answer(500, {"error": str(error)})

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")


# ------------------------------------------------------------------------------------------ client
class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(str(self.socket_path))
        self.sock = sock


class AgentControl:
    """Client of the test hooks, e.g. ``AgentControl(state_dir / "control.sock").kill(...)``."""

    def __init__(self, socket_path: Path, *, timeout_s: float = 60) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: JSON | None = None) -> JSON:
        connection = _UnixConnection(self.socket_path, self.timeout_s)
        try:
            payload = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if payload else {}
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            answer: JSON = json.loads(response.read() or b"{}")
        finally:
            connection.close()
        if response.status != 200:
            raise HookError(f"{method} {path}: {response.status} {answer.get('error', answer)}")
        return answer

    def healthy(self) -> bool:
        try:
            return self._call("GET", "/healthz").get("ok") is True
        except (OSError, HookError):
            return False

    def pods(self) -> list[JSON]:
        pods: list[JSON] = self._call("GET", "/pods")["pods"]
        return pods

    def kill(
        self, namespace: str, pod: str, container: str, *, signal: str | int = "KILL", process: str = "main"
    ) -> list[int]:
        answer = self._call(
            "POST",
            "/kill",
            {
                "namespace": namespace,
                "pod": pod,
                "container": container,
                "signal": signal,
                "process": process,
            },
        )
        pids: list[int] = answer["pids"]
        return pids

    def lose_node(self, node: str) -> None:
        self._call("POST", "/lose-node", {"node": node})

    def exec(
        self, namespace: str, pod: str, container: str, command: list[str], *, timeout_s: float = 30
    ) -> tuple[int | None, str]:
        answer = self._call(
            "POST",
            "/exec",
            {
                "namespace": namespace,
                "pod": pod,
                "container": container,
                "command": command,
                "timeoutSeconds": timeout_s,
            },
        )
        return answer["exitCode"], str(answer["output"])
