"""Events as the kubelet records them: source ``kubelet`` on the node, repeats counted, sent off-thread.

Owns core/v1 Events for pods (``involvedObject`` with the container's ``fieldPath``) and nodes. A repeat of
the same (object, fieldPath, type, reason, message) PATCHes ``count`` and ``lastTimestamp`` of the first
event, as client-go's correlator does for identical events. Sending happens on one background thread per
recorder, so a pod worker never waits on the apiserver to say what it did; a failed send is logged and
dropped (events are best effort in the kubelet too).
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from typing import Any

from . import kube

log = logging.getLogger(__name__)
JSON = dict[str, Any]

NORMAL, WARNING = "Normal", "Warning"
_MAX_CORRELATED = 4096


class EventRecorder:
    def __init__(self, client: kube.KubeClient, *, node_name: str) -> None:
        self.client = client
        self.node_name = node_name
        self._queue: queue.Queue[tuple[JSON, str | None, str, str, str] | None] = queue.Queue()
        self._seen: dict[tuple[str, str, str, str, str], tuple[str, str, int]] = {}
        self._thread = threading.Thread(target=self._run, name=f"events-{node_name}", daemon=True)
        self._thread.start()

    def pod_event(
        self, pod: JSON, *, kind: str, reason: str, message: str, container: str | None = None
    ) -> None:
        field_path = None
        if container is not None:
            init_names = {c["name"] for c in pod["spec"].get("initContainers") or []}
            field_path = (
                f"spec.{'initContainers' if container in init_names else 'containers'}{{{container}}}"
            )
        metadata = pod["metadata"]
        involved = {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": metadata["namespace"],
            "name": metadata["name"],
            "uid": metadata["uid"],
        }
        self._queue.put((involved, field_path, kind, reason, message))

    def node_event(self, *, kind: str, reason: str, message: str) -> None:
        involved = {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": self.node_name}
        self._queue.put((involved, None, kind, reason, message))

    def flush(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) until queued events are sent."""
        done = threading.Event()
        self._queue.put(({"__flush__": done}, None, "", "", ""))
        done.wait(timeout_s)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            involved, field_path, kind, reason, message = item
            if "__flush__" in involved:
                involved["__flush__"].set()
                continue
            try:
                self._send(involved, field_path, kind, reason, message)
            except Exception as error:  # best effort, like the kubelet's recorder
                log.debug("event %s %s dropped: %s", reason, involved.get("name"), error)

    def _send(self, involved: JSON, field_path: str | None, kind: str, reason: str, message: str) -> None:
        namespace = involved.get("namespace") or "default"
        key = (str(involved["uid"]), field_path or "", kind, reason, message)
        now = kube.now_rfc3339()
        if key in self._seen:
            name, event_namespace, count = self._seen[key]
            self._seen[key] = (name, event_namespace, count + 1)
            try:
                self.client.merge_patch(
                    f"/api/v1/namespaces/{event_namespace}/events/{name}",
                    {"count": count + 1, "lastTimestamp": now},
                )
                return
            except kube.ApiError as error:
                if error.status != 404:
                    raise
        if field_path:
            involved = {**involved, "fieldPath": field_path}
        name = f"{involved['name']}.{uuid.uuid4().hex[:16]}"
        self.client.create(
            f"/api/v1/namespaces/{namespace}/events",
            {
                "metadata": {"name": name, "namespace": namespace},
                "involvedObject": involved,
                "reason": reason,
                "message": message,
                "type": kind,
                "source": {"component": "kubelet", "host": self.node_name},
                "reportingComponent": "kubelet",
                "reportingInstance": self.node_name,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            },
        )
        if len(self._seen) >= _MAX_CORRELATED:  # bounded memory; a repeat after this starts a new event
            self._seen.clear()
        self._seen[key] = (name, namespace, 1)
