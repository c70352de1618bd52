"""Helpers of the agent's integration tests: pods in a namespace, waits, logs, events."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from . import harness

JSON = dict[str, Any]
T = TypeVar("T")

BUSYBOX = "docker.io/library/busybox:1.36"
#: Images the tests use: busybox-like (host binaries, root, no entrypoint) and one with a root USER.
IMAGES: dict[str, dict[str, Any]] = {
    "docker.io/library/busybox": {"cmd": ["sh"]},
    "registry.test/root-user": {"user": "0", "cmd": ["true"]},
}


def wait_for(
    what: str, probe: Callable[[], T | None], *, timeout_s: float = 90, interval_s: float = 0.2
) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}; last seen: {last!r}")


def process_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a killed child its parent has not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class Namespace:
    def __init__(self, bed: harness.AgentHarness, name: str) -> None:
        assert bed.plane is not None
        self.bed = bed
        self.plane = bed.plane
        self.name = name

    def request(self, method: str, path: str, body: JSON | None = None) -> tuple[int, JSON]:
        data = json.dumps(body).encode() if body is not None else None
        return self.plane.request(method, path, body=data)

    def path(self, resource: str) -> str:
        return f"/api/v1/namespaces/{self.name}/{resource}"

    def exists(self, resource: str) -> bool:
        return self.request("GET", self.path(resource))[0] == 200

    def create(self, resource: str, body: JSON) -> JSON:
        status, created = self.request("POST", self.path(resource), body)
        assert status == 201, created
        return created

    def pod(self, name: str, *, containers: list[JSON], node: str = "node-a", **spec: Any) -> JSON:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": spec.pop("labels", {"app": name})},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 5, "containers": containers, **spec},
        }
        return self.create("pods", body)

    def get_pod(self, name: str) -> JSON:
        status, pod = self.request("GET", self.path(f"pods/{name}"))
        assert status == 200, pod
        return pod

    def pod_gone(self, name: str) -> bool:
        return self.request("GET", self.path(f"pods/{name}"))[0] == 404

    def phase(self, name: str) -> str:
        return str(self.get_pod(name).get("status", {}).get("phase", ""))

    def wait_phase(self, name: str, *phases: str, timeout_s: float = 90) -> JSON:
        return wait_for(
            f"pod {name} in phase {phases}",
            lambda: pod if (pod := self.get_pod(name)).get("status", {}).get("phase") in phases else None,
            timeout_s=timeout_s,
        )

    def container_status(self, name: str, container: str, *, init: bool = False) -> JSON:
        key = "initContainerStatuses" if init else "containerStatuses"
        for status in self.get_pod(name).get("status", {}).get(key) or []:
            if status["name"] == container:
                return dict(status)
        return {}

    def wait_container(self, name: str, container: str, check: Callable[[JSON], bool], what: str) -> JSON:
        return wait_for(
            f"{what} ({name}/{container})",
            lambda: status if (status := self.container_status(name, container)) and check(status) else None,
        )

    def condition(self, name: str, kind: str) -> str:
        for condition in self.get_pod(name).get("status", {}).get("conditions") or []:
            if condition["type"] == kind:
                return str(condition["status"])
        return ""

    def logs(self, name: str, *args: str, timeout_s: float = 60) -> str:
        return self.plane.kubectl("logs", "-n", self.name, name, *args, timeout_s=timeout_s).stdout

    def events(self, name: str) -> list[JSON]:
        status, listed = self.request(
            "GET", self.path("events") + f"?fieldSelector=involvedObject.name%3D{name}"
        )
        assert status == 200, listed
        return list(listed["items"])

    def wait_events(self, name: str, reasons: set[str]) -> list[JSON]:
        """The pod's events once all of ``reasons`` are there (the agent sends them off its pod thread,
        so they may trail the status they explain)."""

        def complete() -> list[JSON] | None:
            events = self.events(name)
            return events if reasons <= {event["reason"] for event in events} else None

        return wait_for(f"events {sorted(reasons)} of {name}", complete, timeout_s=30)

    def delete(self, resource: str, grace_s: int | None = None) -> None:
        body = {"gracePeriodSeconds": grace_s} if grace_s is not None else None
        status, answer = self.request("DELETE", self.path(resource), body)
        assert status in (200, 202), answer
