"""Resource defaults that fit the job (``trainop.api.resources``, issue #22): what the rendered Ray pods
request when the spec leaves a size open, that the CPU examples fit a small node, and that the trainer asks
Ray for exactly the pod's CPUs."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import operator_factories as factories
import pytest

from trainop.api import manifest, resources, trainingjob
from trainop.controller import children, kinds, rayjob
from trainop_trainer import config as trainer_scaling

ROOT = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
# A small node: a laptop cluster (kind, minikube) or the smallest node of a pool.
SMALL_NODE_CPUS = 4.0
SMALL_NODE_MEMORY = 8 * 1024**3
UNSIZED = {"cpusPerWorker": None, "memoryPerWorker": None, "sharedMemory": None}


def ray_job_of(body: dict[str, Any]) -> dict[str, Any]:
    resource = kinds.parse(body)
    (ray_job,) = [m for m in children.desired_children(resource, 1) if m["kind"] == "RayJob"]
    return ray_job


def worker_pod(body: dict[str, Any]) -> dict[str, Any]:
    (group,) = ray_job_of(body)["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    pod: dict[str, Any] = group["template"]["spec"]
    return pod


def sized(pod: dict[str, Any]) -> tuple[dict[str, str], str]:
    """The container's requests and the /dev/shm size of a pod template."""
    container = pod["containers"][0]  # the Ray container
    (shm,) = [v for v in pod["volumes"] if v["name"] == rayjob.VOLUME_SHM]
    return container["resources"]["requests"], shm["emptyDir"]["sizeLimit"]


def unsized_job(*, gpus: int, loaders: int) -> dict[str, Any]:
    return factories.job(
        spec={
            "workers": {**UNSIZED, "gpusPerWorker": gpus},
            "workload": {"dataset": {"numWorkers": loaders}},
            "precision": "bf16",
        }
    )


