"""The Argo CD examples (examples/argocd/) point at things that exist and work.

The operator Application's Helm values must pass the chart's schema and render; the jobs it syncs must be
valid TrainingJobs (for pydantic here, and for the real apiserver's CRD schema and CEL rules in the
controlplane tier); the sync waves must order the operator before the jobs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.controlplane import cluster
from trainop.api import manifest, trainingjob

from .conftest import REPO_ROOT, Helm, one

EXAMPLES = REPO_ROOT / "examples" / "argocd"
APPLICATIONS = {path.name: yaml.safe_load(path.read_text()) for path in sorted(EXAMPLES.glob("*.yaml"))}


def _wave(app: dict[str, Any]) -> int:
    return int(app["metadata"].get("annotations", {}).get("argocd.argoproj.io/sync-wave", "0"))


def _job_files() -> list[Path]:
    app = APPLICATIONS["trainingjobs.yaml"]
    return sorted((REPO_ROOT / app["spec"]["source"]["path"]).glob("*.yaml"))


@pytest.mark.parametrize("name", sorted(APPLICATIONS))
def test_example_is_an_argo_cd_application_with_a_source_in_this_repository(name: str) -> None:
    app = APPLICATIONS[name]
    assert (app["apiVersion"], app["kind"]) == ("argoproj.io/v1alpha1", "Application")
    assert app["metadata"]["namespace"] == "argocd"
    spec = app["spec"]
    assert spec["project"] and spec["destination"]["server"] and spec["destination"]["namespace"]
    source_path = REPO_ROOT / spec["source"]["path"]
    assert source_path.is_dir(), f"{name} syncs {spec['source']['path']}, which does not exist"


def test_operator_application_values_pass_the_chart_schema_and_render(helm: Helm, tmp_path: Path) -> None:
    app = APPLICATIONS["trainop-operator.yaml"]
    assert app["spec"]["source"]["path"] == "charts/trainop"
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(app["spec"]["source"]["helm"]["valuesObject"]))
    docs = helm.template(
        values=[values],
        release=app["spec"]["source"]["helm"]["releaseName"],
        namespace=app["spec"]["destination"]["namespace"],
    )
    assert one(docs, "PrometheusRule") and one(docs, "ServiceMonitor") and one(docs, "PodMonitor")
    assert "ServerSideApply=true" in app["spec"]["syncPolicy"]["syncOptions"]
    # Deleting this Application must not cascade to the CRDs (and so to every job in the cluster).
    assert "resources-finalizer.argocd.argoproj.io" not in app["metadata"].get("finalizers", [])


def test_sync_waves_put_the_operator_before_the_jobs_and_jobs_tolerate_missing_crds() -> None:
    operator, jobs = APPLICATIONS["trainop-operator.yaml"], APPLICATIONS["trainingjobs.yaml"]
    assert _wave(operator) < _wave(jobs)
    assert "SkipDryRunOnMissingResource=true" in jobs["spec"]["syncPolicy"]["syncOptions"]
    assert jobs["spec"]["syncPolicy"]["automated"]["prune"] is False
    root = APPLICATIONS["root.yaml"]
    included = root["spec"]["source"]["directory"]["include"].strip("{}").split(",")
    assert sorted(included) == ["team-namespaces.yaml", "trainingjobs.yaml", "trainop-operator.yaml"]


def test_every_namespace_the_operator_serves_is_created_in_a_wave_before_the_operator() -> None:
    """The chart writes a RoleBinding into each served namespace but creates none: a missing one fails."""
    operator, namespaces = APPLICATIONS["trainop-operator.yaml"], APPLICATIONS["team-namespaces.yaml"]
    assert _wave(namespaces) < _wave(operator)
    served = operator["spec"]["source"]["helm"]["valuesObject"]["watchNamespaces"]
    created = {
        resource["metadata"]["name"]
        for path in sorted((REPO_ROOT / namespaces["spec"]["source"]["path"]).glob("*.yaml"))
        for resource in yaml.safe_load_all(path.read_text())
        if resource["kind"] == "Namespace"
    }
    assert served and set(served) <= created, f"served {served}, created {sorted(created)}"
    # Removing a file (or the Application) must not delete a namespace and every job in it.
    assert namespaces["spec"]["syncPolicy"]["automated"]["prune"] is False
    assert "resources-finalizer.argocd.argoproj.io" not in namespaces["metadata"].get("finalizers", [])


@pytest.mark.parametrize("name", sorted(APPLICATIONS))
def test_no_application_deletes_what_it_synced_when_it_is_deleted(name: str) -> None:
    """root.yaml prunes Applications: with Argo CD's resources finalizer, removing one from Git would delete
    its CRDs (and so every job), its jobs, or its namespaces."""
    app = APPLICATIONS[name]
    assert "resources-finalizer.argocd.argoproj.io" not in app["metadata"].get("finalizers", [])


def test_jobs_synced_by_argo_cd_are_valid_and_never_delete_themselves() -> None:
    files = _job_files()
    assert files
    for path in files:
        for resource in manifest.load_file(path):
            assert isinstance(resource, trainingjob.TrainingJob)
            # The operator deleting a finished job would make Argo CD recreate it and train again.
            assert resource.spec.ttl_seconds_after_finished is None, path.name
            assert resource.metadata.namespace is None, f"{path.name}: the Application sets the namespace"


@pytest.mark.controlplane
def test_jobs_synced_by_argo_cd_pass_the_apiservers_validation(
    control_plane: cluster.ControlPlane, namespace: str
) -> None:
    for path in _job_files():
        result = control_plane.kubectl(
            "apply", "--dry-run=server", "-n", namespace, "-f", str(path), check=False
        )
        assert result.returncode == 0, f"{path.name}: {result.stderr}"


@pytest.mark.controlplane
def test_namespaces_synced_by_argo_cd_pass_the_apiservers_validation(
    control_plane: cluster.ControlPlane,
) -> None:
    app = APPLICATIONS["team-namespaces.yaml"]
    files = sorted((REPO_ROOT / app["spec"]["source"]["path"]).glob("*.yaml"))
    assert files
    for path in files:
        result = control_plane.kubectl("apply", "--dry-run=server", "-f", str(path), check=False)
        assert result.returncode == 0, f"{path.name}: {result.stderr}"
