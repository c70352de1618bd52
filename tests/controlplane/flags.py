"""Command lines of the control plane's processes: pure functions from paths and ports to argv.

Owns every flag we pass to etcd, kube-apiserver and kube-controller-manager and the reason for each one
that is not obvious. It starts nothing and touches no files; ``cluster.py`` runs what these return.

The choices favour a fast, single-user, throwaway cluster without giving up what tests observe: etcd
skips fsync, but authorization stays Node,RBAC, ServiceAccount admission stays on, and the
controller-manager's controllers act under their own bootstrap RBAC roles.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from pathlib import Path

from . import pki

SERVICE_CIDR = "10.0.0.0/24"
#: Issuer and audience of ServiceAccount tokens (kubeadm's default), so TokenRequest tokens authenticate.
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
#: The controller-manager's controllers: owner-reference garbage collection, namespace deletion, the
#: `default` ServiceAccount in every namespace, legacy token Secrets for whoever still creates them, and
#: pvc-protection -- without it a deleted claim keeps its ``kubernetes.io/pvc-protection`` finalizer, so
#: every test namespace that held one stayed Terminating and the namespace controller retried it for the
#: rest of the session (~0.6 of the 2 cores in the CI rehearsal of 2026-11-27).
CONTROLLERS = (
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "persistentvolumeclaim-protection-controller",
)


def etcd_args(*, data_dir: Path, client_port: int, peer_port: int) -> list[str]:
    client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    return [
        "--name=trainop-test",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=trainop-test={peer}",
        # Throwaway data: skipping fsync makes every apiserver write several times cheaper.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def apiserver_args(
    *,
    etcd_url: str,
    port: int,
    cert_dir: Path,
    tls: pki.ControlPlanePKI,
    extra: Sequence[str] = (),
    bind_address: str = "127.0.0.1",
    kubelet_client_auth: bool = False,
) -> list[str]:
    """``bind_address`` other than loopback (a bed's root veth) also turns the endpoint reconciler on, so
    the ``kubernetes`` Service points at it; ``kubelet_client_auth`` adds the flags with which the
    apiserver reaches kubelet endpoints (``kubectl logs``/``exec``): its client certificate, and the
    cluster CA to verify the kubelet's serving certificate, at the node's InternalIP."""
    loopback = ipaddress.ip_address(bind_address).is_loopback
    kubelet = (
        [
            f"--kubelet-client-certificate={tls.kubelet_client.cert_path}",
            f"--kubelet-client-key={tls.kubelet_client.key_path}",
            f"--kubelet-certificate-authority={tls.ca_cert_path}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
        ]
        if kubelet_client_auth
        else []
    )
    return [
        f"--etcd-servers={etcd_url}",
        f"--bind-address={bind_address}",
        f"--advertise-address={bind_address}",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        f"--tls-cert-file={tls.serving.cert_path}",
        f"--tls-private-key-file={tls.serving.key_path}",
        f"--client-ca-file={tls.ca_cert_path}",
        "--authorization-mode=Node,RBAC",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={tls.service_account_public_key_path}",
        f"--service-account-signing-key-file={tls.service_account_private_key_path}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        "--profiling=false",
        # Since 1.37 the endpoint reconciler refuses a loopback advertise address; nothing runs
        # in-cluster that would use the `kubernetes` Service endpoints anyway. On a bed address pods
        # do reach the apiserver through that Service, so its endpoints are kept (lease reconciler).
        "--endpoint-reconciler-type=none" if loopback else "--endpoint-reconciler-type=lease",
        *kubelet,
        *extra,
    ]


def controller_manager_args(
    *,
    kubeconfig: Path,
    port: int,
    cert_dir: Path,
    tls: pki.ControlPlanePKI,
    controllers: Sequence[str] = CONTROLLERS,
    extra: Sequence[str] = (),
) -> list[str]:
    return [
        # No --authentication/authorization-kubeconfig: delegated auth would poll for a request-header
        # CA this cluster has no use for. /healthz stays reachable: it is in
        # --authorization-always-allow-paths by default.
        f"--kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        "--leader-elect=false",
        f"--controllers={','.join(controllers)}",
        # Each controller acts as its own ServiceAccount under the bootstrap RBAC roles, as in kubeadm
        # clusters, instead of one all-powerful identity.
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={tls.service_account_private_key_path}",
        f"--root-ca-file={tls.ca_cert_path}",
        # Namespace teardown deletes every resource type; the default QPS (20) makes it crawl.
        "--kube-api-qps=200",
        "--kube-api-burst=400",
        *extra,
    ]
