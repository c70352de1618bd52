"""The kubelet's HTTPS endpoint where users reach it through the apiserver: logs and exec.

Owns one TLS server per node on ``<node IP>:<kubelet port>`` (the port is the Node's
``daemonEndpoints.kubeletEndpoint.Port``). The serving certificate is issued by the cluster CA for the
node IP, so the apiserver verifies it with ``--kubelet-certificate-authority``; clients must present a
certificate of the same CA (the apiserver's ``--kubelet-client-certificate``). Unlike the kubelet there is
no SubjectAccessReview: any certificate of the cluster CA is trusted.

Routes:
- ``GET /containerLogs/<ns>/<pod>/<container>``: ``follow``, ``previous``, ``tailLines``, ``limitBytes``
  (``logs.py``), what ``kubectl logs [-f] [--previous] [--tail]`` calls;
- ``GET|POST /exec/<ns>/<pod>/<container>?command=...&input=1``: WebSocket ``v5.channel.k8s.io`` (or v4), the
  protocol the apiserver forwards untranslated to a node declaring ``ExtendWebSocketsToKubelet``:
  channels 0 stdin, 1 stdout, 2 stderr, 3 the final Status (exit code), 4 terminal resize, and v5's
  close signal; ``tty=1`` runs the command on a pseudo-terminal it takes as its controlling terminal.
  SPDY is refused with a message;
- ``GET /pods`` (the node's pods as the agent has them) and ``GET /healthz``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import pty
import socket
import ssl
import struct
import subprocess
import termios
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any, Protocol

from . import logs, runtime, websocket

log = logging.getLogger(__name__)
JSON = dict[str, Any]
EXEC_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")


class ContainerView(Protocol):
    """What the endpoint needs of a pod worker."""

    pod_dir: Path
    pod: JSON

    def instance(self, container: str) -> Any: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class TLSFiles:
    cert: Path
    key: Path
    client_ca: Path


class KubeletServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        *,
        node_name: str,
        address: tuple[str, int],
        tls: TLSFiles,
        find: Callable[[str, str], ContainerView | None],
        pods: Callable[[], list[JSON]],
    ) -> None:
        super().__init__(address, _Handler)
        self.node_name = node_name
        self.find = find
        self.pods = pods
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(tls.cert), str(tls.key))
        context.load_verify_locations(str(tls.client_ca))
        context.verify_mode = ssl.CERT_REQUIRED
        self.ssl_context = context

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The TLS handshake happens here, on the request's own thread, not in the accept loop.
        try:
            wrapped = self.ssl_context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as error:
            log.debug("kubelet endpoint: TLS handshake from %s failed: %s", client_address, error)
            return
        super().finish_request(wrapped, client_address)

    def start(self) -> threading.Thread:
        thread = threading.Thread(
            target=self.serve_forever, name=f"kubelet-api-{self.node_name}", daemon=True
        )
        thread.start()
        return thread


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: KubeletServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("kubelet endpoint: " + format, *args)

    def _send_text(self, status: int, text: str, *, content_type: str = "text/plain") -> None:
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
        if parts == ["healthz"]:
            self._send_text(200, "ok")
        elif parts == ["pods"]:
            self._send_text(
                200,
                json.dumps({"kind": "PodList", "apiVersion": "v1", "items": self.server.pods()}),
                content_type="application/json",
            )
        elif parts[0] == "containerLogs" and len(parts) == 4:
            self._container_logs(parts[1], parts[2], parts[3], query)
        elif parts[0] == "exec" and len(parts) in (4, 5):
            self._exec(parts[1], parts[2], parts[-1], query)
        else:
            self._send_text(404, f"404 page not found: {url.path}")

    do_POST = do_GET

    # ----------------------------------------------------------------------------------- logs
    def _container_logs(self, namespace: str, pod: str, container: str, query: dict[str, list[str]]) -> None:
        worker = self.server.find(namespace, pod)
        if worker is None:
            self._send_text(404, f'pod "{pod}" in namespace "{namespace}" not found on this node')
            return

        def flag(name: str) -> bool:
            return (query.get(name) or ["false"])[0].lower() in ("true", "1")

        def number(name: str) -> int | None:
            values = query.get(name) or [""]
            return int(values[0]) if values[0] else None

        try:
            path = logs.select(
                worker.pod_dir / container, previous=flag("previous"), pod=pod, container=container
            )
        except logs.LogNotFound as error:
            self._send_text(400, str(error))
            return

        def still_running() -> bool:
            instance = worker.instance(container)
            return instance is not None and instance.running.log_path == path

        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for chunk in logs.read(
                path,
                tail_lines=number("tailLines"),
                limit_bytes=number("limitBytes"),
                follow=flag("follow"),
                still_running=still_running,
            ):
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass
        self.close_connection = True

    # ----------------------------------------------------------------------------------- exec
    def _exec(self, namespace: str, pod: str, container: str, query: dict[str, list[str]]) -> None:
        if self.headers.get("Upgrade", "").lower() != "websocket":
            self._send_text(
                400,
                "the node agent serves exec over WebSocket (v5.channel.k8s.io) only, not SPDY; the apiserver "
                "forwards WebSockets to nodes that declare ExtendWebSocketsToKubelet",
            )
            return
        offered = [p.strip() for p in self.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        protocol = next((p for p in EXEC_PROTOCOLS if p in offered), None)
        if protocol is None:
            self._send_text(
                400, f"no supported exec subprotocol in {offered}; supported: {list(EXEC_PROTOCOLS)}"
            )
            return
        worker = self.server.find(namespace, pod)
        instance = worker.instance(container) if worker is not None else None
        if instance is None:
            self._send_text(400, f'container "{container}" in pod "{pod}" is not running')
            return
        self.send_response(101, "Switching Protocols")
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", websocket.accept_key(self.headers["Sec-WebSocket-Key"]))
        self.send_header("Sec-WebSocket-Protocol", protocol)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        _ExecSession(
            ws=websocket.WebSocket(self.connection),
            running=instance.running,
            argv=query.get("command") or [],
            stdin=_flag(query, "input", "stdin"),
            tty=_flag(query, "tty"),
            spec_dir=worker.pod_dir / "launch" if worker is not None else Path("/tmp"),
        ).run()


def _flag(query: dict[str, list[str]], *names: str) -> bool:
    """The apiserver passes exec options to kubelets as ``input=1&output=1&error=1&tty=1``."""
    return any((query.get(name) or [""])[0].lower() in ("1", "true") for name in names)


class _ExecSession:
    """One exec stream: the process's stdout/stderr (or its terminal) out, stdin and resizes in."""

    def __init__(
        self,
        *,
        ws: websocket.WebSocket,
        running: runtime.RunningContainer,
        argv: list[str],
        stdin: bool,
        tty: bool,
        spec_dir: Path,
    ) -> None:
        self.ws = ws
        self.running = running
        self.argv = argv
        self.stdin = stdin
        self.tty = tty
        self.spec_dir = spec_dir
        self._terminal: int | None = None  # the pty's master side, with tty

    def _status(self, code: int | None, message: str = "") -> bytes:
        if code == 0:
            status: JSON = {"metadata": {}, "status": "Success"}
        elif code is None:
            status = {"metadata": {}, "status": "Failure", "message": message, "reason": "InternalError"}
        else:
            status = {
                "metadata": {},
                "status": "Failure",
                "message": f"command terminated with non-zero exit code: exit status {code}",
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
            }
        return bytes([3]) + json.dumps(status).encode()

    def _send(self, channel: int, chunk: bytes) -> bool:
        try:
            self.ws.send_binary(bytes([channel]) + chunk)
            return True
        except (OSError, websocket.ConnectionClosed):
            return False

    def _pump(self, stream: IO[bytes], channel: int) -> None:
        while chunk := stream.read1(32 * 1024) if hasattr(stream, "read1") else stream.read(32 * 1024):
            if not self._send(channel, chunk):
                return

    def _pump_terminal(self, master: int) -> None:
        while True:
            try:
                chunk = os.read(master, 32 * 1024)
            except OSError:  # EIO: every process holding the terminal has exited
                return
            if not chunk or not self._send(1, chunk):
                return

    def run(self) -> None:
        process = dataclasses.replace(self.running.process, argv=tuple(self.argv))
        if self.tty:
            process = dataclasses.replace(
                process, env={**process.env, "TERM": process.env.get("TERM", "xterm")}
            )
        slave = -1
        try:
            if self.tty:
                self._terminal, slave = pty.openpty()
                popen = runtime.exec_in(
                    self.running,
                    process,
                    spec_dir=self.spec_dir,
                    stdin=slave,
                    stdout=slave,
                    stderr=slave,
                    tty=True,
                )
            else:
                popen = runtime.exec_in(
                    self.running,
                    process,
                    spec_dir=self.spec_dir,
                    stdin=subprocess.PIPE if self.stdin else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
        except runtime.StartFailed as error:
            self._finish(self._status(None, f"failed to exec in container: {error}"))
            return
        finally:
            if slave >= 0:
                os.close(slave)
        if self._terminal is not None:
            pumps = [threading.Thread(target=self._pump_terminal, args=(self._terminal,), daemon=True)]
        else:
            assert popen.stdout is not None and popen.stderr is not None
            pumps = [
                threading.Thread(target=self._pump, args=(popen.stdout, 1), daemon=True),
                threading.Thread(target=self._pump, args=(popen.stderr, 2), daemon=True),
            ]
        for pump in pumps:
            pump.start()
        threading.Thread(target=self._read_client, args=(popen,), daemon=True).start()
        code = popen.wait()
        for pump in pumps:
            pump.join(timeout=5)
        if self._terminal is not None:
            with contextlib.suppress(OSError):
                os.close(self._terminal)
        self._finish(self._status(code if code >= 0 else 128 - code))

    def _write_stdin(self, popen: subprocess.Popen[bytes], data: bytes) -> None:
        if self._terminal is not None:
            os.write(self._terminal, data)
        elif popen.stdin is not None and not popen.stdin.closed:
            popen.stdin.write(data)
            popen.stdin.flush()

    def _resize(self, data: bytes) -> None:
        if self._terminal is None:
            return
        size = json.loads(data)
        winsize = struct.pack("HHHH", int(size.get("Height", 24)), int(size.get("Width", 80)), 0, 0)
        fcntl.ioctl(self._terminal, termios.TIOCSWINSZ, winsize)

    def _read_client(self, popen: subprocess.Popen[bytes]) -> None:
        try:
            while True:
                message = self.ws.receive()
                if not message:
                    continue
                if message[0] == 255 and len(message) == 2 and message[1] == 0:
                    if popen.stdin is not None:
                        popen.stdin.close()
                elif message[0] == 0:
                    self._write_stdin(popen, message[1:])
                elif message[0] == 4:
                    self._resize(message[1:])
        except (OSError, ValueError, websocket.ConnectionClosed):
            if popen.stdin is not None and not popen.stdin.closed:
                with contextlib.suppress(OSError):
                    popen.stdin.close()

    def _finish(self, status: bytes) -> None:
        with contextlib.suppress(OSError, websocket.ConnectionClosed):
            self.ws.send_binary(status)
        self.ws.close()
        with contextlib.suppress(OSError):
            self.ws.sock.shutdown(socket.SHUT_RDWR)
