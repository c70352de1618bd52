"""``kubectl trainop checkpoints NAME``: the checkpoints on the job's claim, and setting newer ones aside.

The checkpoints are directories ``<claim>/<run>/checkpoints/step_<N>/`` with a ``manifest.json`` (step,
epoch, time, metrics, every file's size), written by the trainer (``trainop_trainer.checkpoint``). They are
read where the claim is mounted: in the Ray head of the running attempt (``kubectl exec``), or, when no
Ray pod of the job runs (suspended, finished, between attempts), in a short-lived pod of the job's image
that mounts the claim (``claim_pod``), created, read through its log and deleted again. The scripts run
there are standard-library Python (``LIST_SCRIPT``, ``SET_ASIDE_SCRIPT``), so any trainer image serves.

``set_aside(step)`` is what ``restart --from-step`` needs: the checkpoints after that step are renamed
``step_<N>.set-aside-<stamp>`` (kept, never deleted: the trainer's lookup and keep-last pruning only
see ``step_<N>``), so the next attempt resumes from the newest checkpoint at or before it. It runs only in
a claim pod, while no trainer runs.

When neither way is open (no pod can be started, or the user may not create pods) the newest checkpoint
the trainer recorded in the status is shown, with the reason the claim could not be read.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

from trainop.api import trainer_config
from trainop.controller import kinds, rayjob
from trainop.plugin import kubectl as kubectl_module
from trainop.plugin import target as target_module

CLAIM_POD_CONTAINER = "claim"
CLAIM_POD_LABEL = "trainop.dev/claim-of"
CLAIM_POD_MANAGER = "trainop-kubectl"
CLAIM_POD_DEADLINE_SECONDS = 300
SET_ASIDE_SUFFIX = ".set-aside-"

# Both scripts know the trainer's layout (trainop_trainer.checkpoint_store) without importing it: a
# directory step_<N> is a checkpoint once it is committed, that is DCP's ".metadata" is there (format 2)
# or its manifest says format 1 (format 1 wrote the manifest last).
# tests/trainer/test_plugin_checkpoint_format.py runs them on checkpoints the trainer's Checkpointer wrote.
_COMMITTED = r"""
def committed(path):
    if os.path.isfile(os.path.join(path, ".metadata")):
        return True
    try:
        with open(os.path.join(path, "manifest.json")) as file:
            return json.load(file).get("format") == 1
    except (OSError, ValueError):
        return False
"""

# argv[1]: the run's checkpoints directory. Prints one JSON list: every step_<N> (and set-aside or corrupt
# directory) with what its manifest says and its size in bytes (every file but the manifest).
LIST_SCRIPT = (
    r"""
import json, os, re, sys
"""
    + _COMMITTED
    + r"""
root = sys.argv[1]
out = []
names = sorted(os.listdir(root)) if os.path.isdir(root) else []
for name in names:
    match = re.match(r"^step_(\d+)(.*)$", name)
    path = os.path.join(root, name)
    if not match or not os.path.isdir(path):
        continue
    state = match.group(2).lstrip(".").split("-")[0] or "ok"
    row = {"dir": name, "step": int(match.group(1)), "state": state}
    row["bytes"] = sum(
        os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs if f != "manifest.json"
    )
    try:
        with open(os.path.join(path, "manifest.json")) as file:
            manifest = json.load(file)
        row.update(epoch=manifest.get("epoch"), time=manifest.get("time"))
        row["metrics"] = manifest.get("metrics", {})
    except (OSError, ValueError):
        manifest = None
    if row["state"] == "ok" and not committed(path):
        row["state"] = "incomplete" if manifest is not None else "no-manifest"
    out.append(row)
print(json.dumps(out))
"""
)

# argv[1]: the checkpoints directory, argv[2]: the step to resume from, argv[3]: a stamp. Renames every
# step_<N> with N > step; fails (exit 3) when no committed checkpoint at or before the step exists.
SET_ASIDE_SCRIPT = (
    r"""
import json, os, re, sys
"""
    + _COMMITTED
    + r"""
root, keep, stamp = sys.argv[1], int(sys.argv[2]), sys.argv[3]
steps = {}
for name in os.listdir(root) if os.path.isdir(root) else []:
    match = re.match(r"^step_(\d+)$", name)
    if match:
        steps[int(match.group(1))] = name
