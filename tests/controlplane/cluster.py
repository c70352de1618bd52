"""A real Kubernetes control plane on loopback: etcd + kube-apiserver (+ kube-controller-manager).

Owns the lifecycle of one such cluster: a data dir under the system temp dir (dirs that killed runs left
are removed at start: ``remove_leftovers``), a fresh PKI, starting the
processes (their flags live in ``flags.py``) on free ports, readiness (etcd /health, apiserver /readyz,
controller-manager /healthz), installing CRDs at start (``crds.py``: ours and KubeRay's, waited until
Established), kubeconfigs, and teardown that leaves no process behind. It also offers the handful of
helpers integration tests share: namespaces, ServiceAccount tokens via the TokenRequest API, an
ApiClient, and kubectl/helm invocations with a hermetic environment.

What it deliberately does not run: a scheduler or kubelet (no pod ever runs; KubeRay's Go controller is
absent too, so RayJobs are stored and validated but never reconciled). The controller-manager runs only
the garbage collector, namespace and serviceaccount(-token) controllers, so owner references and namespace
deletion behave as in a real cluster.
"""

from __future__ import annotations

import atexit
import base64
import dataclasses
import functools
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import kubernetes

from . import assets as assets_module
from . import crds, flags, kubeconfig, pki, processes

REPO_ROOT = crds.REPO_ROOT
_PORT_RETRIES = 3
_DATA_DIR_PREFIX = "trainop-controlplane-"
#: In each data dir while its control plane runs: the owning test process (pid and start time).
_OWNER_FILE = "owner"


