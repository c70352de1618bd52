"""The pure child builders (``children``, ``rayjob``): names, ownership, RBAC scope, pod hardening, config."""

from __future__ import annotations

import json
from typing import Any

import operator_factories as factories
import pytest

from trainop.api import manifest, nccl, trainer_config, trainingjob
from trainop.controller import children, kinds, rayjob

UID = "0f0e0d0c-0000-4000-8000-000000000001"


def resource(body: dict[str, Any]) -> manifest.Resource:
    return kinds.parse(body)


def by_kind(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {m["kind"]: m for m in manifests}
    assert len(out) == len(manifests), "one child per kind"
    return out


def pods(ray_job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    cluster = ray_job["spec"]["rayClusterSpec"]
    (workers,) = cluster["workerGroupSpecs"]
    return {"head": cluster["headGroupSpec"]["template"], "worker": workers["template"]}


def job_children(spec: dict[str, Any] | None = None, attempt: int = 1) -> dict[str, dict[str, Any]]:
    return by_kind(children.desired_children(resource(factories.job(spec=spec)), attempt))


# ----------------------------------------------------------------------------------------- names
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            factories.job("mlp"),
            [
                ("PersistentVolumeClaim", "mlp-ckpt"),
                ("ConfigMap", "mlp-trainer"),
                ("ServiceAccount", "mlp-trainer"),
                ("Role", "mlp-trainer"),
                ("RoleBinding", "mlp-trainer"),
                ("RayJob", "mlp-a3"),
            ],
        ),
        (
            factories.sweep("mlp"),
            [
                ("PersistentVolumeClaim", "mlp-sweep-ckpt"),
                ("ConfigMap", "mlp-sweep"),
                ("ServiceAccount", "mlp-sweep"),
                ("Role", "mlp-sweep"),
                ("RoleBinding", "mlp-sweep"),
                ("RayJob", "mlp-s3"),
            ],
        ),
    ],
    ids=["trainingjob", "tuningsweep-of-the-same-name"],
)
def test_children_have_deterministic_names_in_creation_order_and_never_collide_across_kinds(
    body: dict[str, Any], expected: list[tuple[str, str]]
) -> None:
    built = children.desired_children(resource(body), 3)
    assert [(m["kind"], m["metadata"]["name"]) for m in built] == expected
    assert {m["metadata"]["namespace"] for m in built} == {"team-a"}


def test_the_longest_job_name_keeps_the_rayjob_name_within_kuberays_limit() -> None:
    name = "j" * 40
    built = by_kind(children.desired_children(resource(factories.job(name)), 9999))
    assert len(built["RayJob"]["metadata"]["name"]) <= 47


def test_building_twice_gives_the_same_manifests() -> None:
    assert children.desired_children(resource(factories.job()), 2) == children.desired_children(
        resource(factories.job()), 2
    )


def test_without_include_ray_job_only_the_supporting_children_are_built() -> None:
    built = children.desired_children(resource(factories.job()), 1, include_ray_job=False)
    assert "RayJob" not in [m["kind"] for m in built]


@pytest.mark.parametrize(("owner", "name", "attempt"), [("mlp", "mlp-a7", 7), ("mlp", "mlp-a12", 12)])
def test_the_attempt_is_read_back_from_a_rayjob_name(owner: str, name: str, attempt: int) -> None:
    assert kinds.TRAINING_JOB.attempt_of(owner, name) == attempt


@pytest.mark.parametrize("name", ["mlp-x-a1", "other-a1", "mlp-a", "mlp-ab"])
def test_names_that_are_not_an_attempt_of_the_owner_are_not_taken_for_one(name: str) -> None:
    assert kinds.TRAINING_JOB.attempt_of("mlp", name) is None


