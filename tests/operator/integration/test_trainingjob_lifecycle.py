"""A TrainingJob's life against the real apiserver: children, phases, the trainer's own status writes,
restarts from the same run, and failure after maxRestarts. KubeRay's part is played by its stand-in."""

from __future__ import annotations

import json
from typing import Any

import operator_factories as factories
import pytest
import yaml
from cluster_api import Api, ApiError, contains, user_claim, wait_for

from tests.controlplane import cluster
from trainop.api import trainer_config
from trainop.controller import children, kinds

pytestmark = pytest.mark.controlplane


def job(api: Api, namespace: str, name: str = "mlp") -> dict[str, Any]:
    body = api.get(api.job(namespace, name))
    assert body is not None
    return body


def phase_of(api: Api, namespace: str, name: str = "mlp") -> Any:
    return lambda: job(api, namespace, name).get("status") or {}


def wait_phase(
    api: Api, namespace: str, phase: str, name: str = "mlp", timeout_s: float = 20
) -> dict[str, Any]:
    return wait_for(
        phase_of(api, namespace, name),
        lambda s: s.get("phase") == phase,
        timeout_s=timeout_s,
        what=f"phase {phase}",
    )


def ray_job_names(api: Api, namespace: str, owner: str = "mlp") -> list[str]:
    return sorted(
        r["metadata"]["name"]
        for r in api.list(api.ray_jobs(namespace), f"trainop.dev/job={owner}")
        if not r["metadata"].get("deletionTimestamp")
    )


def test_applying_a_job_creates_its_children_and_a_rayjob_the_kuberay_schema_stores_unpruned(
    operator: Any, api: Api, apply: Any, namespace: str
) -> None:
    apply(factories.manifest("mlp", namespace))

    ray_job = wait_for(
        lambda: api.get(api.ray_jobs(namespace, "mlp-a1")), lambda r: r is not None, what="RayJob"
    )
    owner = job(api, namespace)
    desired = {m["kind"]: m for m in children.desired_children(kinds.parse(owner), 1)}
    # KubeRay's CRD schema prunes unknown fields silently: a stored RayJob that still holds every field
    # we sent proves the schema accepted all of them (and the operator created it with Strict validation).
    assert contains(ray_job, desired["RayJob"])
    stored = {
        "PersistentVolumeClaim": api.get(api.core(namespace, "persistentvolumeclaims", "mlp-ckpt")),
        "ConfigMap": api.get(api.core(namespace, "configmaps", "mlp-trainer")),
        "ServiceAccount": api.get(api.core(namespace, "serviceaccounts", "mlp-trainer")),
        "Role": api.get(api.rbac(namespace, "roles", "mlp-trainer")),
        "RoleBinding": api.get(api.rbac(namespace, "rolebindings", "mlp-trainer")),
    }
    for kind, obj in stored.items():
        assert obj is not None, kind
        assert contains(obj, desired[kind]), kind
    uid = owner["metadata"]["uid"]
    for obj in [ray_job, *(o for k, o in stored.items() if k != "PersistentVolumeClaim")]:
        assert [r["uid"] for r in obj["metadata"]["ownerReferences"]] == [uid]
    assert "ownerReferences" not in stored["PersistentVolumeClaim"]["metadata"]  # type: ignore[index]
    status = wait_phase(api, namespace, "Pending")
    assert status["children"] == {
        "rayJob": "mlp-a1",
        "configMap": "mlp-trainer",
        "persistentVolumeClaim": "mlp-ckpt",
        "serviceAccount": "mlp-trainer",
    }


def test_kubectl_get_shows_phase_workers_and_gpus(
    operator: Any, api: Api, apply: Any, kuberay: Any, namespace: str, control_plane: cluster.ControlPlane
) -> None:
    apply(factories.manifest("mlp", namespace, spec={"workers": {"replicas": 3}}))
    wait_for(lambda: api.get(api.ray_jobs(namespace, "mlp-a1")), lambda r: r is not None, what="RayJob")
    kuberay.initialize(namespace, "mlp-a1")
    wait_phase(api, namespace, "Provisioning")
    out = control_plane.kubectl("get", "trainingjobs", "-n", namespace).stdout.splitlines()
    assert out[0].split()[:7] == ["NAME", "PHASE", "WORKERS", "GPUS", "STEP", "CHECKPOINT", "RESTARTS"]
    assert out[1].split()[:4] == ["mlp", "Provisioning", "3", "0"]


