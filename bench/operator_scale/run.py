"""Operator scale: N TrainingJobs applied in a burst against the real control plane, until all Succeeded.

    .venv/bin/python bench/operator_scale/run.py --jobs 100 --jobs 1000 [--json out.json]
    .venv/bin/python bench/operator_scale/run.py --jobs 100 --variant before=/tmp/base --variant after=. \
        --variant floor --repeat 3 --json out.json

Variants, run one after the other (``--repeat`` interleaves them: A B F A B F ...) so that before and
after share the machine's conditions: ``NAME=DIR`` runs the operator of the checkout at DIR (its
``operator/`` first on the operator's PYTHONPATH, its own ``rbac.OPERATOR_RULES`` bound), plain ``NAME``
this checkout's, and ``floor`` runs ``floor.py`` instead of the operator: a controller that only creates
each job's children, the least the apiserver can be asked for (its "settled" is its last RayJob).

For each N a fresh control plane (tests/controlplane: etcd + kube-apiserver + kube-controller-manager,
our CRDs and KubeRay's) and a fresh operator process (``python -m trainop.controller``, namespace-scoped,
authenticated as a ServiceAccount bound to exactly ``rbac.OPERATOR_RULES``, as the Helm chart deploys
it). A watch-driven KubeRay stand-in (tests/reliability/kuberay_async.py) marks each new RayJob
Initializing then Running; once the TrainingJob shows Running, the RayJob is marked Complete (so every
job takes the same path: Pending -> Running -> Succeeded, and requests per job are comparable).

Measured:
- create -> RayJob: from the moment the TrainingJob's POST returned to the moment the stand-in's watch
  saw the operator's RayJob (one clock, this process); p50 / p99 / max;
- settled: from the first POST to the last job's Succeeded, seen on a watch;
- operator peak RSS (VmHWM from /proc) and CPU seconds (user+sys), plus the apiserver's and etcd's CPU;
- API requests per job lifecycle, counted by the apiserver itself: an audit policy logs (Metadata level)
  every request of the operator's ServiceAccount only, and the bench counts them by verb, resource and
  HTTP code. Watches are long-running and counted separately (they are per operator, not per job).

Nothing here is a pass/fail check; docs/reliability.md records the numbers against the targets.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "tests" / "operator")]

import operator_factories  # noqa: E402  (tests/operator: the small valid job the tests use)

from tests.controlplane import assets, cluster, crds, processes  # noqa: E402
from tests.reliability import kube_async, kuberay_async  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import operator_trace  # noqa: E402  (bench/operator_scale/operator_trace.py)

from trainop.controller import options, rbac  # noqa: E402

NAMESPACE = "bench"
OPERATOR_SA = "trainop-operator"
OPERATOR_USER = f"system:serviceaccount:{NAMESPACE}:{OPERATOR_SA}"
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: Metadata
    users: ["{OPERATOR_USER}"]
  - level: None
"""
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


# --------------------------------------------------------------------------------------- processes
def proc_stat(pid: int) -> dict[str, float]:
    """Peak and current RSS (MiB) and CPU seconds of a live process, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return {
        "peak_rss_mib": int(fields["VmHWM"].split()[0]) / 1024,
        "rss_mib": int(fields["VmRSS"].split()[0]) / 1024,
        "cpu_s": (int(stat[11]) + int(stat[12])) / ticks,
    }


def start_plane(data_root: Path) -> tuple[cluster.ControlPlane, Path]:
    data_root.mkdir(parents=True, exist_ok=True)
    policy = data_root / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    audit_log = Path(tempfile.mkdtemp(dir=data_root)) / "audit.log"
    plane = cluster.ControlPlane(
        assets=assets.ensure(build=False),
        settings=cluster.ControlPlaneSettings(
            crd_paths=crds.default_crd_paths(),
            root_dir=data_root,
            extra_apiserver_args=(
                f"--audit-policy-file={policy}",
                f"--audit-log-path={audit_log}",
                "--audit-log-format=json",
                "--audit-log-maxsize=0",
            ),
        ),
    )
    plane.start()
    return plane, audit_log


@dataclasses.dataclass(frozen=True)
class Variant:
    """What runs as the controller: an operator from a checkout (``source``), or the floor."""

    name: str
    source: Path = REPO_ROOT
    floor: bool = False

    @classmethod
    def parse(cls, text: str) -> Variant:
        name, _, source = text.partition("=")
        if name == "floor":
            return cls(name, floor=True)
        return cls(name, Path(source).resolve() if source else REPO_ROOT)

    def env(self) -> dict[str, str]:
        path = [str(self.source / "operator"), os.environ.get("PYTHONPATH", "")]
        return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p), "PYTHONUNBUFFERED": "1"}

    def rules(self) -> list[dict[str, Any]]:
        """The operator's RBAC rules as that checkout states them (the floor creates what ours does)."""
        if self.floor or self.source == REPO_ROOT:
            return rbac.OPERATOR_RULES
        code = "import json; from trainop.controller import rbac; print(json.dumps(rbac.OPERATOR_RULES))"
        out = subprocess.run([sys.executable, "-c", code], env=self.env(), check=True, capture_output=True)
        rules: list[dict[str, Any]] = json.loads(out.stdout)
        return rules

    def module_file(self) -> str:
        code = "import trainop.controller; print(trainop.controller.__file__)"
        out = subprocess.run([sys.executable, "-c", code], env=self.env(), check=True, capture_output=True)
        return out.stdout.decode().strip()