def cpu(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


@pytest.mark.parametrize(
    ("gpus", "loaders", "requests", "shm"),
    [
        (0, 0, {"cpu": "1", "memory": "2Gi"}, "1Gi"),
        (0, 2, {"cpu": "3", "memory": "3Gi"}, "1536Mi"),
        (1, 2, {"cpu": "4", "memory": "16Gi"}, "8Gi"),
        (8, 2, {"cpu": "32", "memory": "128Gi"}, "64Gi"),
        (1, 8, {"cpu": "10", "memory": "28Gi"}, "14Gi"),
    ],
    ids=["cpu-no-loaders", "cpu-2-loaders", "1-gpu", "8-gpus", "1-gpu-8-loaders"],
)
def test_a_worker_pod_left_unsized_is_sized_for_its_gpus_and_dataloader_workers(
    gpus: int, loaders: int, requests: dict[str, str], shm: str
) -> None:
    assert sized(worker_pod(unsized_job(gpus=gpus, loaders=loaders))) == (requests, shm)


def test_sizes_the_spec_sets_win_over_the_fitted_defaults() -> None:
    body = factories.job(
        spec={
            "workers": {
                "gpusPerWorker": 2,
                "cpusPerWorker": 6,
                "memoryPerWorker": "40Gi",
                "sharedMemory": "5Gi",
            }
        }
    )
    assert sized(worker_pod(body)) == ({"cpu": "6", "memory": "40Gi"}, "5Gi")


def test_an_explicit_memory_without_shared_memory_gets_half_of_it_as_dev_shm() -> None:
    body = factories.job(spec={"workers": {"memoryPerWorker": "3Gi", "sharedMemory": None}})
    assert sized(worker_pod(body))[1] == "1536Mi"


@pytest.mark.parametrize(("gpus", "loaders"), [(0, 0), (0, 2), (1, 2), (8, 2), (2, 16)])
def test_every_fitted_dev_shm_holds_rays_object_store_so_ray_does_not_fall_back_to_disk(
    gpus: int, loaders: int
) -> None:
    """Ray puts its object store (30 % of the memory it sees, the container limit) in /dev/shm only when it
    fits there; otherwise it warns and uses /tmp. The fitted sizes leave it room."""
    ray_job = ray_job_of(unsized_job(gpus=gpus, loaders=loaders))
    cluster = ray_job["spec"]["rayClusterSpec"]
    for template in [cluster["headGroupSpec"]["template"], cluster["workerGroupSpecs"][0]["template"]]:
        pod = template["spec"]
        container = pod["containers"][0]  # the Ray container
        _, shm = sized(pod)
        limit = resources.quantity_bytes(container["resources"]["limits"]["memory"])
        assert resources.quantity_bytes(shm) >= 0.3 * limit


def cpu_examples() -> list[pathlib.Path]:
    out = []
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        for resource in _resources(path):
            if kinds.training_spec(resource).workers.gpus_per_worker == 0:
                out.append(path)
                break
    return out


def _resources(path: pathlib.Path) -> list[manifest.Resource]:
    try:
        return manifest.load_file(path)
    except manifest.ManifestError:
        return []  # not a trainop manifest (Argo CD applications, kustomizations)


def every_pod(resource: manifest.Resource) -> list[tuple[str, int, rayjob.PodRequests]]:
    """(group, pod count, requests of all its containers) of every pod the resource's RayJob asks for."""
    body = resource.model_dump(mode="json", by_alias=True, exclude_none=True)
    body["metadata"]["uid"] = "0f0e0d0c-0000-4000-8000-000000000001"
    body["metadata"]["namespace"] = "default"
    cluster = ray_job_of(body)["spec"]["rayClusterSpec"]
    (workers,) = cluster["workerGroupSpecs"]
    return [
        ("head", 1, rayjob.pod_requests(cluster["headGroupSpec"]["template"]["spec"])),
        ("workers", workers["replicas"], rayjob.pod_requests(workers["template"]["spec"])),
    ]


def test_the_cpu_examples_are_found() -> None:
    names = {p.name for p in cpu_examples()}
    assert {"cpu-mlp.yaml", "sweep-lr.yaml", "regression.yaml"} <= names


@pytest.mark.parametrize("example", cpu_examples(), ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_every_pod_of_a_cpu_example_fits_a_4_cpu_8_gib_node(example: pathlib.Path) -> None:
    for resource in _resources(example):
        for group, _, requests in every_pod(resource):
            assert requests.cpu <= SMALL_NODE_CPUS, (example.name, group, requests)
            assert requests.memory_bytes <= SMALL_NODE_MEMORY, (example.name, group, requests)


def test_the_whole_cpu_demo_fits_one_4_cpu_8_gib_node() -> None:
    """`make demo`'s job (the issue's 36 GiB): head and both workers together on one small node."""
    (job,) = manifest.load_file(EXAMPLES / "cpu-mlp.yaml")
    pods = every_pod(job)
    assert sum(count * r.cpu for _, count, r in pods) <= SMALL_NODE_CPUS
    assert sum(count * r.memory_bytes for _, count, r in pods) <= SMALL_NODE_MEMORY


def test_a_trainingjob_head_requests_what_its_processes_measured_and_may_use_more() -> None:
    cluster = ray_job_of(factories.job())["spec"]["rayClusterSpec"]
    container = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"requests": {"cpu": "1", "memory": "3Gi"}, "limits": {"memory": "4Gi"}}


@pytest.mark.parametrize(("gpus", "loaders"), [(0, 0), (0, 3), (1, 2), (4, 2), (8, 6)])
def test_the_trainer_asks_ray_for_exactly_the_worker_pods_cpus(gpus: int, loaders: int) -> None:
    """KubeRay gives Ray the container's CPU limit; Ray Train's workers of one pod must ask for no more."""
    body = unsized_job(gpus=gpus, loaders=loaders)
    container = worker_pod(body)["containers"][0]
    pod_cpus = cpu(container["resources"]["limits"]["cpu"])
    resource = kinds.parse(body)
    config = json.loads(kinds.render_config(resource, 1))
    spec = trainingjob.TrainingJobSpec.model_validate(config["spec"], by_alias=True, by_name=False)
    scaling = trainer_scaling.scaling_for(spec)
    ranks_per_pod = max(1, gpus)
    assert scaling.resources_per_worker["CPU"] * ranks_per_pod == pytest.approx(pod_cpus)


def test_the_trainer_config_carries_the_fitted_sizes_for_a_trainer_image_with_other_defaults() -> None:
    """An older trainer image fills an absent cpusPerWorker with its own default (4): written out, the
    config makes it ask Ray for the pod's CPUs instead of more than the pod has."""
    config = json.loads(kinds.render_config(kinds.parse(unsized_job(gpus=0, loaders=0)), 1))
    workers = config["spec"]["workers"]
    sizes = {key: workers.get(key) for key in ("cpusPerWorker", "memoryPerWorker", "sharedMemory")}
    assert sizes == {"cpusPerWorker": 1.0, "memoryPerWorker": "2Gi", "sharedMemory": "1Gi"}
