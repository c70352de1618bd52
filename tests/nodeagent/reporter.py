"""A pod's status as the agent reports it: built from its container records, PATCHed when it changed.

Owns the status body (phase, conditions with carried-over transition times, IPs, startTime, container
statuses) and the write: a strategic merge patch of ``pods/status`` with the pod's uid as precondition,
``podIPs`` replaced rather than merged (a new sandbox has a new IP), skipped when nothing changed. It
decides nothing about containers; the pod worker tells it what they are.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from typing import Any

from . import kube
from . import status as status_module

log = logging.getLogger(__name__)
JSON = dict[str, Any]


class Outcome(enum.Enum):
    SENT = "sent"
    UNCHANGED = "unchanged"
    #: The pod is gone (404) or is another pod of the same name (409 on the uid precondition).
    GONE = "gone"
    #: The apiserver refused or could not be reached: try again later.
    RETRY = "retry"


class StatusReporter:
    def __init__(
        self, *, client: kube.KubeClient, pod: JSON, start_time: str, conditions: dict[str, JSON]
    ) -> None:
        self.client = client
        metadata = pod["metadata"]
        self.path = f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}/status"
        self.uid = str(metadata["uid"])
        self.start_time = start_time
        self._conditions = conditions
        self._last: JSON | None = None

    def body(
        self,
        pod: JSON,
        *,
        init: Sequence[status_module.ContainerRecord],
        app: Sequence[status_module.ContainerRecord],
        phase: str,
        node_ip: str,
        sandbox_ready: bool,
        pod_ip: str,
    ) -> JSON:
        spec = pod["spec"]
        conditions = status_module.pod_conditions(
            phase=phase,
            sandbox_ready=sandbox_ready,
            init=init,
            app=app,
            readiness_gates=[gate["conditionType"] for gate in spec.get("readinessGates") or []],
            existing=(pod.get("status") or {}).get("conditions") or [],
        )
        conditions = status_module.with_transition_times(conditions, self._conditions, kube.now_rfc3339())
        self._conditions = {condition["type"]: condition for condition in conditions}
        body: JSON = {
            "phase": phase,
            "conditions": conditions,
            "hostIP": node_ip,
            "hostIPs": [{"ip": node_ip}],
            "startTime": self.start_time,
            "containerStatuses": [record.to_status() for record in app],
        }
        if init:
            body["initContainerStatuses"] = [record.to_status() for record in init]
        if pod_ip:
            body["podIP"] = pod_ip
            body["podIPs"] = [{"ip": pod_ip}]
        return body

    def push(
        self,
        pod: JSON,
        *,
        init: Sequence[status_module.ContainerRecord],
        app: Sequence[status_module.ContainerRecord],
        phase: str,
        node_ip: str,
        sandbox_ready: bool,
        pod_ip: str,
    ) -> Outcome:
        body = self.body(
            pod, init=init, app=app, phase=phase, node_ip=node_ip, sandbox_ready=sandbox_ready, pod_ip=pod_ip
        )
        if body == self._last:
            return Outcome.UNCHANGED
        patch = dict(body)
        if "podIPs" in patch:
            patch["podIPs"] = [{"$patch": "replace"}, *patch["podIPs"]]
        try:
            self.client.strategic_patch(self.path, {"metadata": {"uid": self.uid}, "status": patch})
        except kube.ApiError as error:
            if error.status in (404, 409):
                return Outcome.GONE
            log.warning("status %s: %s", self.path, error)
            return Outcome.RETRY
        except OSError as error:  # connection refused while the apiserver restarts
            log.warning("status %s: %s", self.path, error)
            return Outcome.RETRY
        self._last = body
        return Outcome.SENT