def operator_kubeconfig(plane: cluster.ControlPlane, rules: list[dict[str, Any]]) -> Path:
    """A ServiceAccount bound to a ClusterRole of exactly the operator's rules (what the chart installs)."""
    plane.create_namespace(NAMESPACE)
    for path, body in [
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            {"metadata": {"name": "bench-trainop"}, "rules": rules},
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "metadata": {"name": "bench-trainop"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "bench-trainop",
                },
                "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": NAMESPACE}],
            },
        ),
    ]:
        code, out = plane.request("POST", path, body=json.dumps(body).encode())
        assert code == 201, out
    token = plane.service_account_token(NAMESPACE, OPERATOR_SA, expiration_seconds=24 * 3600)
    return plane.kubeconfig_for_token(token, namespace=NAMESPACE)


def start_floor(kubeconfig: Path, log_path: Path, workers: int) -> processes.ManagedProcess:
    process = processes.ManagedProcess.start(
        name="floor",
        argv=[
            sys.executable,
            str(Path(__file__).resolve().parent / "floor.py"),
            f"--kubeconfig={kubeconfig}",
            f"--namespace={NAMESPACE}",
            f"--workers={workers}",
        ],
        log_path=log_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    process.wait_healthy(lambda: "watching" in process.log_tail(num_lines=20), timeout_s=60)
    return process


def start_operator(
    kubeconfig: Path,
    log_path: Path,
    workers: int,
    profile: Path | None,
    variant: Variant,
    trace: Path | None = None,
) -> tuple[processes.ManagedProcess, int]:
    liveness, metrics_port = processes.free_loopback_ports(2)
    # CPU time, not cProfile's default wall clock: on a shared machine, wall time charges whatever ran
    # when the process was preempted.
    profiler = (
        [
            "-c",
            "import cProfile, runpy, sys, time\n"
            "profile = cProfile.Profile(time.process_time)\n"
            "sys.argv = ['trainop.controller', *sys.argv[1:]]\n"
            "try:\n"
            "    profile.runcall(runpy.run_module, 'trainop.controller', run_name='__main__')\n"
            "finally:\n"
            f"    profile.dump_stats({str(profile)!r})\n",
        ]
        if profile
        else []
    )
    tracer = [str(Path(__file__).resolve().parent / "operator_trace.py")] if trace else []
    env = variant.env() | ({"TRAINOP_TRACE": str(trace)} if trace else {})
    process = processes.ManagedProcess.start(
        name="operator",
        argv=[
            sys.executable,
            *(profiler or tracer or ["-m", "trainop.controller"]),
            f"--kubeconfig={kubeconfig}",
            f"--namespace={NAMESPACE}",
            f"--liveness-port={liveness}",
            f"--metrics-port={metrics_port}",
            f"--workers={workers}",
            "--log-format=plain",
        ],
        log_path=log_path,
        env=env,
    )
    process.wait_healthy(lambda: processes.http_ok(f"http://127.0.0.1:{liveness}/healthz"), timeout_s=60)
    return process, metrics_port


def reconciles(metrics_port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("trainop_operator_reconcile_total{") and 'kind="TrainingJob"' in line:
            result = line.split('result="')[1].split('"')[0]
            out[result] = float(line.rsplit(" ", 1)[1])
    return out


# ------------------------------------------------------------------------------------------- burst
async def burst(
    plane: cluster.ControlPlane,
    num_jobs: int,
    concurrency: int,
    *,
    until_rayjobs: bool = False,
    controller: processes.ManagedProcess | None = None,
) -> dict[str, Any]:
    """The burst; ``until_rayjobs`` (the floor) ends it once every RayJob exists, not every Succeeded.
    Fails at once if ``controller`` (the operator or the floor) exits before the burst settled."""
    names = [f"job-{i:05d}" for i in range(num_jobs)]
    created_at: dict[str, float] = {}
    rayjob_at: dict[str, float] = {}
    running_at: dict[str, float] = {}
    done_at: dict[str, float] = {}
    all_done = asyncio.Event()
    loop = asyncio.get_running_loop()

    async with kube_async.AsyncApi.for_plane(plane, limit=concurrency + 8) as api:

        def on_rayjob(name: str, when: float) -> None:
            rayjob_at.setdefault(name.rsplit("-a", 1)[0], when)
            if until_rayjobs and len(rayjob_at) == num_jobs:
                done_at.update(rayjob_at)
                all_done.set()

        kuberay = kuberay_async.KubeRayStandIn(
            api, NAMESPACE, lambda _: kuberay_async.Plan(kuberay_async.Outcome.HOLD), on_created=on_rayjob
        )
        kuberay.start()
        completing: set[asyncio.Task[None]] = set()

        async def follow_jobs() -> None:
            path = f"/apis/trainop.dev/v1alpha1/namespaces/{NAMESPACE}/trainingjobs"
            async for kind, obj in api.watch(path):
                name, phase = obj["metadata"]["name"], (obj.get("status") or {}).get("phase")
                if kind == "DELETED":
                    continue
                if phase == "Running" and name not in running_at:
                    running_at[name] = loop.time()
                    task = asyncio.create_task(kuberay.succeed(f"{name}-a1"))
                    completing.add(task)
                    task.add_done_callback(completing.discard)
                elif phase == "Succeeded" and name not in done_at:
                    done_at[name] = loop.time()
                    if len(done_at) == num_jobs:
                        all_done.set()

        follower = asyncio.create_task(follow_jobs())
        await asyncio.sleep(1.0)  # both watches established before the burst
        semaphore = asyncio.Semaphore(concurrency)
        path = f"/apis/trainop.dev/v1alpha1/namespaces/{NAMESPACE}/trainingjobs"

        async def create(name: str) -> None:
            body = operator_factories.manifest(name, NAMESPACE)
            async with semaphore:
                await api.create(path, body)
                created_at[name] = loop.time()

        started = loop.time()
        await asyncio.gather(*(create(n) for n in names))
        created_all = loop.time() - started
        try:
            deadline = loop.time() + 1800
            while not all_done.is_set():
                if controller is not None and controller.popen.poll() is not None:
                    raise RuntimeError(f"{controller.name} exited ({controller.popen.returncode}) mid-burst")
                if loop.time() > deadline:
                    raise TimeoutError(f"{len(done_at)} of {num_jobs} jobs settled in 1800 s")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(all_done.wait(), timeout=1.0)
        finally:
            await kube_async.cancel(follower)
            await kuberay.stop()
        settled = max(done_at.values()) - started

    latencies = sorted(rayjob_at[n] - created_at[n] for n in names)
    # RayJobs created per second since the first POST: is the operator's pace steady, or stalling?
    per_second = collections.Counter(int(rayjob_at[n] - started) for n in names)
    timeline = [per_second.get(second, 0) for second in range(max(per_second) + 1)]
    return {
        "created_all_s": created_all,
        "settled_s": settled,
        "create_to_rayjob_s": {
            "p50": statistics.median(latencies),
            "p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
            "max": latencies[-1],
        },
        "create_to_succeeded_p50_s": statistics.median(done_at[n] - created_at[n] for n in names),
        "rayjobs_seen_twice": sorted(n for n, uids in kuberay.seen.items() if len(uids) > 1),
        "rayjobs_created_per_second": timeline,
    }


def apiserver_seconds(plane: cluster.ControlPlane) -> dict[str, tuple[float, float]]:
    """The apiserver's own request timing, all clients: 'VERB resource[/sub]' -> (count, seconds)."""
    request = urllib.request.Request(plane.server_url + "/metrics")
    context = ssl.create_default_context(cafile=str(plane.pki.ca_cert_path))
    context.load_cert_chain(str(plane.pki.admin.cert_path), str(plane.pki.admin.key_path))
    with urllib.request.urlopen(request, context=context, timeout=30) as response:
        text = response.read().decode()
    out: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for line in text.splitlines():
        for suffix, index in (("_sum{", 1), ("_count{", 0)):
            if line.startswith("apiserver_request_duration_seconds" + suffix):
                labels = dict(
                    part.split("=", 1) for part in line[line.index("{") + 1 : line.rindex("}")].split(",")
                )
                resource = labels.get("resource", '""').strip('"')
                sub = labels.get("subresource", '""').strip('"')
                key = f"{labels['verb'].strip(chr(34))} {resource}{'/' + sub if sub else ''}"
                out[key][index] += float(line.rsplit(" ", 1)[1])
    return {k: (v[0], v[1]) for k, v in out.items()}


def count_audit(audit_log: Path, offset: int) -> tuple[dict[str, int], int]:
    """Operator requests in the audit log after ``offset``: 'verb resource[/sub] code' -> count."""
    counts: collections.Counter[str] = collections.Counter()
    with audit_log.open() as log:
        log.seek(offset)
        for line in log:
            event = json.loads(line)
            if event.get("user", {}).get("username") != OPERATOR_USER:
                continue
            ref = event.get("objectRef") or {}
            resource = ref.get("resource", event.get("requestURI", "?"))
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            code = (event.get("responseStatus") or {}).get("code", 0)
            counts[f"{event['verb']} {resource} {code}"] += 1
    return dict(counts), audit_log.stat().st_size


def run_one(
    num_jobs: int,
    *,
    variant: Variant,
    concurrency: int,
    workers: int,
    data_root: Path,
    profile: Path | None = None,
    trace: Path | None = None,
    logs: Path | None = None,
) -> dict[str, Any]:
    load_at_start = os.getloadavg()
    plane, audit_log = start_plane(data_root)
    try:
        kubeconfig = operator_kubeconfig(plane, variant.rules())
        log_path = plane.data_dir / f"{variant.name}.log"
        metrics_port = None
        if variant.floor:
            operator = start_floor(kubeconfig, log_path, workers)
        else:
            operator, metrics_port = start_operator(kubeconfig, log_path, workers, profile, variant, trace)
        try:
            time.sleep(2.0)  # let kopf finish its initial listings
            _, offset = count_audit(audit_log, 0)
            pids = plane.pids()
            before = {name: proc_stat(pid)["cpu_s"] for name, pid in pids.items()}
            before["operator"] = proc_stat(operator.pid)["cpu_s"]
            bench_cpu = time.process_time()
            timing_before = apiserver_seconds(plane)
            result = asyncio.run(
                burst(plane, num_jobs, concurrency, until_rayjobs=variant.floor, controller=operator)
            )
            timing_after = apiserver_seconds(plane)
            time.sleep(3.0)  # trailing reconciles after the last Succeeded
            counts, _ = count_audit(audit_log, offset)
            stats = proc_stat(operator.pid)
            cpu = {name: proc_stat(pid)["cpu_s"] - before[name] for name, pid in pids.items()}
            cpu["operator"] = stats["cpu_s"] - before["operator"]
            cpu["bench_and_standin"] = time.process_time() - bench_cpu
            if metrics_port is not None:
                result["operator_reconciles"] = reconciles(metrics_port)
            spent = {
                key: (count - timing_before.get(key, (0, 0))[0], seconds - timing_before.get(key, (0, 0))[1])
                for key, (count, seconds) in timing_after.items()
                if not key.startswith("WATCH")
            }
            result["apiserver_time_by_request_all_clients"] = {
                key: {
                    "count": int(count),
                    "seconds": round(seconds, 2),
                    "ms_each": round(1000 * seconds / count, 1),
                }
                for key, (count, seconds) in sorted(spent.items(), key=lambda kv: -kv[1][1])
                if count > 0
            }
        finally:
            operator.stop()
            if logs is not None:
                logs.mkdir(parents=True, exist_ok=True)
                shutil.copy(log_path, logs / f"{data_root.name}.log")
    finally:
        plane.stop()
    if trace is not None and trace.exists():
        result["operator_trace"] = operator_trace.summarise(trace)
    non_watch = {k: v for k, v in counts.items() if not k.startswith("watch ")}
    writes = sum(v for k, v in non_watch.items() if k.split()[0] in WRITE_VERBS)
    reads = sum(non_watch.values()) - writes
    result.update(
        variant=variant.name,
        operator_source=None if variant.floor else variant.module_file(),
        load_average_at_start=load_at_start,
        jobs=num_jobs,
        operator_peak_rss_mib=stats["peak_rss_mib"],
        operator_rss_end_mib=stats["rss_mib"],
        cpu_s=cpu,
        requests=dict(sorted(counts.items())),
        requests_per_job={
            "total": sum(non_watch.values()) / num_jobs,
            "writes": writes / num_jobs,
            "reads": reads / num_jobs,
        },
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--jobs", type=int, action="append", help="burst size (repeatable); default 100, 1000"
    )
    parser.add_argument("--concurrency", type=int, default=32, help="POSTs in flight while creating")
    parser.add_argument(
        "--workers",
        type=int,
        default=options.DEFAULT_WORKERS,
        help=f"the operator's --workers (default: its own default, {options.DEFAULT_WORKERS})",
    )
    parser.add_argument(
        "--variant",
        action="append",
        type=Variant.parse,
        help="NAME=DIR (the operator of the checkout at DIR), NAME (this checkout's) or floor; repeatable",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="run every variant this many times, interleaved"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--logs", type=Path, help="keep each run's operator (or floor) log in this directory")
    parser.add_argument(
        "--profile", type=Path, help="a directory: run operators under cProfile, one stats file per run"
    )
    parser.add_argument(
        "--trace",
        type=Path,
        help="a directory: run operators under operator_trace.py (queue waits, reconciles, requests, "
        "loop lag), one raw file per run, summarised into each result as operator_trace",
    )
    args = parser.parse_args()
    variants = args.variant or [Variant("operator")]
    results = []
    with tempfile.TemporaryDirectory(prefix="trainop-bench-") as tmp:
        for num_jobs in args.jobs or [100, 1000]:
            for repeat in range(args.repeat):
                for variant in variants:
                    profile = trace = None
                    run_name = f"{variant.name}-{num_jobs}-{repeat}"
                    if args.profile is not None and not variant.floor:
                        args.profile.mkdir(parents=True, exist_ok=True)
                        profile = args.profile / f"{run_name}.prof"
                    elif args.trace is not None and not variant.floor:
                        args.trace.mkdir(parents=True, exist_ok=True)
                        trace = args.trace / f"{run_name}.json"
                    result = run_one(
                        num_jobs,
                        variant=variant,
                        concurrency=args.concurrency,
                        workers=args.workers,
                        data_root=Path(tmp) / f"{variant.name}-{num_jobs}-{repeat}",
                        profile=profile,
                        trace=trace,
                        logs=args.logs,
                    )
                    print(
                        json.dumps({k: v for k, v in result.items() if k != "requests"}, indent=2), flush=True
                    )
                    results.append(result)
                    if args.json:  # after every run: a long series interrupted keeps what it measured
                        args.json.write_text(json.dumps(summary(results), indent=2))
    print(
        "\n variant | jobs | load | create->RayJob p50 / p99 | settled | operator peak RSS "
        "| CPU s api/etcd/op | requests/job (writes)"
    )
    for r in results:
        latency = r["create_to_rayjob_s"]
        cpu = r["cpu_s"]
        print(
            f"{r['variant']} | {r['jobs']:5d} | {r['load_average_at_start'][0]:.1f} | "
            f"{latency['p50']:.2f} s / {latency['p99']:.2f} s | {r['settled_s']:.1f} s | "
            f"{r['operator_peak_rss_mib']:.0f} MiB | "
            f"{cpu.get('kube-apiserver', 0):.1f}/{cpu.get('etcd', 0):.1f}/{cpu['operator']:.1f} | "
            f"{r['requests_per_job']['total']:.1f} ({r['requests_per_job']['writes']:.1f})"
        )


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "machine": f"{platform.node()} {os.cpu_count()} cores, load {os.getloadavg()}",
        "results": results,
    }


if __name__ == "__main__":
    main()
