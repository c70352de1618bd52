"""Rank 0's status records (and the driver's storage check) -> the CR's status subresource and a JSON file.

The records are built from the API's own models (``Progress``, ``CheckpointStatus``, ``NetworkStatus``,
``StorageStatus``, and ``trainop.api.experiment``'s ``EvaluationStatus``, ``ProfileStatus``,
``CommunicationStatus``, ``CostStatus``, ``TrackingStatus``) and serialised with their camelCase wire names,
so the trainer cannot drift from the CRD. Only the trainer's subtrees (``TRAINER_FIELDS``) are ever written
(JSON merge patches of those subtrees; ``status.storage`` by the driver, once per attempt, before any
worker starts; the others by rank 0): the operator owns every other status field.

Sinks:
- ``FileSink``: ``<runDir>/status.json``, always (local mode's driver renders it; on a cluster it is a handy
  copy on the volume or in the bucket).
- ``KubernetesSink``: when the config names a ``statusTarget``. Patches are sent by a background thread,
  latest record wins, so the train loop never waits on the API server. A failed patch is logged and retried
  with exponential backoff (1 s doubling to 60 s); records keep merging meanwhile, nothing crashes.

Kubernetes credentials, first match wins:
1. ``TRAINOP_KUBE_HOST`` + ``TRAINOP_KUBE_TOKEN_FILE`` (+ ``TRAINOP_KUBE_CA_FILE``; without it TLS is not
   verified) — for the e2e stand-in. The token file is re-read before every patch (rotated tokens).
2. In-cluster service-account credentials (``KUBERNETES_SERVICE_HOST`` is set in every pod).
3. ``KUBECONFIG`` / ``~/.kube/config``.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import threading
import time
from typing import Any, Protocol

from trainop.api import base, experiment, trainer_config, trainingjob
from trainop_trainer import run_record, storage
from trainop_trainer.checkpoint_store import Checkpoint

log = logging.getLogger(__name__)

FIELD_MANAGER = "trainop-trainer"
# The status subtrees the trainer writes; the operator owns the rest.
TRAINER_FIELDS = (
    "progress",
    "checkpoint",
    "network",
    "evaluation",
    "profile",
    "communication",
    "cost",
    "tracking",
    "storage",
    "workerFailures",
)
_MAX_BACKOFF_S = 60.0


class Sink(Protocol):
    def publish(self, records: dict[str, Any]) -> None: ...

    def close(self, timeout_s: float) -> None: ...


def _merge(into: dict[str, Any], records: dict[str, Any]) -> None:
    for key, value in records.items():
        into[key] = value


class FileSink:
    """The merged records as ``status.json``, written whole (``storage.write_text``). On the volume the write
    happens in ``publish``; in a bucket a background thread writes the latest state (an S3 PUT is too slow
    for the training thread), and ``close`` writes what is still pending."""

    def __init__(self, path: storage.RunDir) -> None:
        self.path = path
        self._state: dict[str, Any] = {}
        self._lock = threading.Lock()
        try:
            self._state = json.loads(path.read_text())
        except (OSError, ValueError):
            self._state = {}
        self._dirty = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        if isinstance(path, storage.StoragePath):
            self._thread = threading.Thread(target=self._write_behind, name="status-file", daemon=True)
            self._thread.start()

    def publish(self, records: dict[str, Any]) -> None:
        with self._lock:
            _merge(self._state, records)
            if self._thread is not None:
                self._dirty.set()
                return
            storage.write_text(self.path, json.dumps(self._state, indent=2, sort_keys=True))

    def _write_behind(self) -> None:
        while True:
            self._dirty.wait()
            with self._lock:
                self._dirty.clear()
                text = json.dumps(self._state, indent=2, sort_keys=True)
                closed = self._closed
            try:
                storage.write_text(self.path, text)
            except Exception as exc:
                log.warning("writing %s failed (%s); the next record tries again", self.path, exc)
            if closed:
                return

    def close(self, timeout_s: float) -> None:
        if self._thread is None:
            return
        with self._lock:
            self._closed = True
            self._dirty.set()
        self._thread.join(timeout_s)


def _kube_api() -> Any:
    from kubernetes import client, config

    host = os.environ.get("TRAINOP_KUBE_HOST")
    if host:
        configuration = client.Configuration()
        configuration.host = host
        ca_file = os.environ.get("TRAINOP_KUBE_CA_FILE")
        if ca_file:
            configuration.ssl_ca_cert = ca_file
        else:
            configuration.verify_ssl = False
        token_file = os.environ.get("TRAINOP_KUBE_TOKEN_FILE")
        if token_file:
            token_path = pathlib.Path(token_file)

            def refresh(cfg: Any) -> None:
                cfg.api_key["authorization"] = token_path.read_text().strip()

            configuration.api_key_prefix["authorization"] = "Bearer"
            refresh(configuration)  # the client only asks the hook once a key is present
            configuration.refresh_api_key_hook = refresh  # type: ignore[assignment]
        return client.CustomObjectsApi(client.ApiClient(configuration))
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    return client.CustomObjectsApi()


def read_status(
    config: trainer_config.TrainerConfig, *, status_file: storage.RunDir, api: Any = None
) -> dict[str, Any]:
    """The job's status as it is now (the driver reads the cumulative ``workerFailures`` and the operator's
    ``restartsByReason`` at its start): the CR's status subresource when the config names one (the trainer's
    Role may get it), else — or when that read fails — ``status.json``."""
    target = config.status_target
    if target is not None:
        try:
            api = api or _kube_api()
            obj = api.get_namespaced_custom_object_status(
                group=target.group,
                version=target.version,
                namespace=target.namespace,
                plural=target.plural,
                name=target.name,
                _request_timeout=10,
            )
            return dict(obj.get("status") or {})
        except Exception as exc:
            log.warning(
                "reading the status of %s/%s failed (%s); using %s",
                target.namespace,
                target.name,
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                status_file,
            )
    try:
        return dict(json.loads(status_file.read_text()))
    except (OSError, ValueError):
        return {}


class KubernetesSink:
    """Merge-patches ``status.<record>`` of the target CR from a background thread."""

    def __init__(self, target: trainer_config.StatusTarget, *, api: Any = None) -> None:
        self.target = target
        self._api = api
        self._pending: dict[str, Any] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._failures = 0
        self._sent = 0
        self._thread = threading.Thread(target=self._run, name="status-patch", daemon=True)
        self._thread.start()

    @property
    def patches_sent(self) -> int:
        return self._sent

    def publish(self, records: dict[str, Any]) -> None:
        with self._cond:
            _merge(self._pending, records)
            self._cond.notify()

    def _patch(self, records: dict[str, Any]) -> None:
        if self._api is None:
            self._api = _kube_api()
        target = self.target
        self._api.patch_namespaced_custom_object_status(
            group=target.group,
            version=target.version,
            namespace=target.namespace,
            plural=target.plural,
            name=target.name,
            body={"status": records},
            field_manager=FIELD_MANAGER,
            _content_type="application/merge-patch+json",
            _request_timeout=10,
        )

    def _run(self) -> None:
        backoff = 0.0
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending and self._closed:
                    return
                records, self._pending = self._pending, {}
            try:
                self._patch(records)
                self._sent += 1
                self._failures = 0
                backoff = 0.0
            except Exception as exc:
                self._failures += 1
                backoff = min(_MAX_BACKOFF_S, max(1.0, backoff * 2))
                log.warning(
                    "status patch of %s/%s failed (%s); retrying in %.0fs",
                    self.target.namespace,
                    self.target.name,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                    backoff,
                )
                with self._cond:
                    merged = dict(records)
                    _merge(merged, self._pending)  # newer records win over the failed ones
                    self._pending = merged
                    if self._closed:
                        return
                    self._cond.wait(backoff)

    def close(self, timeout_s: float) -> None:
        """Flush what is pending (one try within ``timeout_s``), then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout_s)