def test_a_running_rayjob_makes_the_job_running_and_the_trainers_own_token_may_patch_only_its_status(
    operator: Any, api: Api, apply: Any, kuberay: Any, namespace: str, control_plane: cluster.ControlPlane
) -> None:
    apply(factories.manifest("mlp", namespace))
    apply(factories.manifest("other", namespace))
    wait_for(lambda: api.get(api.ray_jobs(namespace, "mlp-a1")), lambda r: r is not None, what="RayJob")
    kuberay.run(namespace, "mlp-a1")
    status = wait_phase(api, namespace, "Running")
    running = {c["type"]: c for c in status["conditions"]}["Running"]
    assert (running["status"], running["reason"]) == ("True", "Running")

    # What the trainer's rank 0 does, with the token Kubernetes mounts into its pods.
    token = control_plane.service_account_token(namespace, "mlp-trainer", create=False)
    as_trainer = control_plane.kubeconfig_for_token(token, namespace=namespace)
    trainer_patch = {
        "status": {
            "progress": {"step": 120, "totalSteps": 1000, "loss": 0.5, "updated": "2026-03-01T12:00:00Z"},
            "checkpoint": {
                "step": 100,
                "path": "/checkpoints/mlp/checkpoint_000001",
                "time": "2026-03-01T11:59:00Z",
            },
        }
    }
    control_plane.kubectl(
        "patch",
        "trainingjob",
        "mlp",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(trainer_patch),
        kubeconfig_path=as_trainer,
    )
    # The operator writes its own fields afterwards; the trainer's must survive that.
    kuberay.succeed(namespace, "mlp-a1")
    status = wait_phase(api, namespace, "Succeeded")
    assert status["progress"]["step"] == 120 and status["checkpoint"]["step"] == 100
    row = control_plane.kubectl("get", "trainingjob", "mlp", "-n", namespace, "--no-headers").stdout.split()
    assert row[1:6] == ["Succeeded", "2", "0", "120", "100"]

    denied = [
        (
            "patch",
            "trainingjob",
            "other",
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(trainer_patch),
        ),
        ("patch", "trainingjob", "mlp", "--type=merge", "-p", '{"spec": {"suspend": true}}'),
        ("get", "secrets"),
        ("get", "trainingjob", "other"),
    ]
    for args in denied:
        result = control_plane.kubectl(*args, kubeconfig_path=as_trainer, check=False)
        assert result.returncode != 0 and "forbidden" in result.stderr.lower(), (args, result.stderr)


def test_a_failed_rayjob_restarts_as_a_new_attempt_of_the_same_run_until_max_restarts_then_fails(
    operator: Any, api: Api, apply: Any, kuberay: Any, namespace: str
) -> None:
    apply(factories.manifest("mlp", namespace))  # maxRestarts 2, backoff 1s (doubling, max 2s)
    for attempt in (1, 2, 3):
        name = f"mlp-a{attempt}"
        wait_for(lambda n=name: api.get(api.ray_jobs(namespace, n)), lambda r: r is not None, what=name)
        config = wait_for(
            lambda: api.get(api.core(namespace, "configmaps", "mlp-trainer")),
            lambda c, a=attempt: (
                c is not None and c["metadata"]["annotations"]["trainop.dev/attempt"] == str(a)
            ),
            what=f"config of attempt {attempt}",
        )
        trainer = json.loads(config["data"][trainer_config.CONFIG_KEY])
        assert (trainer["runName"], trainer["storagePath"], trainer["attempt"]) == (
            "mlp",
            "/checkpoints",
            attempt,
        )
        assert ray_job_names(api, namespace) == [name]  # the previous attempt's RayJob is gone
        kuberay.run(namespace, name)
        wait_phase(api, namespace, "Running")
        kuberay.fail(namespace, name, message=f"worker died in attempt {attempt}")
        if attempt < 3:
            status = wait_phase(api, namespace, "Restarting")
            assert status["nextRestartTime"]

    status = wait_phase(api, namespace, "Failed")
    assert (status["attempt"], status["restarts"]) == (3, 2)
    # No trainer record and no pod fact (no pods here): the class is Unknown, KubeRay's words its message.
    assert [(f["attempt"], f["reason"], f["message"]) for f in status["failures"]] == [
        (a, "Unknown", f"AppFailed: worker died in attempt {a}") for a in (1, 2, 3)
    ]
    failed = {c["type"]: c for c in status["conditions"]}["Failed"]
    assert (failed["status"], failed["reason"]) == ("True", "Unknown")
    assert "worker died in attempt 3" in failed["message"] and "maxRestarts=2" in failed["message"]
    assert ray_job_names(api, namespace) == ["mlp-a3"]  # the last attempt stays as the record
    events = api.list(f"/api/v1/namespaces/{namespace}/events")
    reasons = [
        e["reason"]
        for e in sorted(events, key=lambda e: e["metadata"]["creationTimestamp"])
        if e["involvedObject"]["name"] == "mlp"
    ]
    assert reasons.count("Restarting") == 2 and reasons.count("Failed") == 1