def _process_identity(pid: int) -> str | None:
    """``"<pid> <start time in clock ticks>"`` of a live process, None if there is none (a reused pid
    has another start time, so a dead owner is never mistaken for a live one)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return f"{pid} {stat.rsplit(')', 1)[1].split()[19]}"


def remove_leftovers(parent: Path) -> list[Path]:
    """Remove the data dirs under ``parent`` that a killed run left (its owner process is gone: a SIGKILL
    or a crash skips ``stop``): etcd data and logs of dead clusters otherwise fill the disk, run after
    run. Dirs of live runs and dirs kept on purpose (no owner file) stay. Returns what was removed."""
    removed = []
    for entry in parent.glob(f"{_DATA_DIR_PREFIX}*"):
        try:
            owner = (entry / _OWNER_FILE).read_text().strip()
        except OSError:
            continue
        pid = owner.split(" ", 1)[0]
        if not pid.isdigit() or _process_identity(int(pid)) != owner:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


@dataclasses.dataclass(frozen=True, kw_only=True)
class ControlPlaneSettings:
    """How to start a :class:`ControlPlane`."""

    #: CRD YAML files to install after the apiserver is ready (multi-document files are fine).
    crd_paths: Sequence[Path] = ()
    #: Install KubeRay's RayCluster and RayJob CRDs from the asset cache.
    install_kuberay_crds: bool = True
    #: Start kube-controller-manager (garbage collection, namespace deletion, default ServiceAccounts).
    controller_manager: bool = True
    #: Parent of the data dir; None means the system temp dir.
    root_dir: Path | None = None
    #: Keep the data dir (logs, etcd data, certificates) after stop, for post-mortems.
    keep_data_dir: bool = False
    #: Per-phase timeout.
    start_timeout_s: float = 60.0
    extra_apiserver_args: Sequence[str] = ()
    #: The apiserver's bind and advertise address. Loopback by default; a bed's root-veth address
    #: (``tests.clusterbed.network``) lets pods reach it, and adds it to the serving certificate.
    bind_address: str = "127.0.0.1"
    #: Pass the apiserver its kubelet client certificate and the CA for kubelet serving certificates
    #: (``kubectl logs``/``exec`` through a node agent).
    kubelet_client_auth: bool = False
    #: The controller-manager's ``--controllers``.
    controllers: Sequence[str] = flags.CONTROLLERS
    extra_controller_manager_args: Sequence[str] = ()


class ControlPlane:
    """One running cluster. Use as a context manager, or call :meth:`start` and :meth:`stop`."""

    def __init__(self, *, assets: assets_module.Assets, settings: ControlPlaneSettings | None = None) -> None:
        if not assets.runnable:
            raise assets_module.AssetsUnavailable(f"missing {assets.missing}; {assets_module.HOW_TO_ENABLE}")
        self.assets = assets
        self.settings = settings or ControlPlaneSettings()
        if self.settings.install_kuberay_crds and not assets.kuberay_crds:
            raise assets_module.AssetsUnavailable(
                f"no KubeRay CRDs in {assets_module.cache_root()}; {assets_module.HOW_TO_BUILD}"
            )
        self._data_dir: Path | None = None
        self._pki: pki.ControlPlanePKI | None = None
        self.server_url = ""
        #: etcd's client URL (plain HTTP on loopback), for tests that change what is stored behind the
        #: apiserver's back (``etcd_delete``).
        self.etcd_url = ""
        self.kubeconfig_path = Path()
        #: Seconds each start phase took (etcd, apiserver, crds, controller_manager, total).
        self.timings: dict[str, float] = {}
        #: Names of the CRDs installed at start.
        self.crd_names: list[str] = []
        self._processes: dict[str, processes.ManagedProcess] = {}
        #: Each component's readiness probe (on its ports), for :meth:`restart`.
        self._ready_probes: dict[str, Callable[[], bool]] = {}
        self._ssl_context: ssl.SSLContext | None = None
        self._api_client: kubernetes.client.ApiClient | None = None

    @property
    def data_dir(self) -> Path:
        """Logs (``logs/<component>.log``), etcd data, certificates and kubeconfigs of this cluster."""
        if self._data_dir is None:
            raise RuntimeError("control plane not started")
        return self._data_dir

    @property
    def pki(self) -> pki.ControlPlanePKI:
        if self._pki is None:
            raise RuntimeError("control plane not started")
        return self._pki

    # ------------------------------------------------------------------------------------ lifecycle
    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start etcd and the apiserver, install CRDs, start the controller-manager; raise with log tails."""
        started = time.monotonic()
        root = self.settings.root_dir
        if root is not None:
            root.mkdir(parents=True, exist_ok=True)
        remove_leftovers(Path(root) if root is not None else Path(tempfile.gettempdir()))
        self._data_dir = Path(tempfile.mkdtemp(prefix=_DATA_DIR_PREFIX, dir=root))
        (self._data_dir / _OWNER_FILE).write_text(_process_identity(os.getpid()) or "")
        atexit.register(self.stop)
        try:
            self._pki = pki.generate(self.data_dir / "pki", extra_serving_ips=(self.settings.bind_address,))
            etcd_url = self._start_etcd()
            self._start_apiserver(etcd_url)
            self._install_crds()
            if self.settings.controller_manager and self.assets.kube_controller_manager is not None:
                self._start_controller_manager()
        except BaseException:
            self.stop(keep_data_dir=True)
            self._prune_data_dir_to_logs()
            raise
        self.timings["total"] = time.monotonic() - started

    def stop(self, *, keep_data_dir: bool | None = None) -> None:
        """Stop every process (controller-manager, apiserver, etcd) and remove the data dir. Idempotent."""
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            if (process := self._processes.pop(name, None)) is not None:
                process.stop()
        if self._api_client is not None:
            self._api_client.close()  # type: ignore[no-untyped-call]
            self._api_client = None
        keep = self.settings.keep_data_dir if keep_data_dir is None else keep_data_dir
        if self._data_dir is not None and not keep:
            shutil.rmtree(self._data_dir, ignore_errors=True)
        elif self._data_dir is not None:
            # kept on purpose (post-mortem): no longer a leftover for the next run to remove
            (self._data_dir / _OWNER_FILE).unlink(missing_ok=True)
        atexit.unregister(self.stop)

    def restart(
        self, name: str, *, down_s: float = 0.0, while_down: Callable[[], object] | None = None
    ) -> float:
        """Stop one component ("etcd", "kube-apiserver", "kube-controller-manager") and start it again with
        the same command line, so on the same ports and data (clients see a real restart's outage); stay
        down ``down_s`` seconds in between, and call ``while_down`` then. Returns the seconds from the new
        start until it was ready."""
        process = self._processes[name]
        process.stop()
        time.sleep(down_s)
        if while_down is not None:
            while_down()
        started = processes.ManagedProcess.start(name=name, argv=process.argv, log_path=process.log_path)
        self._processes[name] = started
        return started.wait_healthy(
            self._ready_probes[name], timeout_s=self.settings.start_timeout_s, what="did not become ready"
        )

    def etcd_delete(self, key: str) -> int:
        """Delete one key from etcd directly (its v3 JSON gateway), as if the object had been deleted while
        nobody watched: with the apiserver stopped, nothing sees a DELETED event. Kubernetes keeps an object
        at ``/registry/<resource>/<namespace>/<name>`` (``/registry/<group>/<resource>/...`` for a custom
        resource). Returns how many keys were deleted."""
        request = urllib.request.Request(
            f"{self.etcd_url}/v3/kv/deleterange",
            data=json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(json.load(response).get("deleted") or 0)

    def _prune_data_dir_to_logs(self) -> None:
        """After a failed start keep only ``logs/`` (named in the error), not etcd data or keys."""
        if self._data_dir is None or self.settings.keep_data_dir:
            return
        for entry in self._data_dir.iterdir():
            if entry.name != "logs":
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)

    # ------------------------------------------------------------------------------------ processes
    def _log_path(self, name: str) -> Path:
        return self.data_dir / "logs" / f"{name}.log"

    def _start_with_free_ports(
        self,
        name: str,
        *,
        num_ports: int,
        argv_for: Callable[[list[int]], list[str]],
        ready: Callable[[list[int]], bool],
    ) -> list[int]:
        """Start ``name`` on fresh loopback ports, retrying when a port was taken between pick and bind."""
        for attempt in range(1, _PORT_RETRIES + 1):
            ports = processes.free_loopback_ports(num_ports)
            process = processes.ManagedProcess.start(
                name=name, argv=argv_for(ports), log_path=self._log_path(name)
            )
            self._processes[name] = process
            try:
                process.wait_healthy(
                    functools.partial(ready, ports),
                    timeout_s=self.settings.start_timeout_s,
                    what="did not become ready",
                )
                self._ready_probes[name] = functools.partial(ready, ports)
                return ports
            except processes.ProcessFailed:
                process.stop()
                port_taken = "address already in use" in process.log_tail(num_lines=200)
                if not port_taken or attempt == _PORT_RETRIES:
                    raise
        raise AssertionError("unreachable")

    def _start_etcd(self) -> str:
        assert self.assets.etcd is not None
        started = time.monotonic()

        def argv(ports: list[int]) -> list[str]:
            return [
                str(self.assets.etcd),
                *flags.etcd_args(data_dir=self.data_dir / "etcd", client_port=ports[0], peer_port=ports[1]),
            ]

        ports = self._start_with_free_ports(
            "etcd",
            num_ports=2,
            argv_for=argv,
            ready=lambda ports: processes.http_ok(f"http://127.0.0.1:{ports[0]}/health"),
        )
        self.timings["etcd"] = time.monotonic() - started
        self.etcd_url = f"http://127.0.0.1:{ports[0]}"
        return self.etcd_url

    def _start_apiserver(self, etcd_url: str) -> None:
        assert self.assets.kube_apiserver is not None
        started = time.monotonic()
        tls = self.pki
        context = ssl.create_default_context(cafile=str(tls.ca_cert_path))
        context.load_cert_chain(str(tls.admin.cert_path), str(tls.admin.key_path))
        self._ssl_context = context

        def argv(ports: list[int]) -> list[str]:
            return [
                str(self.assets.kube_apiserver),
                *flags.apiserver_args(
                    etcd_url=etcd_url,
                    port=ports[0],
                    cert_dir=self.data_dir / "apiserver-certs",
                    tls=tls,
                    extra=self.settings.extra_apiserver_args,
                    bind_address=self.settings.bind_address,
                    kubelet_client_auth=self.settings.kubelet_client_auth,
                ),
            ]

        host = self.settings.bind_address
        ports = self._start_with_free_ports(
            "kube-apiserver",
            num_ports=1,
            argv_for=argv,
            ready=lambda ports: (
                processes.https_status(f"https://{host}:{ports[0]}/readyz", ssl_context=context)[0] == 200
            ),
        )
        self.server_url = f"https://{host}:{ports[0]}"
        self.kubeconfig_path = kubeconfig.write(
            self.data_dir / "kubeconfig",
            server=self.server_url,
            ca_cert_path=tls.ca_cert_path,
            client_cert_path=tls.admin.cert_path,
            client_key_path=tls.admin.key_path,
        )
        self.timings["apiserver"] = time.monotonic() - started

    def _start_controller_manager(self) -> None:
        assert self.assets.kube_controller_manager is not None
        started = time.monotonic()
        tls = self.pki
        config = kubeconfig.write(
            self.data_dir / "controller-manager.kubeconfig",
            server=self.server_url,
            ca_cert_path=tls.ca_cert_path,
            client_cert_path=tls.controller_manager.cert_path,
            client_key_path=tls.controller_manager.key_path,
            user="system:kube-controller-manager",
        )
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # its serving cert is self-signed in --cert-dir; loopback only

        def argv(ports: list[int]) -> list[str]:
            return [
                str(self.assets.kube_controller_manager),
                *flags.controller_manager_args(
                    kubeconfig=config,
                    port=ports[0],
                    cert_dir=self.data_dir / "controller-manager-certs",
                    tls=tls,
                    controllers=self.settings.controllers,
                    extra=self.settings.extra_controller_manager_args,
                ),
            ]

        self._start_with_free_ports(
            "kube-controller-manager",
            num_ports=1,
            argv_for=argv,
            ready=lambda ports: (
                processes.https_status(f"https://127.0.0.1:{ports[0]}/healthz", ssl_context=insecure)[0]
                == 200
            ),
        )
        self.timings["controller_manager"] = time.monotonic() - started

    # -------------------------------------------------------------------------------------- requests
    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, dict[str, Any]]:
        """Raw admin request to the apiserver; returns (HTTP status, decoded JSON body)."""
        assert self._ssl_context is not None, "control plane not started"
        request = urllib.request.Request(
            self.server_url + path,
            data=body,
            method=method,
            headers={"Content-Type": content_type, "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, context=self._ssl_context, timeout=60) as response:
                return int(response.status), json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as error:
            return int(error.code), json.loads(error.read() or b"{}")

    # ------------------------------------------------------------------------------------------ CRDs
    def _install_crds(self) -> None:
        started = time.monotonic()
        paths = list(self.settings.crd_paths)
        if self.settings.install_kuberay_crds:
            paths += self.assets.kuberay_crds
        self.crd_names = self.install_crds(paths)
        self.timings["crds"] = time.monotonic() - started

    def install_crds(self, paths: Sequence[Path], *, timeout_s: float | None = None) -> list[str]:
        """Create (or server-side apply) every CRD in ``paths``; return their names once Established.

        CRDs installed after start reach the garbage collector at its next discovery resync (~30 s);
        owner references to their kinds are honoured from then on.
        """
        return crds.install(self.request, paths, timeout_s=timeout_s or self.settings.start_timeout_s)

    # ------------------------------------------------------------------------------------ inspection
    @property
    def controller_manager_running(self) -> bool:
        process = self._processes.get("kube-controller-manager")
        return process is not None and process.is_running()

    def all_running(self) -> bool:
        """True while every started component is still alive."""
        return bool(self._processes) and all(process.is_running() for process in self._processes.values())

    def rss_bytes(self) -> dict[str, int | None]:
        """Resident memory of each running component, for the docs' numbers and leak hunting."""
        return {name: process.rss_bytes() for name, process in self._processes.items()}

    def pids(self) -> dict[str, int]:
        return {name: process.pid for name, process in self._processes.items()}

    def log_tails(self, *, num_lines: int = 30) -> str:
        """Last lines of every component's log, for failure reports."""
        return "\n".join(
            f"----- {name} ({process.log_path}) -----\n{process.log_tail(num_lines=num_lines)}"
            for name, process in self._processes.items()
        )

    # --------------------------------------------------------------------------------------- clients
    def api_client(self, *, token: str | None = None) -> kubernetes.client.ApiClient:
        """An ApiClient as the admin (shared: do not close it) or as bearer ``token`` (new: caller closes)."""
        if token is None and self._api_client is not None:
            return self._api_client
        configuration = kubernetes.client.Configuration()
        configuration.host = self.server_url
        configuration.ssl_ca_cert = str(self.pki.ca_cert_path)
        if token is None:
            configuration.cert_file = str(self.pki.admin.cert_path)
            configuration.key_file = str(self.pki.admin.key_path)
            self._api_client = kubernetes.client.ApiClient(configuration)
            return self._api_client
        configuration.api_key = {"BearerToken": f"Bearer {token}"}
        return kubernetes.client.ApiClient(configuration)

    def kubeconfig_for_token(self, token: str, *, namespace: str = "default") -> Path:
        """Write a kubeconfig that authenticates only with ``token`` (no client certificate)."""
        path = self.data_dir / f"kubeconfig-token-{uuid.uuid4().hex[:8]}"
        return kubeconfig.write(
            path,
            server=self.server_url,
            ca_cert_path=self.pki.ca_cert_path,
            token=token,
            namespace=namespace,
            user="token",
        )

    def tool_env(self, *, kubeconfig_path: Path | None = None) -> dict[str, str]:
        """Environment for kubectl/helm/kopf subprocesses: our kubeconfig, caches inside the data dir.

        kubectl and helm otherwise write discovery caches and repository state under $HOME.
        """
        tool_dirs = [str(path.parent) for path in (self.assets.kubectl, self.assets.helm) if path is not None]
        return {
            **os.environ,
            "KUBECONFIG": str(kubeconfig_path or self.kubeconfig_path),
            "KUBECACHEDIR": str(self.data_dir / "kube-cache"),
            "HELM_CACHE_HOME": str(self.data_dir / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(self.data_dir / "helm" / "config"),
            "HELM_DATA_HOME": str(self.data_dir / "helm" / "data"),
            "PATH": os.pathsep.join([*dict.fromkeys(tool_dirs), os.environ.get("PATH", "")]),
        }

    def _run_tool(
        self,
        binary: Path | None,
        name: str,
        args: Sequence[str],
        *,
        kubeconfig_path: Path | None,
        input: str | None,
        check: bool,
        timeout_s: float,
    ) -> subprocess.CompletedProcess[str]:
        if binary is None:
            raise assets_module.AssetsUnavailable(f"no {name} binary; {assets_module.HOW_TO_BUILD}")
        result = subprocess.run(
            [str(binary), *args],
            env=self.tool_env(kubeconfig_path=kubeconfig_path),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, result.args, result.stdout, result.stderr)
        return result

    def kubectl(
        self,
        *args: str,
        kubeconfig_path: Path | None = None,
        input: str | None = None,
        check: bool = True,
        timeout_s: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run our kubectl against this cluster; with ``check``, raise CalledProcessError on failure."""
        return self._run_tool(
            self.assets.kubectl,
            "kubectl",
            args,
            kubeconfig_path=kubeconfig_path,
            input=input,
            check=check,
            timeout_s=timeout_s,
        )

    def helm(
        self,
        *args: str,
        kubeconfig_path: Path | None = None,
        input: str | None = None,
        check: bool = True,
        timeout_s: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """Run our helm against this cluster with hermetic HELM_*_HOME dirs."""
        return self._run_tool(
            self.assets.helm,
            "helm",
            args,
            kubeconfig_path=kubeconfig_path,
            input=input,
            check=check,
            timeout_s=timeout_s,
        )

    # ------------------------------------------------------------------------------ namespaced helpers
    def create_namespace(self, name: str | None = None, *, prefix: str = "test-") -> str:
        """Create a namespace (a unique ``prefix``-name when ``name`` is None) and return its name."""
        name = name or f"{prefix}{uuid.uuid4().hex[:10]}"
        core = kubernetes.client.CoreV1Api(self.api_client())
        core.create_namespace(
            kubernetes.client.V1Namespace(metadata=kubernetes.client.V1ObjectMeta(name=name))
        )
        return name

    def delete_namespace(self, name: str, *, wait: bool = False, timeout_s: float = 60) -> None:
        """Delete a namespace; with ``wait``, until it is gone (needs the controller-manager running)."""
        core = kubernetes.client.CoreV1Api(self.api_client())
        try:
            core.delete_namespace(name)
        except kubernetes.client.ApiException as error:
            if error.status != 404:
                raise
            return
        deadline = time.monotonic() + timeout_s
        while wait:
            try:
                core.read_namespace(name)
            except kubernetes.client.ApiException as error:
                if error.status == 404:
                    return
                raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"namespace {name} still present {timeout_s:.0f}s after deletion")
            time.sleep(0.2)

    def service_account_token(
        self,
        namespace: str,
        name: str,
        *,
        create: bool = True,
        audiences: Sequence[str] = (),
        expiration_seconds: int = 3600,
    ) -> str:
        """A bound token for ServiceAccount ``namespace/name`` from the TokenRequest API.

        Creates the ServiceAccount first when ``create`` (an existing one is fine). ``audiences`` default
        to the apiserver's own (--api-audiences), so the token authenticates against this cluster.
        """
        core = kubernetes.client.CoreV1Api(self.api_client())
        if create:
            try:
                core.create_namespaced_service_account(
                    namespace,
                    kubernetes.client.V1ServiceAccount(metadata=kubernetes.client.V1ObjectMeta(name=name)),
                )
            except kubernetes.client.ApiException as error:
                if error.status != 409:
                    raise
        request = kubernetes.client.AuthenticationV1TokenRequest(
            spec=kubernetes.client.V1TokenRequestSpec(
                audiences=list(audiences), expiration_seconds=expiration_seconds
            )
        )
        response = core.create_namespaced_service_account_token(name, namespace, request)
        if response.status is None or not response.status.token:
            raise RuntimeError(f"TokenRequest for {namespace}/{name} returned no token")
        return response.status.token