# ------------------------------------------------------------------------------ labels + ownership
@pytest.mark.parametrize(
    "kind", ["PersistentVolumeClaim", "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "RayJob"]
)
def test_every_child_carries_the_selector_labels(kind: str) -> None:
    labels = job_children()[kind]["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "trainop"
    assert labels["trainop.dev/job"] == "mlp"


@pytest.mark.parametrize("kind", ["ConfigMap", "ServiceAccount", "Role", "RoleBinding", "RayJob"])
def test_children_are_owned_by_the_job_with_a_controller_reference(kind: str) -> None:
    assert job_children()[kind]["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "trainop.dev/v1alpha1",
            "kind": "TrainingJob",
            "name": "mlp",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def test_the_checkpoint_claim_is_not_owned_by_default_so_checkpoints_outlive_the_job() -> None:
    claim = job_children()["PersistentVolumeClaim"]
    assert "ownerReferences" not in claim["metadata"]
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}


def test_delete_with_job_makes_the_claim_owned_by_the_job() -> None:
    claim = job_children({"checkpoint": {"storage": {"deleteWithJob": True}}})["PersistentVolumeClaim"]
    assert [ref["uid"] for ref in claim["metadata"]["ownerReferences"]] == [UID]


def test_storage_class_and_access_mode_reach_the_claim() -> None:
    storage = {"storageClassName": "fast-rwx", "accessMode": "ReadWriteMany", "size": "500Gi"}
    claim = job_children({"checkpoint": {"storage": storage}})["PersistentVolumeClaim"]
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "500Gi"}},
        "storageClassName": "fast-rwx",
    }


def test_an_existing_claim_is_mounted_and_no_claim_is_created() -> None:
    built = job_children({"checkpoint": {"storage": {"existingClaim": "team-ckpt"}}})
    assert "PersistentVolumeClaim" not in built
    for template in pods(built["RayJob"]).values():
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "team-ckpt"}


def test_a_job_without_a_uid_cannot_own_children() -> None:
    with pytest.raises(ValueError, match="no uid"):
        children.desired_children(resource(factories.job(uid=None)), 1)


# ---------------------------------------------------------------------------------------------- RBAC
@pytest.mark.parametrize(
    ("body", "plural", "account"),
    [
        (factories.job("mlp"), "trainingjobs", "mlp-trainer"),
        (factories.sweep("mlp"), "tuningsweeps", "mlp-sweep"),
    ],
    ids=["trainingjob", "tuningsweep"],
)
def test_the_trainer_may_only_get_and_patch_its_own_owners_status_and_create_events(
    body: dict[str, Any], plural: str, account: str
) -> None:
    built = by_kind(children.desired_children(resource(body), 1))
    assert built["Role"]["rules"] == [
        {
            "apiGroups": ["trainop.dev"],
            "resources": [f"{plural}/status"],
            "resourceNames": ["mlp"],
            "verbs": ["get", "patch"],
        },
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]
    assert built["RoleBinding"]["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": built["Role"]["metadata"]["name"],
    }
    assert built["RoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": "team-a"}
    ]
    assert built["ServiceAccount"]["metadata"]["name"] == account
    for template in pods(built["RayJob"]).values():
        assert template["spec"]["serviceAccountName"] == account
        assert template["spec"]["automountServiceAccountToken"] is True


# -------------------------------------------------------------------------------------- trainer config
@pytest.mark.parametrize("attempt", [1, 2, 9])
def test_the_trainer_config_resumes_the_same_run_from_the_same_storage_path_on_every_attempt(
    attempt: int, tmp_path: Any
) -> None:
    configmap = job_children(attempt=attempt)["ConfigMap"]
    assert configmap["metadata"]["annotations"] == {"trainop.dev/attempt": str(attempt)}
    path = tmp_path / "trainer.json"
    path.write_text(configmap["data"][trainer_config.CONFIG_KEY])
    config = trainer_config.load(path)
    assert config.run_name == "mlp"
    assert config.storage_path == trainer_config.CHECKPOINT_MOUNT_PATH
    assert config.attempt == attempt
    assert config.status_target == trainer_config.StatusTarget(
        plural="trainingjobs", namespace="team-a", name="mlp"
    )
    assert config.spec == resource(factories.job()).spec


