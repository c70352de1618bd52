"""Where the control plane's binaries and KubeRay CRDs come from, and building them when missing.

Owns the lookup order and the cache layout (which ``build.sh`` writes; keep the two in step):

1. ``$KUBEBUILDER_ASSETS`` (envtest convention: a directory holding ``kube-apiserver``, ``etcd`` and
   often ``kubectl``) wins for every binary it contains;
2. otherwise the per-version cache ``$TRAINOP_CACHE_DIR`` | ``$XDG_CACHE_HOME/trainop`` |
   ``~/.cache/trainop``, under ``controlplane/<component>-<version>/``, at the versions pinned in
   ``versions.env``.

It never downloads anything itself: :func:`build_missing` runs ``build.sh``, which uses only the Go module
proxy. It does not start processes other than the build; ``cluster.py`` does that.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from . import processes

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
VERSIONS_FILE = HERE / "versions.env"

#: Components build.sh knows, in the order it builds them when asked for everything.
ALL_COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl", "kuberay-crds", "helm")
#: Without these two there is no control plane at all; the rest degrade single tests.
REQUIRED_COMPONENTS = ("etcd", "kube-apiserver")
KUBERAY_CRD_FILES = ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml")

HOW_TO_BUILD = "run `make controlplane` (needs Go >= 1.26 and the Go module proxy)"
HOW_TO_ENABLE = (
    "run `make controlplane` (needs Go >= 1.26 and the Go module proxy) "
    "or point KUBEBUILDER_ASSETS at a directory with kube-apiserver and etcd"
)


class AssetsUnavailable(RuntimeError):
    """Required binaries are missing and cannot be built here (no Go toolchain, or building switched off)."""


class BuildFailed(RuntimeError):
    """build.sh ran and failed: a real error to fix, never a reason to skip tests."""


def read_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """Parse ``versions.env`` (KEY=value lines, # comments)."""
    versions: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            versions[key.strip()] = value.strip()
    return versions


def cache_root() -> Path:
    if explicit := os.environ.get("TRAINOP_CACHE_DIR"):
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "trainop"


#: Set to 0 to never build automatically (tests then use only what KUBEBUILDER_ASSETS and the cache have).
BUILD_ENV = "TRAINOP_CONTROLPLANE_BUILD"


def find_go() -> Path | None:
    """The Go toolchain build.sh would use, or None (also when automatic builds are switched off)."""
    if os.environ.get(BUILD_ENV, "1") == "0":
        return None
    for candidate in (os.environ.get("GO"), shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and (found := processes.which_executable(Path(candidate))):
            return found
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Assets:
    """Resolved paths; None where a component is neither in KUBEBUILDER_ASSETS nor the cache."""

    versions: dict[str, str]
    kube_apiserver: Path | None
    etcd: Path | None
    kube_controller_manager: Path | None
    kubectl: Path | None
    helm: Path | None
    kuberay_crds: tuple[Path, ...]
    #: component -> "KUBEBUILDER_ASSETS" or "cache", for the components that were found.
    sources: dict[str, str]

    @property
    def missing(self) -> tuple[str, ...]:
        present = {
            "etcd": self.etcd,
            "kube-apiserver": self.kube_apiserver,
            "kube-controller-manager": self.kube_controller_manager,
            "kubectl": self.kubectl,
            "helm": self.helm,
            "kuberay-crds": self.kuberay_crds or None,
        }
        return tuple(name for name in ALL_COMPONENTS if present[name] is None)

    @property
    def runnable(self) -> bool:
        return not set(REQUIRED_COMPONENTS) & set(self.missing)

    @property
    def pinned_kubernetes_version(self) -> str:
        return self.versions["K8S_VERSION"]


def resolve() -> Assets:
    """Find every component without building anything."""
    versions = read_versions()
    root = cache_root() / "controlplane"
    k8s_bin = root / f"kubernetes-{versions['K8S_VERSION']}" / "bin"
    cached = {
        "kube-apiserver": k8s_bin / "kube-apiserver",
        "kube-controller-manager": k8s_bin / "kube-controller-manager",
        "kubectl": k8s_bin / "kubectl",
        "etcd": root / f"etcd-{versions['ETCD_VERSION']}" / "bin" / "etcd",
        "helm": root / f"helm-{versions['HELM_VERSION']}" / "bin" / "helm",
    }
    envtest_dir = os.environ.get("KUBEBUILDER_ASSETS")
    found: dict[str, Path | None] = {}
    sources: dict[str, str] = {}
    for name, cache_path in cached.items():
        from_env = processes.which_executable(Path(envtest_dir) / name) if envtest_dir else None
        if from_env is not None:
            found[name], sources[name] = from_env, "KUBEBUILDER_ASSETS"
        elif (from_cache := processes.which_executable(cache_path)) is not None:
            found[name], sources[name] = from_cache, "cache"
        else:
            found[name] = None
    crd_dir = root / f"kuberay-{versions['KUBERAY_VERSION']}" / "crds"
    crds = tuple(crd_dir / file for file in KUBERAY_CRD_FILES)
    kuberay_crds = crds if all(path.is_file() for path in crds) else ()
    if kuberay_crds:
        sources["kuberay-crds"] = "cache"
    return Assets(
        versions=versions,
        kube_apiserver=found["kube-apiserver"],
        etcd=found["etcd"],
        kube_controller_manager=found["kube-controller-manager"],
        kubectl=found["kubectl"],
        helm=found["helm"],
        kuberay_crds=kuberay_crds,
        sources=sources,
    )


def build_missing(
    components: Iterable[str],
    *,
    on_line: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> None:
    """Run build.sh for ``components``, streaming its progress lines to ``on_line``.

    build.sh serialises concurrent builds with a lock file, so several pytest-xdist workers that all
    find the cache empty wait for one build instead of racing it.
    """
    wanted = [name for name in components]
    if not wanted:
        return
    go = find_go()
    if go is None:
        raise AssetsUnavailable(f"cannot build {', '.join(wanted)}: no Go toolchain; {HOW_TO_ENABLE}")
    env = {**os.environ, "GO": str(go)}
    with subprocess.Popen(
        ["bash", str(BUILD_SCRIPT), *wanted],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    ) as build:
        assert build.stdout is not None
        tail: list[str] = []
        for line in build.stdout:
            line = line.rstrip("\n")
            tail = [*tail[-30:], line]
            # Module downloads are hundreds of lines of noise; the build prints its own heartbeat.
            if not line.startswith("go: downloading"):
                on_line(line)
        code = build.wait()
    if code != 0:
        raise BuildFailed(f"build.sh {' '.join(wanted)} failed with exit code {code}:\n" + "\n".join(tail))


def ensure(
    *,
    build: bool = True,
    on_line: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> Assets:
    """Resolve assets, building whatever is missing when a Go toolchain exists and ``build`` is True.

    Raises :class:`AssetsUnavailable` only when the required components (etcd, kube-apiserver) are
    missing and cannot be built; optional ones stay None and the tests that need them skip.
    """
    assets = resolve()
    if assets.missing and build and find_go() is not None:
        build_missing(assets.missing, on_line=on_line)
        assets = resolve()
    if not assets.runnable:
        missing = " and ".join(name for name in REQUIRED_COMPONENTS if name in assets.missing)
        raise AssetsUnavailable(f"no {missing} in KUBEBUILDER_ASSETS or {cache_root()}; {HOW_TO_ENABLE}")
    return assets
