"""`trainop render`: the operator's children of a manifest, offline. (That they equal what the operator
creates is tests/operator/integration/test_render_matches_operator.py, against a real apiserver.)"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import yaml

from trainop import render
from trainop.api import manifest
from trainop.controller import kinds

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "cpu-mlp.yaml"


def run_render(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainop", "render", *args], capture_output=True, text=True, timeout=120
    )


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def test_render_prints_claim_config_rbac_and_rayjob_of_attempt_1_in_creation_order() -> None:
    result = run_render(str(DEMO))
    assert result.returncode == 0, result.stderr
    assert [(d["kind"], d["metadata"]["name"]) for d in documents(result.stdout)] == [
        ("PersistentVolumeClaim", "cpu-mlp-ckpt"),
        ("ConfigMap", "cpu-mlp-trainer"),
        ("ServiceAccount", "cpu-mlp-trainer"),
        ("Role", "cpu-mlp-trainer"),
        ("RoleBinding", "cpu-mlp-trainer"),
        ("RayJob", "cpu-mlp-a1"),
    ]


def test_render_leads_with_the_pods_and_their_requests_in_all() -> None:
    head = run_render(str(DEMO)).stdout.splitlines()[:4]
    assert head == [
        "# TrainingJob cpu-mlp, attempt 1: the Ray pods it asks for",
        "#   head: 1 x (cpu 1.01, memory 3136Mi; /dev/shm 2Gi)",
        "#   workers: 2 x (cpu 1, memory 2Gi; /dev/shm 1Gi)",
        "#   requests in all: cpu 3.01, memory 7232Mi",
    ]


def test_namespace_and_uid_are_the_manifests_else_the_flags_else_default_and_a_placeholder() -> None:
    (job,) = manifest.load_file(DEMO)
    plain = render.with_cluster_facts(job, namespace=None, uid=None)
    assert (plain.metadata.namespace, plain.metadata.uid) == ("default", render.PLACEHOLDER_UID)
    flagged = render.with_cluster_facts(job, namespace="team-a", uid="1234")
    assert (flagged.metadata.namespace, flagged.metadata.uid) == ("team-a", "1234")
    own = job.model_copy(update={"metadata": job.metadata.model_copy(update={"namespace": "mine"})})
    assert render.with_cluster_facts(own, namespace="team-a", uid=None).metadata.namespace == "mine"
    printed = documents(run_render(str(DEMO), "-n", "team-a", "--uid", "1234").stdout)
    assert {d["metadata"]["namespace"] for d in printed} == {"team-a"}
    assert {r["uid"] for d in printed for r in d["metadata"].get("ownerReferences", [])} == {"1234"}


def test_the_trainer_config_is_printed_as_the_json_file_the_pods_read() -> None:
    (configmap,) = [d for d in documents(run_render(str(DEMO)).stdout) if d["kind"] == "ConfigMap"]
    (job,) = manifest.load_file(DEMO)
    stored = render.with_cluster_facts(job, namespace=None, uid=None)
    assert configmap["data"]["trainer.json"] == kinds.render_config(stored, 1)
    assert "trainer.json: |" in run_render(str(DEMO)).stdout  # a literal block, not an escaped string
    assert json.loads(configmap["data"]["trainer.json"])["attempt"] == 1


def test_whole_floats_in_free_form_values_come_out_as_the_apiserver_stores_them() -> None:
    (sweep,) = manifest.load_file(ROOT / "examples" / "sweep-lr.yaml")
    assert sweep.spec.search_space["hyperparameters.weightDecay"].values == [0.0, 0.0001, 0.001]
    stored = render.with_cluster_facts(sweep, namespace=None, uid=None)
    values = stored.spec.search_space["hyperparameters.weightDecay"].values  # type: ignore[union-attr]
    assert values == [0, 0.0001, 0.001] and isinstance(values[0], int)
    assert stored.spec.template.hyperparameters.learning_rate == 0.05  # type: ignore[union-attr]


def test_render_refuses_an_invalid_manifest_with_the_field_and_exit_code_2() -> None:
    result = run_render(str(ROOT / "tests" / "data" / "invalid" / "21-zero-replicas.yaml"))
    assert result.returncode == 2
    assert "spec.workers.replicas" in result.stderr and "Traceback" not in result.stderr
