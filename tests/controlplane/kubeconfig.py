"""kubeconfig files for the test control plane: the admin's, the controller-manager's, and per-token ones.

Only writes files; it never talks to the cluster. Paths inside are absolute so a kubeconfig works from
any working directory (kubectl, helm, the kubernetes Python client and kopf all read the same file).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

CONTEXT = "trainop-test"


def write(
    path: Path,
    *,
    server: str,
    ca_cert_path: Path,
    client_cert_path: Path | None = None,
    client_key_path: Path | None = None,
    token: str | None = None,
    namespace: str = "default",
    user: str = "admin",
) -> Path:
    """Write a single-context kubeconfig authenticating with a client certificate or a bearer token.

    Exactly one of (client certificate + key) or ``token`` must be given: a kubeconfig carrying both
    would authenticate as the certificate's identity, silently hiding what the token may do.
    """
    if (token is None) == (client_cert_path is None):
        raise ValueError("give either a client certificate and key or a token, not both or neither")
    credentials: dict[str, Any]
    if token is not None:
        credentials = {"token": token}
    else:
        assert client_cert_path is not None and client_key_path is not None
        credentials = {
            "client-certificate": str(client_cert_path),
            "client-key": str(client_key_path),
        }
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": CONTEXT, "cluster": {"server": server, "certificate-authority": str(ca_cert_path)}}
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [
            {"name": CONTEXT, "context": {"cluster": CONTEXT, "user": user, "namespace": namespace}}
        ],
        "current-context": CONTEXT,
        "preferences": {},
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        yaml.safe_dump(config, file, sort_keys=False)
    return path
