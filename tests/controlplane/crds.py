"""Installing CustomResourceDefinitions into the test control plane and waiting until they are served.

Owns: where our CRDs live (``crds/`` at the repository root, generated from the pydantic models by
another part of the project), splitting YAML streams, create-or-server-side-apply, and the wait for
``Established``. It talks to the apiserver only through the ``Request`` callable it is given, so it does
not care how authentication is done.

CRDs are sent as YAML untouched: KubeRay's are over a megabyte each, too big for client-side apply's
last-applied annotation and seconds to parse with PyYAML, milliseconds for the apiserver.
"""

from __future__ import annotations

import concurrent.futures
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

REPO_ROOT = Path(__file__).resolve().parents[2]
#: Our CRDs, generated from the pydantic models (never hand-edited).
DEFAULT_CRD_DIR = REPO_ROOT / "crds"
_CRDS_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


class Request(Protocol):
    """``ControlPlane.request``: an admin request returning (HTTP status, decoded JSON body)."""

    def __call__(
        self, method: str, path: str, *, body: bytes | None = ..., content_type: str = ...
    ) -> tuple[int, dict[str, Any]]: ...


class CRDRejected(RuntimeError):
    """The apiserver refused a CRD; the message is the apiserver's, naming the field."""


def default_crd_paths(directory: Path = DEFAULT_CRD_DIR) -> tuple[Path, ...]:
    """Every ``*.yaml``/``*.yml`` in ``directory``, sorted; empty when the directory does not exist."""
    if not directory.is_dir():
        return ()
    return tuple(sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")]))


def split_yaml_documents(text: str) -> list[str]:
    """Split a multi-document YAML stream on ``---`` lines, dropping empty and comment-only documents."""
    documents = re.split(r"^---[ \t]*(?:#.*)?$", text, flags=re.MULTILINE)
    meaningful = []
    for document in documents:
        body = [line for line in document.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        if body:
            meaningful.append(document)
    return meaningful


def install(request: Request, paths: Sequence[Path], *, timeout_s: float) -> list[str]:
    """Create (server-side apply when present) every CRD in ``paths``; return names once all are Established.

    Sent concurrently: the apiserver spends most of each request compiling the schema.
    """
    documents = [(path, document) for path in paths for document in split_yaml_documents(path.read_text())]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        names = list(pool.map(lambda item: _create_or_apply(request, *item), documents))
    wait_established(request, names, timeout_s=timeout_s)
    return names


def _create_or_apply(request: Request, path: Path, document: str) -> str:
    status, body = request("POST", _CRDS_PATH, body=document.encode(), content_type="application/yaml")
    if status == 409:
        status, body = request(
            "PATCH",
            f"{_CRDS_PATH}/{body['details']['name']}?fieldManager=trainop-controlplane&force=true",
            body=document.encode(),
            content_type="application/apply-patch+yaml",
        )
    if status not in (200, 201):
        raise CRDRejected(f"the apiserver rejected the CRD in {path} ({status}): {body.get('message', body)}")
    name: str = body["metadata"]["name"]
    return name


def wait_established(request: Request, names: Sequence[str], *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(names)
    while pending:
        status, body = request("GET", f"{_CRDS_PATH}/{pending[0]}")
        # status.conditions is null until the apiextensions controllers have looked at the new object.
        raw_conditions = (body.get("status") or {}).get("conditions") or []
        conditions = {condition["type"]: condition["status"] for condition in raw_conditions}
        if status == 200 and conditions.get("Established") == "True":
            pending.pop(0)
            continue
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRD {pending[0]} not Established within {timeout_s:.0f}s: {conditions}")
        time.sleep(0.05)
