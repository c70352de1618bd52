"""The files the chart carries as copies (CRDs, rules, dashboards) are identical to their sources.

Helm cannot read outside the chart, so the chart holds copies; `charts/sync.sh` refreshes them. These
tests fail on any drift, naming the file, so a regenerated CRD or an edited alert never ships stale.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from .conftest import CHART_DIR, REPO_ROOT, Helm

COPIES = [
    # (source dir, pattern, copy dir)
    (REPO_ROOT / "crds", "*.yaml", CHART_DIR / "crds"),
    (REPO_ROOT / "monitoring" / "prometheus", "trainop.rules.yaml", CHART_DIR / "files" / "prometheus"),
    (REPO_ROOT / "monitoring" / "grafana", "*.json", CHART_DIR / "files" / "dashboards"),
]


@pytest.mark.parametrize(("source_dir", "pattern", "copy_dir"), COPIES, ids=["crds", "rules", "dashboards"])
def test_chart_copy_is_identical_to_its_source(source_dir: Path, pattern: str, copy_dir: Path) -> None:
    sources = {path.name: path.read_bytes() for path in source_dir.glob(pattern)}
    copies = {path.name: path.read_bytes() for path in copy_dir.glob(pattern)}
    assert sources, f"nothing matches {source_dir}/{pattern}"
    stale = sorted(name for name in sources.keys() & copies.keys() if sources[name] != copies[name])
    missing = sorted(sources.keys() - copies.keys())
    extra = sorted(copies.keys() - sources.keys())
    assert not (stale or missing or extra), (
        f"{copy_dir.relative_to(REPO_ROOT)} is out of date "
        f"(stale {stale}, missing {missing}, extra {extra}): "
        "run charts/sync.sh"
    )


def test_chart_crds_are_the_crds_the_models_generate() -> None:
    from trainop.api import crd

    for file_name, definition in crd.all_crds().items():
        assert (CHART_DIR / "crds" / file_name).read_text() == crd.render_yaml(definition), file_name


def test_packaged_chart_holds_crds_rules_and_dashboards_but_not_the_argocd_sources(
    helm: Helm, tmp_path: Path
) -> None:
    helm.run("package", str(CHART_DIR), "--destination", str(tmp_path))
    (archive,) = tmp_path.glob("trainop-*.tgz")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {
        "trainop/crds/trainop.dev_trainingjobs.yaml",
        "trainop/crds/trainop.dev_tuningsweeps.yaml",
    } <= names
    assert "trainop/files/prometheus/trainop.rules.yaml" in names
    assert "trainop/values.schema.json" in names
    assert {
        f"trainop/files/dashboards/{p.name}" for p in (REPO_ROOT / "monitoring" / "grafana").glob("*.json")
    } <= names
    assert not [name for name in names if name.startswith("trainop/argocd/")]