class KubernetesEvents:
    """Events on the job (rank 0): what a user sees in ``kubectl describe`` about requests it made, e.g.
    a profile's outcome. Needs ``create`` on events in the job's namespace (the trainer's Role)."""

    def __init__(self, target: trainer_config.StatusTarget, *, api: Any = None) -> None:
        self.target = target
        self._api = api
        self.watcher: Any = None  # requests.RequestWatcher: knows the job's uid from its last read

    def emit(self, reason: str, message: str, kind: str = "Normal") -> None:
        from kubernetes import client

        if self._api is None:
            self._api = client.CoreV1Api(_kube_api().api_client)
        target = self.target
        obj = getattr(self.watcher, "object", None) or {}
        now = run_record.utc_now()
        kind_name = "TuningSweep" if target.plural == "tuningsweeps" else "TrainingJob"
        self._api.create_namespaced_event(
            target.namespace,
            {
                "metadata": {"generateName": f"{target.name}.", "namespace": target.namespace},
                "involvedObject": {
                    "apiVersion": f"{target.group}/{target.version}",
                    "kind": kind_name,
                    "name": target.name,
                    "namespace": target.namespace,
                    "uid": (obj.get("metadata") or {}).get("uid"),
                },
                "reason": reason,
                "message": message[:1024],
                "type": kind,
                "source": {"component": FIELD_MANAGER},
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            },
            _request_timeout=10,
        )