def test_the_sweep_driver_config_carries_the_whole_sweep_spec_and_its_status_target(tmp_path: Any) -> None:
    body = factories.sweep("lr")
    configmap = by_kind(children.desired_children(resource(body), 2))["ConfigMap"]
    path = tmp_path / "trainer.json"
    path.write_text(configmap["data"]["trainer.json"])
    config = trainer_config.load_sweep(path)
    assert (config.sweep_name, config.experiment_name, config.attempt) == ("lr", "lr", 2)
    assert config.storage_path == trainer_config.CHECKPOINT_MOUNT_PATH
    assert config.spec == resource(body).spec
    assert config.status_target == trainer_config.StatusTarget(
        plural="tuningsweeps", namespace="team-a", name="lr"
    )


# -------------------------------------------------------------------------------------------- RayJob
def test_the_rayjob_runs_the_packaged_trainer_once_and_leaves_restarts_to_trainop() -> None:
    ray_job = job_children(attempt=4)["RayJob"]
    assert ray_job["apiVersion"] == "ray.io/v1"
    assert ray_job["metadata"]["labels"]["trainop.dev/attempt"] == "4"
    spec = ray_job["spec"]
    assert spec["entrypoint"] == "python -m trainop_trainer --config /etc/trainop/trainer.json"
    assert spec["backoffLimit"] == 0
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["submissionMode"] == "HTTPMode"  # no submitter pod outside our security context
    assert spec["rayClusterSpec"]["rayVersion"] == "2.60.0"
    assert spec["rayClusterSpec"]["enableInTreeAutoscaling"] is False


def test_the_sweep_rayjob_runs_the_sweep_driver_with_workers_for_all_concurrent_trials() -> None:
    body = factories.sweep(spec={"maxConcurrentTrials": 3, "template": {"workers": {"replicas": 2}}})
    ray_job = by_kind(children.desired_children(resource(body), 1))["RayJob"]
    assert (
        ray_job["spec"]["entrypoint"] == "python -m trainop_trainer.sweep --config /etc/trainop/trainer.json"
    )
    (group,) = ray_job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (6, 6, 6)
    assert ray_job["metadata"]["labels"]["trainop.dev/sweep"] == "lr"


def test_the_worker_group_has_the_requested_replicas_and_resources_including_gpus() -> None:
    spec = {
        "precision": "bf16",
        "workers": {"replicas": 4, "gpusPerWorker": 8, "cpusPerWorker": 32, "memoryPerWorker": "256Gi"},
    }
    (group,) = job_children(spec)["RayJob"]["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert (group["groupName"], group["replicas"], group["minReplicas"], group["maxReplicas"]) == (
        "workers",
        4,
        4,
        4,
    )
    (container,) = group["template"]["spec"]["containers"]
    assert container["resources"] == {
        "requests": {"cpu": "32", "memory": "256Gi"},
        "limits": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8"},
    }


def test_cpu_only_workers_request_no_gpu() -> None:
    (container,) = pods(job_children()["RayJob"])["worker"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]


@pytest.mark.parametrize(("cpus", "quantity"), [(1, "1"), (4.0, "4"), (1.5, "1500m"), (0.25, "250m")])
def test_cpu_quantities_are_whole_cores_or_millicores(cpus: float, quantity: str) -> None:
    (container,) = pods(job_children({"workers": {"cpusPerWorker": cpus}})["RayJob"])["worker"]["spec"][
        "containers"
    ]
    assert container["resources"]["requests"]["cpu"] == quantity


def test_the_head_runs_no_training_work() -> None:
    head = job_children()["RayJob"]["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"] == {"num-cpus": "0"}
    container = head["template"]["spec"]["containers"][0]  # the Ray container
    assert "nvidia.com/gpu" not in container["resources"]["limits"]