usable = [s for s in steps if s <= keep and committed(os.path.join(root, steps[s]))]
if not usable:
    print(json.dumps({"error": "no complete checkpoint at or before step %d" % keep, "steps": sorted(steps)}))
    sys.exit(3)
moved = []
for step in sorted(s for s in steps if s > keep):
    os.rename(os.path.join(root, steps[step]), os.path.join(root, steps[step] + ".set-aside-" + stamp))
    moved.append(step)
print(json.dumps({"resume": max(usable), "setAside": moved}))
"""
)


class ClaimUnreadable(target_module.TargetError):
    pass


@dataclasses.dataclass(frozen=True)
class Row:
    dir: str
    step: int
    state: str  # ok | corrupt | set | incomplete | no-manifest
    epoch: int | None = None
    time: str | None = None
    bytes: int | None = None
    loss: float | None = None


def checkpoints_dir(target: target_module.Target) -> str:
    """Where the run's checkpoints are in a pod that mounts the claim (TrainingJobs)."""
    run = trainer_config.run_name_for(target.name)
    return f"{trainer_config.CHECKPOINT_MOUNT_PATH}/{run}/checkpoints"


def parse(output: str) -> list[Row]:
    rows = []
    for item in json.loads(output.strip().splitlines()[-1]):
        metrics = item.get("metrics") or {}
        rows.append(
            Row(
                dir=str(item["dir"]),
                step=int(item["step"]),
                state=str(item.get("state", "ok")),
                epoch=item.get("epoch"),
                time=item.get("time"),
                bytes=item.get("bytes"),
                loss=metrics.get("loss"),
            )
        )
    return sorted(rows, key=lambda r: (r.step, r.dir))


def table(rows: list[Row]) -> str:
    header = f"{'STEP':>8}  {'EPOCH':>5}  {'TIME':<20}  {'SIZE':>10}  {'LOSS':>10}  DIRECTORY"
    lines = [header]
    newest = max((r.step for r in rows if r.state == "ok"), default=None)
    for row in rows:
        size = _human(row.bytes) if row.bytes is not None else "?"
        loss = f"{row.loss:.4g}" if row.loss is not None else ""
        note = "" if row.state == "ok" else f"  ({_STATES.get(row.state, row.state)})"
        if row.state == "ok" and row.step == newest:
            note = "  (newest: the next attempt resumes here)"
        lines.append(
            f"{row.step:>8}  {'' if row.epoch is None else row.epoch:>5}  {row.time or '':<20}  {size:>10}  "
            f"{loss:>10}  {row.dir}{note}"
        )
    return "\n".join(lines)


_STATES = {
    "corrupt": "corrupt: set aside by the trainer",
    "set": "set aside by restart --from-step",
    "incomplete": "incomplete: an interrupted write (no DCP metadata)",
    "no-manifest": "incomplete: no manifest",
}


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def claim_pod(target: target_module.Target, command: list[str], *, write: bool) -> dict[str, Any]:
    """A short-lived pod of the job's image with its checkpoint claim mounted (read-only unless ``write``),
    hardened like the Ray pods (Pod Security ``restricted``), owned by the job so that it goes with it."""
    resource = kinds.parse(target.body)
    spec = kinds.training_spec(resource)
    claim = kinds.claim_name(resource)
    # The Ray head's pod and container security contexts: the same uid (the files are the trainer's).
    head = rayjob.pod_template(resource, max(target.attempt, 1), head=True)["spec"]
    security = copy.deepcopy(head["securityContext"])
    container_security = copy.deepcopy(head["containers"][0]["securityContext"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{target.name}-claim-",
            "labels": {kinds.LABEL_MANAGED_BY: CLAIM_POD_MANAGER, CLAIM_POD_LABEL: target.name},
            "ownerReferences": [
                {
                    "apiVersion": target.kind.api_version,
                    "kind": target.kind.kind,
                    "name": target.name,
                    "uid": target.body["metadata"]["uid"],
                }
            ],
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": CLAIM_POD_DEADLINE_SECONDS,
            "automountServiceAccountToken": False,
            "securityContext": security,
            "containers": [
                {
                    "name": CLAIM_POD_CONTAINER,
                    "image": spec.image,
                    "command": command,
                    "resources": {
                        "requests": {"cpu": "50m", "memory": "128Mi"},
                        "limits": {"memory": "256Mi"},
                    },
                    "volumeMounts": [
                        {
                            "name": rayjob.VOLUME_CHECKPOINTS,
                            "mountPath": trainer_config.CHECKPOINT_MOUNT_PATH,
                            "readOnly": not write,
                        }
                    ],
                    "securityContext": container_security,
                }
            ],
            "volumes": [
                {
                    "name": rayjob.VOLUME_CHECKPOINTS,
                    "persistentVolumeClaim": {"claimName": claim, "readOnly": not write},
                }
            ],
        },
    }


