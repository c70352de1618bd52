"""`kubectl trainop` verbs that need running Ray pods, against recorded API objects.

The control plane has no kubelet, so the live paths of `logs` and `checkpoints` and `restart --from-step`
(a pod that reads or edits the claim) cannot run there; tests/operator/integration/test_kubectl_plugin.py
covers everything up to that point. Here the cluster is a stand-in that answers with recorded objects:
the TrainingJob as the operator's tests build it, and its Ray head pod as KubeRay creates it from the
operator's own pod template (our labels plus KubeRay's ``ray.io/node-type``, a generated name, a status).
The stand-in records every kubectl call, and the tests assert on the calls and on what the user sees.
The two claim scripts run for real on checkpoint directories (tests/trainer/test_plugin_checkpoint_format.py
writes them with the trainer's own manifest code).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import operator_factories as factories
import pytest

from trainop.controller import kinds, rayjob
from trainop.plugin import checkpoints, kubectl, lifecycle, logs
from trainop.plugin import target as target_module

NAMESPACE = "team-a"


def head_pod(*, phase: str = "Running", follower_running: bool = True, attempt: int = 1) -> dict[str, Any]:
    """The head pod KubeRay makes of the operator's template for attempt ``attempt``."""
    resource = kinds.parse(factories.job(namespace=NAMESPACE))
    template = rayjob.pod_template(resource, attempt, head=True)
    state = {"running": {"startedAt": "2026-03-01T11:00:00Z"}} if follower_running else {"waiting": {}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"mlp-a{attempt}-raycluster-x7k2p-head-4fgq9",
            "namespace": NAMESPACE,
            "labels": {**template["metadata"]["labels"], "ray.io/node-type": "head", "ray.io/cluster": "c"},
        },
        "spec": template["spec"],
        "status": {
            "phase": phase,
            "containerStatuses": [
                {"name": "ray-head", "state": {"running": {}} if phase == "Running" else {"waiting": {}}},
                {"name": "trainer-log", "state": state},
            ],
        },
    }


