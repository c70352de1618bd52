"""``make dev-cluster`` (``python -m tests.clusterbed``): a whole cluster on this machine, for humans.

Starts the cluster bed (control plane, kube-scheduler, kube-proxy, CoreDNS, KubeRay's controller, the node
agent with its nodes), installs trainop with ``helm install charts/trainop`` (its operator runs as the
chart's Deployment, a pod on the node agent), prints how to use it, and stops everything on Ctrl-C. Two
lines go to stdout, the ``export`` lines; everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from tests.clusterbed import assets as bed_assets
from tests.clusterbed import bed as bed_module
from tests.controlplane import assets as assets_module
from tests.controlplane import cluster as controlplane

CHART = controlplane.REPO_ROOT / "charts" / "trainop"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.clusterbed", description=__doc__)
    parser.add_argument("--nodes", type=int, default=1, help="how many nodes the node agent runs (default 1)")
    parser.add_argument("--no-trainop", action="store_true", help="do not helm-install the trainop chart")
    parser.add_argument("--keep", action="store_true", help="keep the data dir (logs, volumes) after stop")
    parser.add_argument("--no-build", action="store_true", help="never build missing binaries")
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    assets = assets_module.ensure(build=not args.no_build)
    extra = bed_assets.ensure(build=not args.no_build)
    nodes = tuple(bed_module.NodeSpec(name=f"node-{chr(ord('a') + i)}") for i in range(args.nodes))
    bed = bed_module.ClusterBed(
        assets=assets, extra=extra, settings=bed_module.BedSettings(nodes=nodes, keep_data_dir=args.keep)
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    started = time.monotonic()
    bed.start()
    try:
        if not args.no_trainop:
            say("# helm install trainop charts/trainop -n trainop-system (the operator runs as a pod)")
            bed.kubectl("apply", "--server-side", "-f", str(controlplane.REPO_ROOT / "crds"), timeout_s=120)
            assert bed.plane is not None
            bed.plane.helm(
                "upgrade",
                "--install",
                "trainop",
                str(CHART),
                "-n",
                "trainop-system",
                "--create-namespace",
                "--wait",
                "--timeout=5m",
                timeout_s=330,
            )
        timings = ", ".join(f"{what} {seconds:.1f}s" for what, seconds in bed.timings.items())
        say(f"# cluster bed ready in {time.monotonic() - started:.0f}s ({timings})")
        say(f"# nodes: {', '.join(n.name for n in nodes)}; logs: {bed.data_dir}/logs/; Ctrl-C stops it")
        say("# then: kubectl apply -f examples/cpu-mlp.yaml && kubectl get trainingjobs -w")
        assert bed.plane is not None
        env = bed.plane.tool_env()
        print(f"export KUBECONFIG={env['KUBECONFIG']}")
        print(
            f'export PATH={env["PATH"].split(":", 2)[0]}:{env["PATH"].split(":", 2)[1]}:"$PATH"', flush=True
        )
        try:
            while not stop.wait(1):
                pass
        except KeyboardInterrupt:
            pass
    finally:
        say("# stopping the cluster bed")
        bed.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
