"""Every Ray pod template the operator can generate passes Pod Security ``restricted`` -- for specs drawn by
hypothesis over every field that shapes the pods, not only the three fixed jobs of the operator tier.

The operator tier's ``test_pod_security_restricted.py`` runs the operator and dry-runs the stored RayJob's
templates (CPU job, GPU job, sweep), and shows an unhardened pod is refused, so the check can fail. This
test does not repeat that: it takes the pure builder (``children.desired_children``, what the operator
submits) over model-valid specs varying GPUs, CPUs, memory, /dev/shm, node selectors, tolerations,
priority class, network profile and NCCL env, image, metrics port, the checkpoint claim (created or
existing, access mode) and the kind (TrainingJob or TuningSweep), and dry-runs each head and worker
template as a Pod in a namespace that enforces ``restricted``. Examples are new on every run
(tests/property_seed.py prints the seed that replays them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import operator_factories as factories
import pytest
from hypothesis import HealthCheck, assume, given, seed, settings
from hypothesis import strategies as st

from tests import property_seed
from tests.controlplane import cluster
from trainop.api import manifest
from trainop.controller import children, kinds

pytestmark = pytest.mark.controlplane

# Label keys and values as Kubernetes checks them in a pod (the models refuse the rest, and a drawn spec the
# models refuse is discarded: it once drew a prefix with two dots, which the API then admitted and pods
# refused; tests/reliability/test_bad_input_property.py pins that case).
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?"
LABEL_KEY = st.from_regex(
    rf"({_DNS_LABEL}(\.{_DNS_LABEL}){{0,2}}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{{0,12}}[A-Za-z0-9])?", fullmatch=True
)
LABEL_VALUE = st.from_regex(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,20}[A-Za-z0-9])?)?", fullmatch=True)
QUANTITY = st.sampled_from(["512Mi", "1Gi", "2Gi", "16Gi", "1.5Gi", "100M"])
TOLERATION = st.fixed_dictionaries(
    {"operator": st.sampled_from(["Exists", "Equal"])},
    optional={
        "key": LABEL_KEY,
        "effect": st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"]),
        "value": LABEL_VALUE,
    },
).filter(
    # Kubernetes' own toleration rules: a pod breaking them is invalid, not a Pod Security matter (the API
    # refuses such tolerations itself; test_bad_input_property's toleration tests).
    lambda t: (t["operator"] == "Equal" and "key" in t) or (t["operator"] == "Exists" and "value" not in t)
)


@st.composite
def pod_shaping_spec(draw: st.DrawFn) -> dict[str, Any]:
    gpus = draw(st.integers(0, 8))
    workers: dict[str, Any] = {
        "replicas": draw(st.integers(1, 8)),
        "gpusPerWorker": gpus,
        "cpusPerWorker": draw(st.sampled_from([0.5, 1, 4, 16])),
        "memoryPerWorker": draw(QUANTITY),
        "sharedMemory": draw(QUANTITY),
        "nodeSelector": draw(st.dictionaries(LABEL_KEY, LABEL_VALUE, max_size=3)),
        "tolerations": draw(st.lists(TOLERATION, max_size=3)),
    }
    if draw(st.booleans()):
        workers["priorityClassName"] = draw(st.sampled_from(PRIORITY_CLASSES))
    storage: dict[str, Any] = {
        "accessMode": draw(st.sampled_from(["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"]))
    }
    if draw(st.booleans()):
        storage["existingClaim"] = draw(st.sampled_from(["shared-ckpt", "team.checkpoints"]))
    else:
        storage["size"] = draw(QUANTITY)
    return {
        "image": draw(
            st.sampled_from(
                ["ghcr.io/trainop/trainer:0.1.0", "registry.local:5000/ml/trainer@sha256:" + "a" * 64]
            )
        ),
        "precision": draw(st.sampled_from(["fp32", "bf16", "fp16"] if gpus else ["fp32", "bf16"])),
        "workers": workers,
        "network": {
            "profile": draw(st.sampled_from(["auto", "nvlink", "infiniband", "roce", "efa", "tcp"])),
            "ncclEnv": draw(
                st.dictionaries(
                    st.sampled_from(["NCCL_DEBUG", "NCCL_IB_HCA", "FI_PROVIDER"]), LABEL_VALUE, max_size=2
                )
            ),
        },
        "reporting": {"metricsPort": draw(st.integers(1024, 65535).filter(lambda p: p != 8080))},
        "checkpoint": {"storage": storage},
    }


PRIORITY_CLASSES = [
    "trainop-psa-test-high",
    "trainop-psa-test-batch",
]  # cluster-scoped: names unique to this test


@pytest.fixture
def priority_classes(isolated_plane: cluster.ControlPlane) -> Iterator[None]:
    """Priority admission wants a pod's class to exist."""
    for value, name in enumerate(PRIORITY_CLASSES):
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        code, answer = isolated_plane.request(
            "POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body=json.dumps(body).encode()
        )
        assert code in (201, 409), answer
    yield
    for name in PRIORITY_CLASSES:
        isolated_plane.request("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")


@pytest.fixture
def restricted_namespace(isolated_plane: cluster.ControlPlane, isolated_namespace: str) -> str:
    labels = {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }
    code, body = isolated_plane.request(
        "PATCH",
        f"/api/v1/namespaces/{isolated_namespace}",
        body=json.dumps({"metadata": {"labels": labels}}).encode(),
        content_type="application/merge-patch+json",
    )
    assert code == 200, body
    for kind in kinds.ALL:  # ServiceAccount admission wants the pods' accounts to exist (the operator's job)
        isolated_plane.service_account_token(isolated_namespace, kind.service_account_name("psa"))
    return isolated_namespace


def test_every_ray_pod_template_of_any_valid_spec_passes_pod_security_restricted(
    isolated_plane: cluster.ControlPlane, restricted_namespace: str, priority_classes: None
) -> None:
    ns = restricted_namespace
    checked: list[str] = []

    @seed(property_seed.SEED)
    @settings(
        max_examples=int(os.environ.get("TRAINOP_PSA_EXAMPLES", "25")),
        deadline=None,
        derandomize=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(pod_shaping_spec(), st.sampled_from(["TrainingJob", "TuningSweep"]))
    def dry_run_every_template(spec: dict[str, Any], kind: str) -> None:
        body = factories.job("psa", ns, kind=kind, spec=spec if kind == "TrainingJob" else {"template": spec})
        try:
            resource = kinds.parse(body)
        except manifest.ManifestError:
            assume(False)  # not a spec the operator would build anything for
        rayjob = next(m for m in children.desired_children(resource, 1) if m["kind"] == "RayJob")
        cluster_spec = rayjob["spec"]["rayClusterSpec"]
        templates = {"head": cluster_spec["headGroupSpec"]["template"]}
        templates |= {f"worker-{g['groupName']}": g["template"] for g in cluster_spec["workerGroupSpecs"]}
        for group, template in templates.items():
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"ray-{group}", **template["metadata"]},
                "spec": template["spec"],
            }
            code, answer = isolated_plane.request(
                "POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All", body=json.dumps(pod).encode()
            )
            assert code == 201, (group, answer.get("message"), spec)
            checked.append(group)

    dry_run_every_template()
    assert len(checked) >= 20, checked  # the property ran on many templates, not on none