class Cluster(kubectl.Kubectl):
    """A kubectl that answers from recorded objects and records what it was asked."""

    def __init__(self, job: dict[str, Any], pods: list[dict[str, Any]] | None = None) -> None:
        super().__init__(namespace=NAMESPACE, binary="kubectl")
        self.job = job
        self.pods = pods or []
        self.calls: list[tuple[Any, ...]] = []
        self.log_text = ""
        self.exec_output = ""
        self.claim_pod_phases = ["Pending", "Running", "Succeeded"]
        self.claim_pod_output = ""

    def get(self, resource: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get", resource, name))
        if resource == "pod":
            return {"metadata": {"name": name}, "status": {"phase": self.claim_pod_phases.pop(0)}}
        return (
            copy.deepcopy(self.job)
            if name == self.job["metadata"]["name"] and "trainingjob" in resource
            else None
        )

    def list(self, resource: str, *, selector: str) -> list[dict[str, Any]]:
        self.calls.append(("list", resource, selector))
        wanted = dict(part.split("=") for part in selector.split(","))
        return [p for p in self.pods if all(p["metadata"]["labels"].get(k) == v for k, v in wanted.items())]

    def merge_patch(self, resource: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("patch", resource, name, patch))
        self.job["spec"].update(patch["spec"])
        suspend = patch["spec"]["suspend"]
        # What the operator answers (tests/operator/integration test it): Suspended, or a new attempt.
        status = self.job.setdefault("status", {})
        if suspend:
            status["phase"] = "Suspended"
            self.pods = []
        else:
            status["phase"], status["attempt"] = "Pending", status.get("attempt", 1) + 1
        return copy.deepcopy(self.job)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", obj))
        return {**obj, "metadata": {**obj["metadata"], "name": "mlp-claim-abcde"}}

    def delete(self, resource: str, name: str) -> None:
        self.calls.append(("delete", resource, name))

    def logs(self, pod: str, container: str, *, tail: int | None = None) -> str:
        self.calls.append(("logs", pod, container, tail))
        return self.claim_pod_output if pod.startswith("mlp-claim-") else self.log_text

    def follow_logs(self, pod: str, container: str, *, tail: int | None = None) -> Iterator[str]:
        self.calls.append(("follow", pod, container, tail))
        yield from (line + "\n" for line in self.log_text.splitlines())

    def exec(self, pod: str, container: str, command: Sequence[str]) -> str:
        self.calls.append(("exec", pod, container, list(command)))
        return self.exec_output


def job(phase: str = "Running", attempt: int = 1) -> dict[str, Any]:
    return factories.job(namespace=NAMESPACE, status={"phase": phase, "attempt": attempt})


def resolve(cluster: Cluster) -> target_module.Target:
    return target_module.resolve(cluster, "mlp")


DRIVER_LOG = "\n".join(
    [
        "2026-03-01 11:00:01,000 driver trainop_trainer.ray_train INFO: starting",
        "(RayTrainWorker pid=41, ip=10.0.0.5) 11:00:09,000 rank1 trainop_trainer.runtime INFO: step 10",
        "(RayTrainWorker pid=52, ip=10.0.0.6) 11:00:09,000 rank10 trainop_trainer.runtime INFO: step 10",
        "(RayTrainWorker pid=41, ip=10.0.0.5) a user print without a rank",
    ]
)


# ------------------------------------------------------------------------------------------------ logs
def test_logs_read_the_log_follower_of_the_current_attempts_head() -> None:
    cluster = Cluster(job(), [head_pod(), head_pod(attempt=2)])
    cluster.log_text = DRIVER_LOG
    lines = list(logs.show(cluster, resolve(cluster), rank=None, follow=False, tail=50))
    assert "".join(lines) == DRIVER_LOG + "\n"
    assert (
        "list",
        "pods",
        "trainop.dev/job=mlp,trainop.dev/attempt=1,ray.io/node-type=head",
    ) in cluster.calls
    assert cluster.calls[-1] == ("logs", "mlp-a1-raycluster-x7k2p-head-4fgq9", "trainer-log", 50)


def test_logs_of_one_rank_keep_that_ranks_lines_only_and_rank1_is_not_rank10() -> None:
    cluster = Cluster(job(), [head_pod()])
    cluster.log_text = DRIVER_LOG
    lines = list(logs.show(cluster, resolve(cluster), rank=1, follow=True, tail=None))
    assert lines == [DRIVER_LOG.splitlines()[1] + "\n"]
    assert cluster.calls[-1][0] == "follow"


@pytest.mark.parametrize(
    ("phase", "pods", "expected"),
    [
        ("Suspended", [], "is Suspended: the Ray cluster of attempt 1 is gone, and its log with it"),
        ("Succeeded", [], "is Succeeded: the Ray cluster of attempt 1 is gone"),
        ("Provisioning", [], "the Ray head of attempt 1 does not exist yet"),
        ("Provisioning", [head_pod(phase="Pending", follower_running=False)], "is Pending, its log follower"),
    ],
)
def test_without_a_running_log_follower_logs_say_why(
    phase: str, pods: list[dict[str, Any]], expected: str
) -> None:
    cluster = Cluster(job(phase), pods)
    with pytest.raises(logs.NoLog, match=expected):
        list(logs.show(cluster, resolve(cluster), rank=None, follow=False, tail=None))


# ----------------------------------------------------------------------------------------- checkpoints
LISTED = json.dumps(
    [
        {
            "dir": "step_100",
            "step": 100,
            "state": "ok",
            "epoch": 1,
            "time": "2026-03-01T11:59:00Z",
            "bytes": 3 << 20,
            "metrics": {"loss": 0.52},
        },
        {
            "dir": "step_200",
            "step": 200,
            "state": "ok",
            "epoch": 2,
            "time": "2026-03-01T12:09:00Z",
            "bytes": 3 << 20,
            "metrics": {"loss": 0.31},
        },
        {"dir": "step_150.corrupt", "step": 150, "state": "corrupt", "bytes": 1024},
    ]
)


def test_checkpoints_of_a_running_job_are_read_inside_its_ray_head() -> None:
    cluster = Cluster(job(), [head_pod()])
    cluster.exec_output = LISTED + "\n"
    rows, where = checkpoints.read(cluster, resolve(cluster), timeout_s=5)
    assert where == "Ray head mlp-a1-raycluster-x7k2p-head-4fgq9"
    assert cluster.calls[-1] == (
        "exec",
        "mlp-a1-raycluster-x7k2p-head-4fgq9",
        "ray-head",
        ["python", "-c", checkpoints.LIST_SCRIPT, "/checkpoints/mlp/checkpoints"],
    )
    text = checkpoints.table(rows).splitlines()
    assert [line.split()[0] for line in text[1:]] == ["100", "150", "200"]
    assert text[3].endswith("step_200  (newest: the next attempt resumes here)")
    assert "3.0 MiB" in text[3] and "0.31" in text[3]
    assert text[2].endswith("(corrupt: set aside by the trainer)")


def test_checkpoints_of_a_suspended_job_are_read_by_a_short_lived_read_only_pod_on_its_claim() -> None:
    cluster = Cluster(job("Suspended"))
    cluster.claim_pod_output = LISTED + "\n"
    rows, where = checkpoints.read(cluster, resolve(cluster), timeout_s=30, sleep=lambda _: None)
    assert where == "a short-lived pod on the claim" and len(rows) == 3
    (created,) = [c[1] for c in cluster.calls if c[0] == "create"]
    spec = created["spec"]
    (container,) = spec["containers"]
    assert container["command"] == ["python", "-c", checkpoints.LIST_SCRIPT, "/checkpoints/mlp/checkpoints"]
    assert container["image"] == "ghcr.io/trainop/trainer:0.1.0"
    assert container["volumeMounts"] == [
        {"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": True}
    ]
    assert spec["volumes"] == [
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "mlp-ckpt", "readOnly": True}}
    ]
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 1000
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert created["metadata"]["ownerReferences"][0]["uid"] == factories.job()["metadata"]["uid"]
    assert cluster.calls[-1] == ("delete", "pod", "mlp-claim-abcde")  # never left behind