def test_scheduling_constraints_apply_to_gpu_workers_only() -> None:
    spec = {
        "workers": {
            "nodeSelector": {"nvidia.com/gpu.product": "H100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "training-high",
        }
    }
    templates = pods(job_children(spec)["RayJob"])
    worker = templates["worker"]["spec"]
    assert worker["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    assert worker["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert worker["priorityClassName"] == "training-high"
    assert not {"nodeSelector", "tolerations", "priorityClassName"} & set(templates["head"]["spec"])


@pytest.mark.parametrize("profile", [p.value for p in trainingjob.NetworkProfile])
@pytest.mark.parametrize("group", ["head", "worker"])
def test_every_ray_container_gets_the_nccl_env_of_the_network_profile(profile: str, group: str) -> None:
    spec = {"network": {"profile": profile, "ncclEnv": {"NCCL_DEBUG": "INFO"}}}
    container = pods(job_children(spec)["RayJob"])[group]["spec"]["containers"][0]  # the Ray container
    env = {e["name"]: e["value"] for e in container["env"]}
    expected = nccl.env_for(
        trainingjob.Network(profile=trainingjob.NetworkProfile(profile), nccl_env={"NCCL_DEBUG": "INFO"})
    )
    assert {k: env[k] for k in expected} == expected
    assert env["NCCL_DEBUG"] == "INFO"  # the user's override wins over the profile
    assert env[trainer_config.CONFIG_ENV] == "/etc/trainop/trainer.json"


def ray_env(ray_job: dict[str, Any], group: str) -> dict[str, str | None]:
    container = pods(ray_job)[group]["spec"]["containers"][0]  # the Ray container
    return {e["name"]: e.get("value") for e in container["env"]}


@pytest.mark.parametrize(
    ("workers", "max_worker_failures", "spares"),
    [
        ({"memoryPerWorker": "2Gi"}, None, False),  # the CPU default's size: no room for a 0.7 GiB spare
        ({"memoryPerWorker": "4Gi"}, None, True),
        ({"gpusPerWorker": 2, "memoryPerWorker": None, "sharedMemory": None}, None, True),  # 2 x 12Gi
        ({"gpusPerWorker": 2, "memoryPerWorker": "6Gi"}, None, False),  # 3Gi a rank
        # Room, but no in-attempt restart would use a spare: no spares and no preload slowing Ray's start.
        ({"gpusPerWorker": 2, "memoryPerWorker": None, "sharedMemory": None}, 0, False),
        ({"memoryPerWorker": "4Gi"}, 1, True),
    ],
)
def test_a_training_job_keeps_warm_spare_workers_where_each_rank_has_room_and_restarts_use_them(
    workers: dict[str, Any], max_worker_failures: int | None, spares: bool
) -> None:
    spec: dict[str, Any] = {"workers": workers}
    if max_worker_failures is not None:
        spec["failurePolicy"] = {"maxWorkerFailures": max_worker_failures}
    ray_job = job_children(spec)["RayJob"]
    head, worker = ray_env(ray_job, "head"), ray_env(ray_job, "worker")
    on = "1" if spares else None
    assert (head.get(trainer_config.WARM_SPARES_ENV), worker.get(trainer_config.WARM_SPARES_ENV)) == (on, on)
    # The workers' raylets preload what a spare imports; the head trains nothing and preloads nothing.
    assert worker.get(trainer_config.PRELOAD_ENV) == (trainer_config.PRELOAD_MODULES if spares else None)
    # ... and start no other preloaded idle workers than the spares.
    assert worker.get(trainer_config.PRESTART_FIRST_DRIVER_ENV) == ("0" if spares else None)
    assert trainer_config.PRELOAD_ENV not in head and trainer_config.PRESTART_FIRST_DRIVER_ENV not in head


def test_a_sweeps_trials_share_its_ray_cluster_so_it_keeps_no_spares() -> None:
    body = factories.sweep(
        "lr", spec={"template": {"workers": {"memoryPerWorker": "8Gi", "sharedMemory": None}}}
    )
    ray_job = by_kind(children.desired_children(resource(body), 1))["RayJob"]
    for group in ("head", "worker"):
        env = ray_env(ray_job, group)
        assert trainer_config.WARM_SPARES_ENV not in env and trainer_config.PRELOAD_ENV not in env


@pytest.mark.parametrize("group", ["head", "worker"])
def test_every_pod_is_hardened_for_pod_security_restricted(group: str) -> None:
    pod = pods(job_children()["RayJob"])[group]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["containers"]:
        assert container["securityContext"] == {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        }


@pytest.mark.parametrize("group", ["head", "worker"])
def test_every_pod_mounts_checkpoints_config_and_a_memory_backed_dev_shm(group: str) -> None:
    pod = pods(job_children({"workers": {"sharedMemory": "16Gi"}})["RayJob"])[group]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "mlp-ckpt"}
    assert volumes["trainer-config"]["configMap"] == {
        "name": "mlp-trainer",
        "items": [{"key": "trainer.json", "path": "trainer.json"}],
    }
    # The workers' /dev/shm is the spec's; the head's is half of its own memory (4Gi), not the workers'.
    size = "16Gi" if group == "worker" else "2Gi"
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": size}
    container = pod["containers"][0]  # the Ray container
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    # The head shares Ray's temp dir with its log follower (the driver's log is written there).
    shared = {"/tmp/ray": "ray-tmp"} if group == "head" else {}
    assert mounts == {
        trainer_config.CHECKPOINT_MOUNT_PATH: "checkpoints",
        "/etc/trainop": "trainer-config",
        "/dev/shm": "dshm",
        **shared,
    }
    assert rayjob.CONFIG_DIR + "/" + trainer_config.CONFIG_KEY == trainer_config.DEFAULT_CONFIG_PATH


def test_the_head_runs_a_log_follower_that_prints_the_job_drivers_log_from_the_shared_ray_temp_dir() -> None:
    head = pods(job_children()["RayJob"])["head"]["spec"]
    ray, follower = head["containers"]
    assert ray["name"] == "ray-head"  # KubeRay takes the first container for Ray's
    assert follower["name"] == "trainer-log"
    assert follower["command"] == ["python", "-m", "trainop_trainer.logtail", "/tmp/ray"]
    assert follower["image"] == ray["image"]
    assert follower["volumeMounts"] == [{"name": "ray-tmp", "mountPath": "/tmp/ray", "readOnly": True}]
    assert {"name": "ray-tmp", "emptyDir": {}} in head["volumes"]
    assert follower["securityContext"] == ray["securityContext"]
    assert {e["name"]: e["value"] for e in ray["env"]}["RAY_DEDUP_LOGS"] == "0"
    worker = pods(job_children()["RayJob"])["worker"]["spec"]
    assert [c["name"] for c in worker["containers"]] == ["ray-worker"]


def test_workers_expose_the_trainer_metrics_port_named_metrics_for_a_podmonitor() -> None:
    templates = pods(job_children({"reporting": {"metricsPort": 9191}})["RayJob"])
    (worker,) = templates["worker"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
    assert ports == {"metrics": 9191, "ray-metrics": 8080}
    assert templates["worker"]["metadata"]["labels"]["trainop.dev/job"] == "mlp"


def test_a_multi_gpu_worker_declares_one_metrics_port_per_local_rank() -> None:
    spec = {"workers": {"gpusPerWorker": 4}, "reporting": {"metricsPort": 9191}}
    (worker,) = pods(job_children(spec)["RayJob"])["worker"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
    assert ports == {
        "metrics": 9191,
        "metrics-1": 9192,
        "metrics-2": 9193,
        "metrics-3": 9194,
        "ray-metrics": 8080,
    }


@pytest.mark.parametrize(
    ("spec", "sentence"),
    [
        ({"workers": {"gpusPerWorker": 8}, "reporting": {"metricsPort": 8075}}, "include 8080"),
        ({"workers": {"gpusPerWorker": 1}, "reporting": {"metricsPort": 6379}}, "include 6379"),
        (
            {"workers": {"gpusPerWorker": 4}, "reporting": {"metricsPort": 65534}},
            "no room for one port per GPU",
        ),
    ],
)
def test_metrics_ports_that_collide_with_ray_or_overflow_are_refused_naming_the_field(
    spec: dict[str, Any], sentence: str
) -> None:
    with pytest.raises(manifest.ManifestError, match="metricsPort") as refused:
        job_children(spec)
    assert sentence in str(refused.value)


@pytest.mark.parametrize("group", ["head", "worker"])
def test_ray_pods_are_labelled_with_job_incarnation_and_attempt(group: str) -> None:
    labels = pods(job_children(attempt=5)["RayJob"])[group]["metadata"]["labels"]
    assert labels == {
        "app.kubernetes.io/managed-by": "trainop",
        "app.kubernetes.io/component": "trainer",
        "trainop.dev/job": "mlp",
        "trainop.dev/attempt": "5",
        # a deleted namesake's pods carry the same name: the uid tells them apart (cache.namesake_pod_lives)
        "trainop.dev/owner-uid": "0f0e0d0c-0000-4000-8000-000000000001",
    }


def test_the_image_of_the_spec_runs_in_head_and_workers() -> None:
    templates = pods(job_children({"image": "registry.example/trainer:1.2"})["RayJob"])
    assert {t["spec"]["containers"][0]["image"] for t in templates.values()} == {
        "registry.example/trainer:1.2"
    }


def test_manifests_are_plain_json() -> None:
    built = children.desired_children(resource(factories.sweep()), 1)
    assert json.loads(json.dumps(built)) == built


@pytest.mark.parametrize("group", ["head", "worker"])
def test_every_ray_container_turns_ray_trains_preemption_watcher_off(group: str) -> None:
    """The trainer never asks the watcher (preemption goes through the preStop hook), and its start logs an
    error-level line in every job's log: off on every Ray process, as in the trainer's own tests."""
    container = pods(job_children()["RayJob"])[group]["spec"]["containers"][0]  # the Ray container
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "0"


# ------------------------------------------------------------------------------------ object storage
S3_CHECKPOINTS = {
    "checkpoint": {
        "storage": {
            "s3": {
                "bucket": "ckpt",
                "prefix": "team-a",
                "endpoint": "http://minio.storage:9000",
                "credentialsSecret": "ckpt-creds",
            }
        }
    }
}


def test_with_checkpoints_in_a_bucket_no_claim_exists_and_no_pod_mounts_one() -> None:
    built = job_children(S3_CHECKPOINTS)
    assert "PersistentVolumeClaim" not in built
    for template in pods(built["RayJob"]).values():
        assert "checkpoints" not in {v["name"] for v in template["spec"]["volumes"]}
        container = template["spec"]["containers"][0]
        assert trainer_config.CHECKPOINT_MOUNT_PATH not in {m["mountPath"] for m in container["volumeMounts"]}
        # Nothing else pins a pod to a node either.
        assert "affinity" not in template["spec"] and "nodeName" not in template["spec"]


def test_with_checkpoints_in_a_bucket_the_trainer_config_names_the_bucket_as_its_storage_path() -> None:
    config = json.loads(job_children(S3_CHECKPOINTS)["ConfigMap"]["data"][trainer_config.CONFIG_KEY])
    assert config["storagePath"] == "s3://ckpt/team-a"
    assert config["spec"]["checkpoint"]["storage"]["s3"]["credentialsSecret"] == "ckpt-creds"


@pytest.mark.parametrize("group", ["head", "worker"])
def test_every_ray_container_gets_the_credentials_secrets_keys_by_reference_never_by_value(
    group: str,
) -> None:
    container = pods(job_children(S3_CHECKPOINTS)["RayJob"])[group]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["TRAINOP_CHECKPOINT_S3_CREDENTIALS_SECRET"] == {
        "name": "TRAINOP_CHECKPOINT_S3_CREDENTIALS_SECRET",
        "value": "ckpt-creds",
    }
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        # optional: a missing Secret must not hold the pod in CreateContainerConfigError; the trainer's
        # start-up check reports it on status.storage instead
        assert env[f"TRAINOP_CHECKPOINT_{key}"]["valueFrom"] == {
            "secretKeyRef": {"name": "ckpt-creds", "key": key, "optional": True}
        }
        assert "value" not in env[f"TRAINOP_CHECKPOINT_{key}"]


def test_without_a_credentials_secret_no_credential_variables_are_set() -> None:
    spec = {"checkpoint": {"storage": {"s3": {"bucket": "ckpt"}}}}  # the pods' own identity (IRSA, ...)
    for template in pods(job_children(spec)["RayJob"]).values():
        names = {e["name"] for e in template["spec"]["containers"][0]["env"]}
        assert not {n for n in names if n.startswith("TRAINOP_CHECKPOINT_")}


def test_a_data_claim_is_mounted_read_only_at_data_in_every_worker_and_not_in_the_head() -> None:
    built = job_children({"data": {"existingClaim": "imagenet", "subPath": "train"}})
    head, worker = pods(built["RayJob"])["head"]["spec"], pods(built["RayJob"])["worker"]["spec"]
    volumes = {v["name"]: v for v in worker["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "imagenet", "readOnly": True}
    mounts = {m["mountPath"]: m for m in worker["containers"][0]["volumeMounts"]}
    assert mounts[trainer_config.DATA_MOUNT_PATH] == {
        "name": "data",
        "mountPath": "/data",
        "readOnly": True,
        "subPath": "train",
    }
    env = {e["name"]: e.get("value") for e in worker["containers"][0]["env"]}
    assert env[trainer_config.DATA_DIR_ENV] == "/data"
    assert "data" not in {v["name"] for v in head["volumes"]}


def test_a_data_prefix_in_a_bucket_gives_workers_an_empty_dir_at_data_and_that_buckets_credentials() -> None:
    spec = {"data": {"s3": {"bucket": "datasets", "prefix": "tokens", "credentialsSecret": "data-creds"}}}
    worker = pods(job_children(spec)["RayJob"])["worker"]["spec"]
    assert {v["name"]: v for v in worker["volumes"]}["data"] == {"name": "data", "emptyDir": {}}
    env = {e["name"]: e for e in worker["containers"][0]["env"]}
    assert env["TRAINOP_DATA_AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "data-creds"
    assert env["TRAINOP_DATA_S3_CREDENTIALS_SECRET"]["value"] == "data-creds"
    assert not {n for n in env if n.startswith("TRAINOP_CHECKPOINT_")}  # checkpoints stay on the claim


def test_workers_leave_a_lost_heads_gcs_within_a_minute_to_join_the_new_head() -> None:
    """KubeRay recreates a lost head and resubmits the job; its default keeps workers waiting for the dead
    GCS for 600 s (idle GPUs); the operator sets one minute on every worker, none on the head."""
    built = pods(job_children()["RayJob"])
    worker_env = {e["name"]: e.get("value") for e in built["worker"]["spec"]["containers"][0]["env"]}
    head_env = {e["name"]: e.get("value") for e in built["head"]["spec"]["containers"][0]["env"]}
    assert worker_env["RAY_GCS_RPC_SERVER_RECONNECT_TIMEOUT_S"] == "60"
    assert "RAY_GCS_RPC_SERVER_RECONNECT_TIMEOUT_S" not in head_env


def test_an_mlflow_uri_from_a_secret_reaches_every_ray_container_through_a_secret_key_ref() -> None:
    body = factories.job("mlp")
    body["spec"]["tracking"] = {"mlflow": {"trackingUriSecret": {"name": "mlflow", "key": "uri"}}}
    built = by_kind(children.desired_children(resource(body), 1))
    ray_containers = [
        container
        for template in pods(built["RayJob"]).values()
        for container in template["spec"]["containers"]
        if container["name"] in (rayjob.HEAD_CONTAINER, rayjob.WORKER_CONTAINER)
    ]
    assert len(ray_containers) == 2
    for container in ray_containers:
        assert {
            "name": "MLFLOW_TRACKING_URI",
            "valueFrom": {"secretKeyRef": {"name": "mlflow", "key": "uri"}},
        } in container["env"]
