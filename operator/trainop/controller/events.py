"""Kubernetes Events on owners (`kubectl describe` shows them): one per phase transition and new problem.

Posted with the core/v1 Event API, before the status write that records the transition, under a name
derived from the owner's uid and the transition (``state_machine.Event.key``): a reconcile repeated after a
crash posts the same names again and gets 409s, so each transition is announced exactly once. An
apiserver that cannot take an Event right now (5xx, 429 Too Many Requests, a broken connection) fails the
reconcile, which is retried: the Event goes before the status write that records its transition, so
dropping it would lose it for good. An Event the apiserver refuses for good (403, 422) is logged and
dropped and never fails a reconcile (the same facts are on the owner's status conditions). This
module must not decide which Events to post; ``state_machine`` does.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from trainop.controller import kinds, kube, observe, state_machine

COMPONENT = "trainop-operator"
REPORTING_CONTROLLER = "trainop.dev/operator"

log = logging.getLogger(__name__)


def name(owner: Mapping[str, Any], event: state_machine.Event) -> str:
    """A name unique to (owner incarnation, event key): posting the same Event twice is a harmless 409."""
    digest = hashlib.sha256(f"{owner['metadata']['uid']}/{event.key or event.message}".encode()).hexdigest()
    return f"{owner['metadata']['name']}.{digest[:16]}"


def build(owner: Mapping[str, Any], event: state_machine.Event, *, now: str) -> dict[str, Any]:
    meta = owner["metadata"]
    instance = os.environ.get("HOSTNAME") or socket.gethostname()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name(owner, event), "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": owner.get("apiVersion", kinds.TRAINING_JOB.api_version),
            "kind": owner["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "type": event.type,
        "reason": event.reason,
        "message": event.message[: observe.MAX_MESSAGE],
        "source": {"component": COMPONENT},
        "reportingComponent": REPORTING_CONTROLLER,
        "reportingInstance": instance[:128],
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


async def post(
    client: kube.Kube, owner: Mapping[str, Any], events: Sequence[state_machine.Event], *, now: str
) -> None:
    for event in events:
        try:
            await client.create(kube.EVENTS, owner["metadata"]["namespace"], build(owner, event, now=now))
        except kube.ApiError as error:
            if error.status == 409:  # posted before a crash; the reconcile is being repeated
                continue
            if error.status >= 500 or error.status == 429:  # not now: the reconcile is retried
                raise
            if kube.namespace_terminating(error):  # the owner goes with its namespace
                continue
            log.warning("could not post Event %s on %s: %s", event.reason, owner["metadata"]["name"], error)
