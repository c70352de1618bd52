"""Running a process with the credentials a pod gets, the way the kubelet hands them over.

In a pod, the ServiceAccount's token, the cluster's CA certificate and the namespace are files under
``/var/run/secrets/kubernetes.io/serviceaccount/``, and ``KUBERNETES_SERVICE_HOST``/``PORT`` name the
apiserver; the Kubernetes clients' in-cluster loaders (the operator's, kopf's, the trainer's) read exactly
those. ``PodIdentity.wrap`` runs a command in a private mount namespace (``unshare --mount``, root only)
with a tmpfs over ``/run`` (``/var/run`` links there) holding those three files, and an environment with
the two variables, no ``KUBECONFIG`` and an empty ``HOME`` (no ``~/.kube/config`` to fall back on). Nothing
outside the process sees the files; the host's ``/run`` is hidden from the process, not changed.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclasses.dataclass(frozen=True)
class PodIdentity:
    token: str
    ca_cert: Path
    namespace: str
    #: The apiserver, as KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT.
    host: str
    port: int

    def wrap(
        self, argv: Sequence[str], env: Mapping[str, str], work_dir: Path
    ) -> tuple[list[str], dict[str, str]]:
        files = work_dir / "serviceaccount"
        files.mkdir(parents=True, exist_ok=True)
        (files / "token").write_text(self.token)
        (files / "ca.crt").write_bytes(self.ca_cert.read_bytes())
        (files / "namespace").write_text(self.namespace)
        (work_dir / "home").mkdir(exist_ok=True)
        run = os.path.realpath("/var/run")  # /run on most systems
        script = (
            f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(run)} && mkdir -p {SERVICE_ACCOUNT_DIR} && "
            f'cp "$0/token" "$0/ca.crt" "$0/namespace" {SERVICE_ACCOUNT_DIR}/ && exec "$@"'
        )
        wrapped = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(files), *argv]
        pod_env = {key: value for key, value in env.items() if key != "KUBECONFIG"}
        pod_env |= {
            "KUBERNETES_SERVICE_HOST": self.host,
            "KUBERNETES_SERVICE_PORT": str(self.port),
            "HOME": str(work_dir / "home"),
        }
        return wrapped, pod_env
