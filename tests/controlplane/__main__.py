"""``python -m tests.controlplane``: run the test control plane in the foreground for manual work.

Used by ``make dev-cluster``. Builds missing binaries (when Go is available), starts the same cluster the
``control_plane`` fixture starts, prints the ``export`` lines for the shell, and stops everything on
Ctrl-C or SIGTERM. It owns no cluster logic of its own.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from . import assets, cluster, crds


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.controlplane",
        description="Run the test control plane in the foreground until Ctrl-C; print its KUBECONFIG.",
    )
    parser.add_argument(
        "--crds",
        type=Path,
        default=crds.DEFAULT_CRD_DIR,
        help="directory of CRD YAML to install (default: %(default)s; skipped when missing)",
    )
    parser.add_argument("--no-kuberay-crds", action="store_true", help="do not install KubeRay's CRDs")
    parser.add_argument("--no-controller-manager", action="store_true", help="run only etcd + kube-apiserver")
    parser.add_argument("--keep", action="store_true", help="keep the data dir (logs, etcd data) after exit")
    parser.add_argument("--no-build", action="store_true", help="fail instead of building missing binaries")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        resolved = assets.ensure(build=not args.no_build)
    except assets.AssetsUnavailable as error:
        print(f"dev-cluster: {error}", file=sys.stderr)
        return 2
    settings = cluster.ControlPlaneSettings(
        crd_paths=crds.default_crd_paths(args.crds),
        install_kuberay_crds=not args.no_kuberay_crds,
        controller_manager=not args.no_controller_manager,
        keep_data_dir=args.keep,
    )
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with cluster.ControlPlane(assets=resolved, settings=settings) as plane:
        tool_dirs = sorted(
            {str(path.parent) for path in (resolved.kubectl, resolved.helm) if path is not None}
        )
        timings = ", ".join(f"{phase} {seconds:.1f}s" for phase, seconds in plane.timings.items())
        print(f"# control plane {plane.server_url} ready ({timings})", file=sys.stderr)
        print(f"# CRDs: {', '.join(plane.crd_names) or 'none'}", file=sys.stderr)
        print(f"# logs: {plane.data_dir}/logs/; Ctrl-C stops it", file=sys.stderr)
        print(f"export KUBECONFIG={plane.kubeconfig_path}")
        if tool_dirs:
            print(f'export PATH={":".join(tool_dirs)}:"$PATH"')
        sys.stdout.flush()
        while not stop.wait(timeout=1.0):
            if not plane.all_running():
                print("dev-cluster: a component exited; logs:\n" + plane.log_tails(), file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
