"""Where the cluster bed's own binaries come from: the same per-version cache as the control plane's.

``tests/controlplane/build.sh`` builds them (components ``kube-scheduler kube-proxy kuberay-operator
coredns``); this module only finds them, and :func:`ensure` asks build.sh for the missing ones. The layout
is build.sh's (keep the two in step).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tests.controlplane import assets as controlplane_assets
from tests.controlplane import processes

COMPONENTS = ("kube-scheduler", "kube-proxy", "kuberay-operator", "coredns")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BedAssets:
    kube_scheduler: Path
    kube_proxy: Path
    #: KubeRay's controller (``go install github.com/ray-project/kuberay/ray-operator@<v>``).
    kuberay_operator: Path
    #: KubeRay's kustomize install: ``crd/``, ``rbac/``, ``manager/``, ``default/``.
    kuberay_config: Path
    coredns: Path
    versions: dict[str, str]


def _paths() -> tuple[dict[str, Path], Path, dict[str, str]]:
    versions = controlplane_assets.read_versions()
    root = controlplane_assets.cache_root() / "controlplane"
    k8s_bin = root / f"kubernetes-{versions['K8S_VERSION']}" / "bin"
    kuberay = root / f"kuberay-{versions['KUBERAY_VERSION']}"
    binaries = {
        "kube-scheduler": k8s_bin / "kube-scheduler",
        "kube-proxy": k8s_bin / "kube-proxy",
        "kuberay-operator": kuberay / "bin" / "ray-operator",
        "coredns": root / f"coredns-{versions['COREDNS_VERSION']}" / "bin" / "coredns",
    }
    return binaries, kuberay / "config", versions


def missing() -> list[str]:
    binaries, config, _ = _paths()
    absent = [name for name, path in binaries.items() if processes.which_executable(path) is None]
    if not (config / "default" / "kustomization.yaml").is_file() and "kuberay-operator" not in absent:
        absent.append("kuberay-operator")
    return absent


def resolve() -> BedAssets | None:
    """The bed's binaries, or None when any is missing (:func:`missing` names them)."""
    if missing():
        return None
    binaries, config, versions = _paths()
    return BedAssets(
        kube_scheduler=binaries["kube-scheduler"],
        kube_proxy=binaries["kube-proxy"],
        kuberay_operator=binaries["kuberay-operator"],
        kuberay_config=config,
        coredns=binaries["coredns"],
        versions=versions,
    )


def ensure(*, build: bool = True) -> BedAssets:
    """The bed's binaries, building the missing ones with build.sh (Go module proxy) when ``build``."""
    absent = missing()
    if absent and build:
        controlplane_assets.build_missing(absent)
        absent = missing()
    if absent:
        raise controlplane_assets.AssetsUnavailable(
            f"the cluster bed needs {', '.join(absent)}: run `make controlplane` "
            "(bash tests/controlplane/build.sh; needs Go >= 1.26 and the Go module proxy)"
        )
    resolved = resolve()
    assert resolved is not None
    return resolved