def test_the_failed_attempts_rayjob_is_deleted_while_restarting(
    operator: Any, api: Api, apply: Any, kuberay: Any, namespace: str
) -> None:
    apply(
        factories.manifest(
            "mlp", namespace, spec={"failurePolicy": {"backoffSeconds": 30, "maxBackoffSeconds": 30}}
        )
    )
    wait_for(lambda: api.get(api.ray_jobs(namespace, "mlp-a1")), lambda r: r is not None, what="RayJob")
    kuberay.run(namespace, "mlp-a1")
    kuberay.fail(namespace, "mlp-a1")
    wait_phase(api, namespace, "Restarting")
    wait_for(
        lambda: ray_job_names(api, namespace), lambda names: names == [], what="no RayJob while backing off"
    )
    with pytest.raises(ApiError):
        api.request("GET", api.ray_jobs(namespace, "mlp-a2"))


EXAMPLES = sorted((cluster.REPO_ROOT / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_reconciles_into_a_rayjob_the_kuberay_schema_stores_unpruned(
    operator: Any, api: Api, namespace: str, control_plane: cluster.ControlPlane, path: Any
) -> None:
    owner = yaml.safe_load(path.read_text())
    existing = kinds.existing_claim_of(owner)
    if existing:  # the example's data lives on a claim of the user's, which must exist before any pod
        api.create(api.core(namespace, "persistentvolumeclaims"), user_claim(existing))
    control_plane.kubectl("apply", "-n", namespace, "-f", str(path))
    kind = kinds.BY_KIND[owner["kind"]]
    name = kind.ray_job_name(owner["metadata"]["name"], 1)
    ray_job = wait_for(lambda: api.get(api.ray_jobs(namespace, name)), lambda r: r is not None, what=name)
    stored_owner = api.get(api.job(namespace, owner["metadata"]["name"], plural=kind.plural))
    assert stored_owner is not None
    desired = children.desired_children(kinds.parse(stored_owner), 1)[-1]
    assert contains(ray_job, desired)


def test_a_rayjob_kuberay_refuses_fails_the_job_at_once_as_invalidspec(
    operator: Any, api: Api, apply: Any, kuberay: Any, namespace: str
) -> None:
    apply(factories.manifest("mlp", namespace))
    wait_for(lambda: api.get(api.ray_jobs(namespace, "mlp-a1")), lambda r: r is not None, what="RayJob")
    kuberay.reject(
        namespace, "mlp-a1", "The RayJob spec is invalid: headGroupSpec should have at least one container"
    )
    status = wait_phase(api, namespace, "Failed")
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Failed"]["reason"] == "InvalidSpec"
    assert "the invalidSpec budget (0) is used up: fix the spec" in conditions["Failed"]["message"]
    assert conditions["RayClusterReady"]["reason"] == "RayJobValidationFailed"
    assert "headGroupSpec should have at least one container" in conditions["RayClusterReady"]["message"]
    # No point retrying a refused spec: recorded as the failure of attempt 1, no restart.
    assert status["restarts"] == 0
    assert [(f["attempt"], f["reason"]) for f in status["failures"]] == [(1, "InvalidSpec")]
