"""The apiserver's audit log, read as proof of *who* wrote a status field (local cluster only).

A merge patch's ``managedFields`` entry names the field manager (``trainop-trainer``), which any client can
claim. The audit log records the authenticated user of every request, so a scenario can show that
``status.progress`` was written by ``system:serviceaccount:<ns>:<job>-trainer`` — the job's own
ServiceAccount, through the RBAC the operator created — and the operator's writes by the chart's
ServiceAccount. The policy logs only the requests the scenarios look at (status writes to our resources,
RayJob creation), at ``Metadata`` level, to keep the log small.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [
        {
            "level": "Metadata",
            "verbs": ["patch", "update"],
            "resources": [
                {"group": "trainop.dev", "resources": ["trainingjobs/status", "tuningsweeps/status"]}
            ],
        },
        {
            "level": "Metadata",
            "verbs": ["create"],
            "resources": [{"group": "ray.io", "resources": ["rayjobs"]}],
        },
        {"level": "None"},
    ],
}


@dataclasses.dataclass(frozen=True)
class Entry:
    user: str
    verb: str
    resource: str  # "trainingjobs/status", "rayjobs"
    namespace: str
    name: str
    code: int
    user_agent: str
    time: str


class AuditLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self) -> list[Entry]:
        if not self.path.is_file():
            return []
        found = []
        for line in self.path.read_text().splitlines():
            if not line.strip():
                continue
            event = json.loads(line)
            ref = event.get("objectRef") or {}
            resource = str(ref.get("resource", ""))
            if ref.get("subresource"):
                resource += "/" + str(ref["subresource"])
            found.append(
                Entry(
                    user=str((event.get("user") or {}).get("username", "")),
                    verb=str(event.get("verb", "")),
                    resource=resource,
                    namespace=str(ref.get("namespace", "")),
                    name=str(ref.get("name", "")),
                    code=int((event.get("responseStatus") or {}).get("code", 0)),
                    user_agent=str(event.get("userAgent", "")),
                    time=str(event.get("stageTimestamp", "")),
                )
            )
        return found

    def writers(self, *, namespace: str, resource: str, name: str) -> dict[str, int]:
        """Successful writes (patch/update, HTTP 2xx) of one object's ``resource``, counted per user."""
        counts: dict[str, int] = {}
        for entry in self.entries():
            if (
                entry.namespace == namespace
                and entry.resource == resource
                and entry.name == name
                and entry.verb in ("patch", "update")
                and 200 <= entry.code < 300
            ):
                counts[entry.user] = counts.get(entry.user, 0) + 1
        return counts

    def creators(self, *, namespace: str, resource: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for entry in self.entries():
            if (
                entry.namespace == namespace
                and entry.resource == resource
                and entry.verb == "create"
                and 200 <= entry.code < 300
            ):
                counts[entry.user] = counts.get(entry.user, 0) + 1
        return counts
