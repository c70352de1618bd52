"""``kubectl trainop logs NAME [--rank N] [-f]``: the job's log, through the pods' log subresource.

The whole job's log is the Ray job driver's: Ray forwards every rank's output to it. The operator gives the
Ray head a log follower container (``rayjob.LOG_CONTAINER``) that prints that file, so this is
``kubectl logs <head of the current attempt> -c trainer-log [-f]``. ``--rank N`` keeps the lines the
trainer logged for rank N (its log format carries ``rank<N>``); the other lines of that rank (a user
function's prints) are not tagged, so without ``--rank`` nothing is left out.

The Ray cluster of an attempt is deleted when the attempt ends (KubeRay's ``shutdownAfterJobFinishes``),
and with it the log: a finished or suspended job has none to show, and the verb says so, with where the
job stands.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from trainop.controller import rayjob
from trainop.plugin import kubectl as kubectl_module
from trainop.plugin import target as target_module


class NoLog(target_module.TargetError):
    pass


def rank_filter(lines: Iterable[str], rank: int | None) -> Iterator[str]:
    """The lines of one rank (``rank<N>`` as a word: rank1 is not rank10), or every line."""
    if rank is None:
        yield from lines
        return
    tag = re.compile(rf"\brank{rank}\b")
    yield from (line for line in lines if tag.search(line))


def head_pod(target: target_module.Target, pods: list[dict[str, Any]]) -> dict[str, Any]:
    """The head pod of the current attempt whose log follower runs, or NoLog saying why there is none."""
    if not pods:
        if target.phase in ("Succeeded", "Failed", "Suspended", "Restarting"):
            raise NoLog(
                f"{target.describe()} is {target.phase}: the Ray cluster of attempt {target.attempt} is "
                "gone, and its log with it (kubectl trainop status shows the outcome)"
            )
        raise NoLog(
            f"{target.describe()} is {target.phase}: the Ray head of attempt {target.attempt} does not exist "
            "yet; try again once it runs"
        )
    for pod in pods:
        if target_module.running(pod, rayjob.LOG_CONTAINER):
            return pod
    phase = (pods[0].get("status") or {}).get("phase", "Pending")
    raise NoLog(
        f"the Ray head {pods[0]['metadata']['name']} of {target.describe()} is {phase}, its log follower "
        f"{rayjob.LOG_CONTAINER} is not running yet; try again in a moment"
    )


def show(
    client: kubectl_module.Kubectl,
    target: target_module.Target,
    *,
    rank: int | None,
    follow: bool,
    tail: int | None,
) -> Iterator[str]:
    """The log lines to print (a generator: with ``follow`` it ends when the attempt's head does)."""
    pod = head_pod(target, target_module.ray_pods(client, target, node_type="head"))
    name = pod["metadata"]["name"]
    if follow:
        yield from rank_filter(client.follow_logs(name, rayjob.LOG_CONTAINER, tail=tail), rank)
    else:
        text = client.logs(name, rayjob.LOG_CONTAINER, tail=tail)
        yield from rank_filter((line + "\n" for line in text.splitlines()), rank)
