"""STAND-IN for a node-local storage driver (what rancher's local-path-provisioner or a CSI driver with
the external-provisioner sidecar does), part of the cluster bed's one declared stand-in, the node agent.

It serves StorageClasses whose ``provisioner`` is :data:`PROVISIONER`, which must use
``volumeBindingMode: WaitForFirstConsumer`` (the only mode a node-local volume can honour). The protocol
is the external-provisioner's, so the real parts around it do the real work:

1. The operator creates a claim; the apiserver's DefaultStorageClass admission gives it the default class.
2. kube-scheduler, scheduling the claim's first pod, picks a node and writes it on the claim as the
   ``volume.kubernetes.io/selected-node`` annotation; kube-controller-manager's PV binder marks the claim
   for an external provisioner (``volume.kubernetes.io/storage-provisioner``).
3. Here: a directory under ``<state>/volumes/`` and a ``local`` PersistentVolume with a required node
   affinity on the selected node and a ``claimRef`` to the claim.
4. The PV binder binds the two; the scheduler then keeps every later pod of the claim on that node, which
   is what a ReadWriteOnce block volume does on a real cluster (all pods of a job on one node).
5. A released volume of a ``Delete`` class: the directory goes, then the PersistentVolume.

Everything is driven by watches (claims and volumes), re-listed on expiry; every step is idempotent, so a
restart of the provisioner loses nothing. It must not touch claims or volumes of other provisioners.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import kubernetes

PROVISIONER = "trainop.dev/node-local"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
STORAGE_PROVISIONER = "volume.kubernetes.io/storage-provisioner"
BETA_STORAGE_PROVISIONER = "volume.beta.kubernetes.io/storage-provisioner"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
HOSTNAME_LABEL = "kubernetes.io/hostname"

log = logging.getLogger("node-local-provisioner")


def volume_name(claim: dict[str, Any]) -> str:
    return f"pvc-{claim['metadata']['uid']}"


def desired_volume(claim: dict[str, Any], storage_class: dict[str, Any], path: Path) -> dict[str, Any]:
    """The PersistentVolume for ``claim`` on the node the scheduler selected. Pure."""
    meta = claim["metadata"]
    spec = claim.get("spec") or {}
    node = meta["annotations"][SELECTED_NODE]
    request = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": volume_name(claim), "annotations": {PROVISIONED_BY: PROVISIONER}},
        "spec": {
            "capacity": {"storage": request},
            "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
            "volumeMode": spec.get("volumeMode") or "Filesystem",
            "persistentVolumeReclaimPolicy": storage_class.get("reclaimPolicy") or "Delete",
            "storageClassName": storage_class["metadata"]["name"],
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
            "local": {"path": str(path)},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}]}
                    ]
                }
            },
        },
    }


def wants_volume(claim: dict[str, Any], classes: dict[str, dict[str, Any]]) -> bool:
    """A pending, unbound claim of one of our classes whose consumer the scheduler has placed."""
    meta = claim["metadata"]
    annotations = meta.get("annotations") or {}
    spec = claim.get("spec") or {}
    class_name = spec.get("storageClassName") or ""
    return (
        class_name in classes
        and not spec.get("volumeName")
        and not meta.get("deletionTimestamp")
        and SELECTED_NODE in annotations
        and PROVISIONER in (annotations.get(STORAGE_PROVISIONER), annotations.get(BETA_STORAGE_PROVISIONER))
    )


class NodeLocalProvisioner:
    def __init__(self, *, api_client: Any, volumes_dir: Path) -> None:
        # Any: the kubernetes client's generated API is only partly typed.
        self.core: Any = kubernetes.client.CoreV1Api(api_client)
        self.storage: Any = kubernetes.client.StorageV1Api(api_client)
        self.api_client: Any = api_client
        self.volumes_dir = volumes_dir
        self.stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.volumes_dir.mkdir(parents=True, exist_ok=True)
        for target, name in ((self._watch_claims, "claims"), (self._watch_volumes, "volumes")):
            thread = threading.Thread(target=self._forever, args=(target,), name=f"provisioner-{name}")
            thread.daemon = True
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self.stopping.set()
        for thread in self._threads:
            thread.join(timeout=10)

    def _forever(self, watch_once: Any) -> None:
        while not self.stopping.is_set():
            try:
                watch_once()
            except Exception:  # a dropped watch or an apiserver restart: list and watch again
                if not self.stopping.is_set():
                    log.exception("watch failed; re-listing in 1 s")
                    time.sleep(1)

    def _classes(self) -> dict[str, dict[str, Any]]:
        items = self.storage.list_storage_class().items
        return {
            c.metadata.name: self.api_client.sanitize_for_serialization(c)
            for c in items
            if c.provisioner == PROVISIONER
        }

    def _stream(self, list_fn: Any) -> Any:
        watch: Any = kubernetes.watch.Watch()  # type: ignore[no-untyped-call]
        listed = list_fn(_preload_content=False)
        import json

        body = json.loads(listed.data)
        yield from body.get("items") or ()
        for event in watch.stream(
            list_fn, resource_version=body["metadata"]["resourceVersion"], timeout_seconds=300
        ):
            if self.stopping.is_set():
                watch.stop()
                return
            if event["type"] in ("ADDED", "MODIFIED"):
                yield self.api_client.sanitize_for_serialization(event["object"])

    # --------------------------------------------------------------------------------------- claims
    def _watch_claims(self) -> None:
        for claim in self._stream(self.core.list_persistent_volume_claim_for_all_namespaces):
            classes = self._classes() if (claim.get("spec") or {}).get("storageClassName") else {}
            if wants_volume(claim, classes):
                self.provision(claim, classes[claim["spec"]["storageClassName"]])

    def provision(self, claim: dict[str, Any], storage_class: dict[str, Any]) -> None:
        path = self.volumes_dir / volume_name(claim)
        path.mkdir(mode=0o777, exist_ok=True)
        path.chmod(0o777)  # like local-path-provisioner: any pod uid may write a fresh volume
        try:
            self.core.create_persistent_volume(desired_volume(claim, storage_class, path))
        except kubernetes.client.ApiException as error:
            if error.status != 409:
                raise
            return
        meta = claim["metadata"]
        log.info(
            "provisioned %s for claim %s/%s on node %s",
            volume_name(claim),
            meta["namespace"],
            meta["name"],
            meta["annotations"][SELECTED_NODE],
        )

    # -------------------------------------------------------------------------------------- volumes
    def _watch_volumes(self) -> None:
        for volume in self._stream(self.core.list_persistent_volume):
            meta = volume["metadata"]
            spec = volume.get("spec") or {}
            if (meta.get("annotations") or {}).get(PROVISIONED_BY) != PROVISIONER:
                continue
            if (volume.get("status") or {}).get("phase") == "Released" and spec.get(
                "persistentVolumeReclaimPolicy"
            ) == "Delete":
                self.delete(volume)

    def delete(self, volume: dict[str, Any]) -> None:
        path = Path(volume["spec"]["local"]["path"])
        if path.parent == self.volumes_dir:
            shutil.rmtree(path, ignore_errors=True)
        try:
            self.core.delete_persistent_volume(volume["metadata"]["name"])
        except kubernetes.client.ApiException as error:
            if error.status != 404:
                raise
        log.info("deleted released volume %s", volume["metadata"]["name"])


def storage_class(name: str = "node-local", *, default: bool = True) -> dict[str, Any]:
    """The bed's StorageClass served by this provisioner (the cluster default unless ``default`` is False)."""
    annotations = {"storageclass.kubernetes.io/is-default-class": "true"} if default else {}
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name, "annotations": annotations},
        "provisioner": PROVISIONER,
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Delete",
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.clusterbed.provisioner", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--volumes-dir", required=True, type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    provisioner = NodeLocalProvisioner(
        api_client=kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=args.kubeconfig
        ),
        volumes_dir=args.volumes_dir,
    )
    provisioner.start()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        provisioner.stop()


if __name__ == "__main__":
    main()
