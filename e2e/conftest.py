"""Fixtures of the e2e tier: the installed system (session), every scenario's script (session), outcomes.

``e2e_env`` (session) brings the whole system up the way a user would: the cluster (the local cluster bed
with KubeRay's real controller, or ``$KUBECONFIG`` with ``E2E_REAL_CLUSTER=1``), ``helm install`` of
charts/trainop, and the rollout of the chart's operator Deployment (on the bed, a pod of the node agent).
On the bed it also starts an S3 server (versitygw, tests/objectstore) on the bed's root address, which
pods reach as they reach the apiserver: the object-storage scenario's bucket.

``e2e_scripts`` (session) gives every selected test marked ``@scenario.acts(script)`` its own namespace
and starts all their scripts at once (``scenario.ScriptRun``; ``E2E_CONCURRENCY=N`` caps how many act at a
time, 1 runs them one by one). ``e2e_script`` (function) is the test's own script; its ``outcome()``
waits for it and returns ``(scenario, facts)``. Each scenario's timeline is printed at the end of the
run (section "e2e timelines") and, with ``E2E_TIMELINES=FILE``, appended to that file. On the local bed
the run ends with where the pods' CPU went (section "e2e container CPU": the node agent's per-container
cgroup counters, by pod role and container, and by namespace, that is by scenario).

A failed scenario gets the operator pod's log, the cluster's component logs and the S3 server's (locally)
and its Ray pods' logs (the head's driver log and the workers', ``kubectl logs``) attached to its report.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from e2e import claims, faults, install, scenario
from e2e import cluster as cluster_module
from tests.controlplane import assets
from tests.nodeagent import container_cpu
from tests.objectstore.server import S3Server
from trainop.controller import rayjob

_ENV = pytest.StashKey[scenario.Environment]()
_TIMELINES = pytest.StashKey[list[tuple[str, str]]]()
_SCENARIO = pytest.StashKey[scenario.Scenario]()
_SETUP_TIMINGS = pytest.StashKey[list[tuple[str, float]]]()
_CONTAINER_CPU = pytest.StashKey[str]()
TIMELINES_FILE_ENV = "E2E_TIMELINES"
CONCURRENCY_ENV = "E2E_CONCURRENCY"


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_TIMELINES] = []
    config.stash[_SETUP_TIMINGS] = []
    config.addinivalue_line(
        "markers", "e2e_script(script): the user's actions of an e2e scenario (see e2e/scenario.py: acts)"
    )


@pytest.fixture(scope="session")
def e2e_env(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[scenario.Environment]:
    work = tmp_path_factory.mktemp("e2e")
    real = cluster_module.real_cluster_requested()
    started = time.monotonic()
    timings = request.config.stash[_SETUP_TIMINGS]

    def mark(what: str) -> None:
        timings.append((what, time.monotonic() - started))

    cluster: cluster_module.Cluster
    store: S3Server | None = None
    if real:
        cluster = cluster_module.RealCluster(assets=assets.resolve())
    else:
        resolved = request.getfixturevalue("control_plane_assets")  # builds or fails, naming what is missing
        cluster = cluster_module.LocalCluster(assets=resolved, work_dir=work)
        for what, seconds in cluster.bed.timings.items():
            timings.append((f"bed: {what}", seconds))
    mark(f"cluster ({cluster.kind}) up")
    try:
        release = install.helm_install(cluster)
        mark("helm install done (CRDs Established)")
        install.wait_for_rollout(cluster, release)
        mark("operator Deployment rolled out")
        if isinstance(cluster, cluster_module.LocalCluster):
            store = S3Server.start(work / "s3", host=cluster.bed.network.apiserver_ip)
            mark("S3 server up")
        env = scenario.Environment(
            cluster=cluster,
            release=release,
            faults=faults.ClusterFaults(cluster),
            claims=claims.ClaimFiles(cluster),
            work_dir=work,
            object_store=store,
        )
        request.config.stash[_ENV] = env
        yield env
    finally:
        if _ENV in request.config.stash:
            del request.config.stash[_ENV]
        if store is not None:
            store.stop()
        cluster.close()
        if isinstance(cluster, cluster_module.LocalCluster):
            runs = cluster.bed.harness.container_cpu
            request.config.stash[_CONTAINER_CPU] = container_cpu.render(runs)


def _namespace_for(test_name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-").removeprefix("test-")
    return f"e2e-{slug[:40].rstrip('-')}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="session")
def e2e_scripts(
    request: pytest.FixtureRequest, e2e_env: scenario.Environment
) -> Iterator[dict[str, scenario.ScriptRun]]:
    """Every selected scenario's script, started at once, each in its own namespace."""
    gate = threading.Semaphore(int(os.environ.get(CONCURRENCY_ENV, "2")))
    runs: dict[str, scenario.ScriptRun] = {}
    for item in request.session.items:
        marker = item.get_closest_marker("e2e_script")
        if marker is None:
            continue
        namespace = _namespace_for(item.name)
        e2e_env.cluster.kubectl("create", "namespace", namespace)
        run = scenario.Scenario(e2e_env, namespace, title=f"{item.name} (namespace {namespace})")
        runs[item.nodeid] = scenario.ScriptRun(run, marker.args[0], gate, on_error=save_driver_logs).start()
    yield runs
    for script_run in runs.values():
        e2e_env.cluster.kubectl(
            "delete", "namespace", script_run.scenario.namespace, "--wait=false", check=False
        )