def test_a_claim_pod_that_never_runs_is_deleted_and_reported_in_one_sentence() -> None:
    cluster = Cluster(job("Suspended"))
    cluster.claim_pod_phases = ["Pending"] * 100
    clock = iter(range(0, 1000, 10))
    with pytest.raises(checkpoints.ClaimUnreadable, match=r"did not finish within 30 s \(phase Pending\)"):
        checkpoints.run_in_claim_pod(
            cluster,
            resolve(cluster),
            ["true"],
            write=False,
            timeout_s=30,
            sleep=lambda _: None,
            clock=lambda: float(next(clock)),
        )
    assert cluster.calls[-1] == ("delete", "pod", "mlp-claim-abcde")


# ---------------------------------------------------------------------------------------------- restart
def test_restart_from_a_step_suspends_sets_newer_checkpoints_aside_on_the_claim_and_resumes() -> None:
    cluster = Cluster(job("Running"), [head_pod()])
    cluster.claim_pod_output = json.dumps({"resume": 100, "setAside": [200]}) + "\n"
    said: list[str] = []
    done = lifecycle.restart(
        cluster, resolve(cluster), from_step=150, timeout_s=30, say=said.append, sleep=lambda _: None
    )
    assert (done.phase, done.attempt) == ("Pending", 2)
    kinds_of_calls = [c[0] for c in cluster.calls]
    patch_on, create, patch_off = (
        kinds_of_calls.index(k, i) for k, i in (("patch", 0), ("create", 0), ("patch", 2))
    )
    assert patch_on < create < patch_off  # the claim is edited only while suspended
    assert cluster.calls[patch_on][3] == {"spec": {"suspend": True}}
    assert cluster.calls[patch_off][3] == {"spec": {"suspend": False}}
    created = cluster.calls[create][1]
    (container,) = created["spec"]["containers"]
    assert container["command"][:4] == [
        "python",
        "-c",
        checkpoints.SET_ASIDE_SCRIPT,
        "/checkpoints/mlp/checkpoints",
    ]
    assert container["command"][4] == "150"
    assert container["volumeMounts"][0]["readOnly"] is False
    assert said[1].startswith("checkpoints after step 150 set aside") and said[1].endswith(
        "resumes from step 100"
    )


# ------------------------------------------------------------------------------------ the claim scripts
def run_script(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60)


def test_set_aside_refuses_a_step_before_every_checkpoint_and_touches_nothing(tmp_path: Any) -> None:
    for step in (100, 200):
        (tmp_path / f"step_{step}").mkdir()
        (tmp_path / f"step_{step}" / "manifest.json").write_text("{}")
    result = run_script(checkpoints.SET_ASIDE_SCRIPT, str(tmp_path), "50", "X")
    assert result.returncode == 3
    assert json.loads(result.stdout)["error"] == "no complete checkpoint at or before step 50"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_100", "step_200"]


def test_list_of_a_run_without_checkpoints_is_empty(tmp_path: Any) -> None:
    result = run_script(checkpoints.LIST_SCRIPT, str(tmp_path / "missing"))
    assert result.returncode == 0 and checkpoints.parse(result.stdout) == []


def test_kubectl_errors_carry_kubectls_last_line_and_not_found_is_its_own_kind() -> None:
    error = kubectl._error('Error from server (NotFound): trainingjobs.trainop.dev "x" not found\n', 1)
    assert isinstance(error, kubectl.NotFound)
    forbidden = kubectl._error(
        'W1126 warning\nError from server (Forbidden): pods "p" is forbidden: User "u" cannot create pods\n',
        1,
    )
    assert type(forbidden) is kubectl.KubectlError and forbidden.message.startswith(
        "Error from server (Forbidden)"
    )