class StatusReporter:
    """Builds the three records from the API models and hands them to every sink (rank 0 only)."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    @classmethod
    def for_config(
        cls, config: trainer_config.TrainerConfig, *, status_file: storage.RunDir
    ) -> StatusReporter:
        sinks: list[Sink] = [FileSink(status_file)]
        if config.status_target is not None:
            sinks.append(KubernetesSink(config.status_target))
        return cls(sinks)

    def _publish(self, records: dict[str, Any]) -> None:
        for sink in self.sinks:
            try:
                sink.publish(records)
            except Exception:
                log.exception("status sink %s failed", type(sink).__name__)

    def progress(
        self,
        *,
        step: int,
        total_steps: int | None,
        epoch: int,
        loss: float | None,
        samples_per_second: float | None,
        eta_seconds: float | None,
        worker_restarts: int,
        batch_size_per_worker: int | None = None,
        learning_rate: float | None = None,
    ) -> None:
        percent = round(100.0 * step / total_steps, 2) if total_steps else None
        record = trainingjob.Progress(
            step=step,
            total_steps=total_steps,
            epoch=epoch,
            loss=loss,
            samples_per_second=samples_per_second,
            percent=percent,
            eta_seconds=eta_seconds,
            worker_restarts=worker_restarts,
            batch_size_per_worker=batch_size_per_worker,
            learning_rate=learning_rate,
            updated=run_record.utc_now(),
        )
        self._publish({"progress": record.to_wire()})

    def checkpoint(self, saved: Checkpoint, *, best: experiment.BestCheckpoint | None = None) -> None:
        manifest = saved.manifest
        record = trainingjob.CheckpointStatus(
            step=manifest.step,
            epoch=manifest.epoch,
            path=str(saved.path),
            time=manifest.time,
            metrics={**manifest.metrics, **{f"eval.{k}": v for k, v in manifest.evaluation.items()}},
            best=best,
        )
        self._publish({"checkpoint": record.to_wire()})

    def record(self, field: str, record: base.ApiModel) -> None:
        """Publish one of the experiment records (``evaluation``, ``profile``, ``communication``, ``cost``,
        ``tracking``) as ``status.<field>``."""
        if field not in TRAINER_FIELDS:
            raise ValueError(f"status.{field} is not the trainer's to write")
        self._publish({field: record.to_wire()})

    def network(
        self,
        *,
        profile: str,
        backend: str,
        bus_bandwidth_gb_per_second: float | None,
        probe_bytes: int | None,
        world_size: int,
    ) -> None:
        record = trainingjob.NetworkStatus(
            profile=profile,
            backend=backend,
            all_reduce_bus_bandwidth_gb_per_second=None
            if bus_bandwidth_gb_per_second is None
            else round(bus_bandwidth_gb_per_second, 3),
            probe_bytes=probe_bytes,
            world_size=world_size,
            measured=run_record.utc_now(),
        )
        self._publish({"network": record.to_wire()})

    def storage(self, *, location: str, ready: bool, reason: str, message: str, attempt: int) -> None:
        """The driver's start-up check of the checkpoint storage (``status.storage``)."""
        record = trainingjob.StorageStatus(
            location=location,
            ready=ready,
            reason=reason,
            message=message,
            attempt=attempt,
            checked=run_record.utc_now(),
        )
        self._publish({"storage": record.to_wire()})

    def close(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        for sink in self.sinks:
            sink.close(max(0.1, deadline - time.monotonic()))