def run_in_claim_pod(
    client: kubectl_module.Kubectl,
    target: target_module.Target,
    command: list[str],
    *,
    write: bool,
    timeout_s: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Create the claim pod, wait for it to end, return its output, delete it (always)."""
    created = client.create(claim_pod(target, command, write=write))
    name = created["metadata"]["name"]
    try:
        deadline = clock() + timeout_s
        phase = ""
        while clock() < deadline:
            pod = client.get("pod", name)
            phase = ((pod or {}).get("status") or {}).get("phase", "")
            if phase in ("Succeeded", "Failed"):
                break
            sleep(1.0)
        else:
            claim = kinds.claim_name(kinds.parse(target.body))
            raise ClaimUnreadable(
                f"pod {name}, which mounts claim {claim}, did not finish within {timeout_s:.0f} s (phase "
                f"{phase or 'Pending'}): the cluster may have no room for it, or the claim is attached "
                "elsewhere"
            )
        output = client.logs(name, CLAIM_POD_CONTAINER)
        if phase == "Failed":
            raise ClaimUnreadable(f"pod {name} failed on the claim: {output.strip()[-500:]}")
        return output
    finally:
        client.delete("pod", name)


def read(
    client: kubectl_module.Kubectl,
    target: target_module.Target,
    *,
    timeout_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[list[Row], str]:
    """The checkpoints on the claim, and where they were read (a pod's name)."""
    command = ["python", "-c", LIST_SCRIPT, checkpoints_dir(target)]
    for pod in target_module.ray_pods(client, target, node_type="head"):
        if target_module.running(pod, rayjob.HEAD_CONTAINER):
            name = pod["metadata"]["name"]
            return parse(client.exec(name, rayjob.HEAD_CONTAINER, command)), f"Ray head {name}"
    if target_module.ray_pods(client, target):
        raise ClaimUnreadable(
            f"the Ray pods of attempt {target.attempt} are starting and hold the claim; try again once they "
            "run"
        )
    output = run_in_claim_pod(client, target, command, write=False, timeout_s=timeout_s, sleep=sleep)
    return parse(output), "a short-lived pod on the claim"


def set_aside(
    client: kubectl_module.Kubectl,
    target: target_module.Target,
    *,
    step: int,
    stamp: str,
    timeout_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Rename the checkpoints after ``step`` (no trainer may run); returns ``{"resume": S, "setAside":
    [N, ...]}``."""
    command = ["python", "-c", SET_ASIDE_SCRIPT, checkpoints_dir(target), str(step), stamp]
    try:
        output = run_in_claim_pod(client, target, command, write=True, timeout_s=timeout_s, sleep=sleep)
    except ClaimUnreadable as error:
        raise ClaimUnreadable(f"cannot set the checkpoints after step {step} aside: {error}") from None
    return parse_set_aside(output)


def parse_set_aside(output: str) -> dict[str, Any]:
    """``SET_ASIDE_SCRIPT``'s answer: ``{"resume": S, "setAside": [N, ...]}``."""
    result: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return result


def from_status(target: target_module.Target) -> list[Row]:
    """The newest checkpoint as the trainer recorded it in the status (all there is without the claim)."""
    checkpoint = target.status.get("checkpoint")
    if not checkpoint:
        return []
    path = str(checkpoint.get("path", ""))
    return [
        Row(
            dir=path.rsplit("/", 1)[-1],
            step=int(checkpoint["step"]),
            state="ok",
            epoch=checkpoint.get("epoch"),
            time=checkpoint.get("time"),
            loss=(checkpoint.get("metrics") or {}).get("loss"),
        )
    ]
