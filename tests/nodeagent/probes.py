"""Startup, readiness and liveness probes of one running container, on one thread.

Owns the kubelet's prober semantics: exec (a command inside the container, by the runtime's join mode),
httpGet (from the node's network to the pod IP, named ports resolved, 200-399 is success) and tcpSocket;
``initialDelaySeconds``, ``periodSeconds``, ``timeoutSeconds``, ``successThreshold``,
``failureThreshold``; readiness and liveness wait until the startup probe succeeded. It reports only
*changes* to its pod worker through ``post``: ``("started",)``, ``("ready", bool)``,
``("unhealthy", kind, output)`` for every failed attempt (the Unhealthy event), and
``("kill", kind, output)`` when liveness or startup gives up. The worker decides what a kill means.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

JSON = dict[str, Any]
ExecRunner = Callable[[list[str], float], tuple[int | None, str]]
Post = Callable[[tuple[Any, ...]], None]
_MAX_OUTPUT = 1024


def _port(value: Any, container: JSON) -> int:
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return int(value)
    for port in container.get("ports") or []:
        if port.get("name") == value:
            return int(port["containerPort"])
    raise ValueError(f"named port {value!r} not found in the container's ports")


def run_handler(
    handler: JSON, *, container: JSON, pod_ip: str, timeout_s: float, run_exec: ExecRunner
) -> tuple[bool, str]:
    """Run one probe or lifecycle handler: (success, output or failure message)."""
    if "exec" in handler:
        code, output = run_exec(list(handler["exec"].get("command") or []), timeout_s)
        if code is None:
            return False, f"command timed out: {output}"
        return code == 0, output.strip()[:_MAX_OUTPUT]
    if "httpGet" in handler:
        return _http_get(handler["httpGet"], container=container, pod_ip=pod_ip, timeout_s=timeout_s)
    if "tcpSocket" in handler:
        spec = handler["tcpSocket"]
        host = spec.get("host") or pod_ip
        try:
            port = _port(spec["port"], container)
            with socket.create_connection((host, port), timeout=timeout_s):
                return True, ""
        except (OSError, ValueError) as error:
            return False, f"dial tcp {host}:{spec['port']}: {error}"
    if "sleep" in handler:
        time.sleep(min(float(handler["sleep"]["seconds"]), timeout_s))
        return True, ""
    if "grpc" in handler:
        return False, "grpc probes are not supported by the node agent"
    return False, f"unknown handler {sorted(handler)}"


def _http_get(spec: JSON, *, container: JSON, pod_ip: str, timeout_s: float) -> tuple[bool, str]:
    host = spec.get("host") or pod_ip
    path = spec.get("path") or "/"
    scheme = str(spec.get("scheme") or "HTTP").upper()
    try:
        port = _port(spec["port"], container)
    except ValueError as error:
        return False, str(error)
    url = f"{scheme.lower()}://{host}:{port}{path}"
    connection: http.client.HTTPConnection
    if scheme == "HTTPS":
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # the kubelet does not verify probe certificates either
        connection = http.client.HTTPSConnection(host, port, timeout=timeout_s, context=context)
    else:
        connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    headers = {"User-Agent": "kube-probe/1.37", "Accept": "*/*"}
    headers.update({h["name"]: h["value"] for h in spec.get("httpHeaders") or []})
    try:
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        body = response.read(_MAX_OUTPUT).decode(errors="replace")
    except (OSError, http.client.HTTPException) as error:
        return False, f'Get "{url}": {error}'
    finally:
        connection.close()
    if 200 <= response.status < 400:
        return True, body
    return False, f"HTTP probe failed with statuscode: {response.status}"


class _Probe:
    def __init__(self, kind: str, spec: JSON, start: float) -> None:
        self.kind = kind
        self.spec = spec
        self.period_s = float(spec.get("periodSeconds") or 10)
        self.timeout_s = float(spec.get("timeoutSeconds") or 1)
        self.success_threshold = int(spec.get("successThreshold") or 1)
        self.failure_threshold = int(spec.get("failureThreshold") or 3)
        self.due = start + float(spec.get("initialDelaySeconds") or 0)
        self.successes = 0
        self.failures = 0


class ProbeRunner(threading.Thread):
    """Runs one container instance's probes until :meth:`stop` or a kill verdict."""

    def __init__(self, *, container: JSON, pod_ip: str, run_exec: ExecRunner, post: Post, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.container = container
        self.pod_ip = pod_ip
        self.run_exec = run_exec
        self.post = post
        self._stop_event = threading.Event()

    @staticmethod
    def needed(container: JSON) -> bool:
        return any(container.get(k) for k in ("startupProbe", "readinessProbe", "livenessProbe"))

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        start = time.monotonic()
        startup = (
            _Probe("Startup", self.container["startupProbe"], start)
            if self.container.get("startupProbe")
            else None
        )
        others = [
            _Probe(kind, self.container[key], start)
            for kind, key in (("Readiness", "readinessProbe"), ("Liveness", "livenessProbe"))
            if self.container.get(key)
        ]
        ready: bool | None = None
        while not self._stop_event.is_set():
            active = [startup] if startup is not None else others
            if not active:
                return
            probe = min(active, key=lambda p: p.due)
            if self._stop_event.wait(max(0.0, probe.due - time.monotonic())):
                return
            ok, output = run_handler(
                probe.spec,
                container=self.container,
                pod_ip=self.pod_ip,
                timeout_s=probe.timeout_s,
                run_exec=self.run_exec,
            )
            if self._stop_event.is_set():
                return
            probe.due = time.monotonic() + probe.period_s
            if ok:
                probe.successes, probe.failures = probe.successes + 1, 0
            else:
                probe.successes, probe.failures = 0, probe.failures + 1
                self.post(("unhealthy", probe.kind, output))
            if probe is startup:
                if probe.successes >= 1:
                    startup = None
                    self.post(("started",))
                    now = time.monotonic()
                    for other in others:
                        other.due = max(other.due, now)
                elif probe.failures >= probe.failure_threshold:
                    self.post(("kill", probe.kind, output))
                    return
            elif probe.kind == "Readiness":
                if probe.successes >= probe.success_threshold and ready is not True:
                    ready = True
                    self.post(("ready", True))
                elif probe.failures >= probe.failure_threshold and ready is not False:
                    ready = False
                    self.post(("ready", False))
            elif probe.failures >= probe.failure_threshold:
                self.post(("kill", probe.kind, output))
                return