@pytest.fixture
def e2e_script(
    request: pytest.FixtureRequest, e2e_scripts: dict[str, scenario.ScriptRun]
) -> Iterator[scenario.ScriptRun]:
    """This test's running script: ``outcome()`` waits for it and returns ``(scenario, facts)``."""
    script_run = e2e_scripts[request.node.nodeid]
    request.node.stash[_SCENARIO] = script_run.scenario
    try:
        yield script_run
    finally:
        rendered = script_run.scenario.finish()  # stops its watches: a script still waiting fails
        request.config.stash[_TIMELINES].append((request.node.name, rendered))
        print(rendered)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    if report.failed and report.when in ("call", "setup"):
        env = item.config.stash.get(_ENV, None)
        run = item.stash.get(_SCENARIO, None)
        if env is not None:
            report.sections.append(("operator log", install.operator_log_tail(env.cluster, env.release)))
            if diagnostics := env.cluster.diagnostics():
                report.sections.append(("cluster logs", diagnostics))
            if env.object_store is not None:
                store = env.object_store.process
                report.sections.append((f"S3 server log ({store.log_path})", store.log_tail(num_lines=120)))
        if env is not None and run is not None:
            # Read when the script failed (its job is deleted after it), else now.
            saved = run.saved_driver_logs
            for name, text in (saved if saved is not None else driver_logs(env, run.namespace)).items():
                report.sections.append((f"pod log {name}", text))
        if run is not None:
            report.sections.append(("timeline so far", run.timeline.render()))
    return report


def save_driver_logs(run: scenario.Scenario) -> None:
    """A failed script's driver logs, kept on the scenario before ``release`` deletes its job."""
    try:
        run.saved_driver_logs = driver_logs(run.env, run.namespace)
    except Exception as error:  # diagnostics only: never hide the script's own failure
        run.saved_driver_logs = {"(not read)": repr(error)}


def driver_logs(env: scenario.Environment, namespace: str, num_lines: int = 60) -> dict[str, str]:
    """The last lines of the Ray pods' logs in the namespace, as a user reads them with ``kubectl logs``:
    the head's ``trainer-log`` container (the job driver's log, rayjob.LOG_CONTAINER) and each worker's
    ``ray-worker`` container (its raylet and the Ray workers' output). ``kubectl logs`` rather than
    ``kubectl exec``: a stalled pod's logs are what explain a stall, and they need no process in it."""
    found: dict[str, str] = {}
    for role, container in (("head", rayjob.LOG_CONTAINER), ("worker", rayjob.WORKER_CONTAINER)):
        pods = env.cluster.kubectl(
            "get", "pods", "-n", namespace, "-l", f"ray.io/node-type={role}", "-o", "name", check=False
        ).stdout.split()
        for pod in pods:
            result = env.cluster.kubectl(
                "logs", "-n", namespace, pod, "-c", container, f"--tail={num_lines}", check=False
            )
            found[f"{pod.removeprefix('pod/')} ({container})"] = result.stdout or result.stderr
    return found


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if cpu := config.stash.get(_CONTAINER_CPU, ""):
        terminalreporter.section("e2e container CPU (node agent, per pod role and container)")
        terminalreporter.write_line(cpu)
    timelines = config.stash.get(_TIMELINES, [])
    if not timelines:
        return
    terminalreporter.section("e2e timelines")
    setup = ", ".join(f"{what} {seconds:.1f}s" for what, seconds in config.stash.get(_SETUP_TIMINGS, []))
    terminalreporter.write_line(f"session setup (seconds since start): {setup}\n")
    for _, rendered in timelines:
        terminalreporter.write_line(rendered)
        terminalreporter.write_line("")
    target = os.environ.get(TIMELINES_FILE_ENV)
    if target:
        with Path(target).open("a") as out:
            out.write(f"session setup (seconds since start): {setup}\n\n")
            for _, rendered in timelines:
                out.write(rendered + "\n\n")
