"""Experiment tracking on rank 0: an MLflow run per job and TensorBoard event files (``spec.tracking``).

``Tracking.start(config, run_dir)`` opens what the spec asks for; the loop then hands it every report
(``report``), every evaluation (``evaluation``) and the checkpoints worth a reference (``checkpoint``:
the best one and the final one); ``close`` flushes.

MLflow (``MlflowRun``, through ``mlflow.tracking.MlflowClient``, the client API of the ``mlflow-skinny``
package):

- **One run per job, continued by every attempt.** The run's id is kept on the volume
  (``<run>/trainop/mlflow.json``); a worker-group restart or a new attempt finds it and logs into the same
  run (also found by its ``trainop.run`` tag if that file is lost). Step numbers are optimizer steps, so a
  resumed attempt's metrics continue the same curves; steps trained twice after a restart are logged
  twice, at the same step numbers.
- **Parameters**: the resolved spec, flattened to dotted keys (``hyperparameters.learningRate``), logged
  once. MLflow refuses to change a parameter, so a later attempt whose spec changed logs the new value as
  a tag ``trainop.changed.<key>`` (with the attempt) instead.
- **Tags**: ``trainop.job``, ``trainop.namespace``, ``trainop.run``, ``trainop.attempt`` (updated by each
  attempt; the ``trainop.attempt`` metric keeps the history), ``trainop.image``, ``mlflow.runName`` and,
  when the image says (``TRAINOP_GIT_COMMIT``), ``mlflow.source.git.commit``.
- **Metrics**: every report (``loss``, ``samples_per_second``, ``learning_rate``) and every evaluation
  (``eval/<name>``), with the optimizer step.
- **Checkpoints** are referenced, never copied (they can be terabytes): tags
  ``trainop.checkpoint.best`` / ``trainop.checkpoint.final`` with the path on the volume, and a small JSON
  artifact (``checkpoints/<kind>.json``: path, step, metrics) per reference.
- **Sweeps**: the sweep driver opens one parent run per sweep (``open_sweep_run``: tagged
  ``trainop.sweep``, parameters = the sweep's objective, search and space, continued by every attempt of the
  sweep like a job's run) and every trial's run is its child (``mlflow.parentRunId``, handed down as
  ``TrainerConfig.tracking_parent_run_id``).

Calls to the server run on a background thread (latest batches queued, retried with backoff): a slow or
unreachable server never stalls a training step, and never fails the job (a warning says what is lost).
Opening the run is the one synchronous part (rank 0, before the first step): the client's retries are
capped (``MLFLOW_HTTP_REQUEST_MAX_RETRIES=2``, ``MLFLOW_HTTP_REQUEST_TIMEOUT=15`` unless set), so an
unreachable server delays the start by well under a minute and training goes on without MLflow.

TensorBoard (``TensorBoardLog``, ``tensorboardX``'s writer): scalars ``train/*`` and ``eval/*`` to
``<run>/tensorboard/`` on the checkpoint volume, one event file per worker-group start.

It must not decide when anything is reported (``step_schedule``) nor what a metric means.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

from trainop.api import experiment, trainer_config

log = logging.getLogger(__name__)

MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"
GIT_COMMIT_ENV = "TRAINOP_GIT_COMMIT"
RUN_FILE = "mlflow.json"
TENSORBOARD_DIR = "tensorboard"
_MAX_PENDING = 10_000  # metric points kept while the server is unreachable
_CLIENT_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "15"}


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``: the spec as MLflow parameters (lists as JSON)."""
    flat: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, (list, tuple, Mapping)):
            flat[name] = json.dumps(value, sort_keys=True)
        else:
            flat[name] = str(value)
    return flat


def tracking_uri(settings: experiment.MlflowTracking) -> str | None:
    """The spec's URI, or the Secret's value the operator put in ``MLFLOW_TRACKING_URI``."""
    if settings.tracking_uri is not None:
        return settings.tracking_uri
    return os.environ.get(MLFLOW_URI_ENV) or None


class MlflowRun:
    """This job's MLflow run, written from a background thread."""

    def __init__(self, *, config: trainer_config.TrainerConfig, run_dir: pathlib.Path, uri: str) -> None:
        # Opening the run happens on rank 0 before training while the other ranks wait: an unreachable
        # server must cost seconds, not MLflow's default minutes of retries (a user's setting wins).
        for key, value in _CLIENT_LIMITS.items():
            os.environ.setdefault(key, value)
        from mlflow.tracking import MlflowClient

        settings = config.spec.tracking.mlflow
        assert settings is not None
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self._config = config
        self._run_file = run_dir / "trainop" / RUN_FILE
        self.experiment_id, self.run_id = self._open(settings.experiment)
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._pending: list[Any] = []
        self._thread = threading.Thread(target=self._run, name="mlflow", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------------------------------- the run
    def _open(self, experiment_name: str) -> tuple[str, str]:
        """Find this job's run (the file on the volume, else the run tag) or create it; set the tags and
        parameters of this attempt."""
        client, config = self.client, self._config
        found = client.get_experiment_by_name(experiment_name)
        experiment_id = (
            found.experiment_id if found is not None else client.create_experiment(experiment_name)
        )
        run_id = self._known_run(experiment_id)
        if run_id is None:
            tags = {
                "mlflow.runName": config.run_name,
                "trainop.job": config.job_name,
                "trainop.run": config.run_name,
                "trainop.namespace": config.status_target.namespace if config.status_target else "",
                "trainop.image": config.spec.image,
            }
            if config.tracking_parent_run_id:
                tags["mlflow.parentRunId"] = config.tracking_parent_run_id
            if os.environ.get(GIT_COMMIT_ENV):
                tags["mlflow.source.git.commit"] = os.environ[GIT_COMMIT_ENV]
            run_id = str(client.create_run(experiment_id, tags=tags).info.run_id)
            log.info("MLflow run %s created in experiment %s at %s", run_id, experiment_name, self.uri)
        else:
            client.update_run(run_id, status="RUNNING")
            log.info("MLflow run %s continued (attempt %d)", run_id, config.attempt)
        self._run_file.parent.mkdir(parents=True, exist_ok=True)
        self._run_file.write_text(
            json.dumps({"runId": run_id, "experimentId": experiment_id, "uri": self.uri})
        )
        client.set_tag(run_id, "trainop.attempt", str(config.attempt))
        self._log_params(run_id)
        return str(experiment_id), run_id

    def _known_run(self, experiment_id: str) -> str | None:
        try:
            saved = json.loads(self._run_file.read_text())
        except (OSError, ValueError):
            saved = {}
        if saved.get("runId") and saved.get("uri") == self.uri:
            try:
                run = self.client.get_run(saved["runId"])
                if run.info.lifecycle_stage == "active":
                    return str(run.info.run_id)
            except Exception as exc:
                log.warning(
                    "MLflow run %s from %s is gone (%s); looking it up by tag",
                    saved["runId"],
                    self._run_file,
                    exc,
                )
        runs = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`trainop.run` = '{self._config.run_name}'", max_results=1
        )
        return str(runs[0].info.run_id) if runs else None

    def _log_params(self, run_id: str) -> None:
        from mlflow.entities import Param

        config = self._config
        wanted = flatten(config.spec.model_dump(mode="json", by_alias=True, exclude_none=True))
        wanted["trainop.runName"] = config.run_name
        have = self.client.get_run(run_id).data.params
        new = [Param(key, value[:6000]) for key, value in sorted(wanted.items()) if key not in have]
        for start in range(0, len(new), 100):  # MLflow takes at most 100 parameters per batch
            self.client.log_batch(run_id, params=new[start : start + 100])
        for key, value in sorted(wanted.items()):
            if key in have and have[key] != value[:6000]:
                self.client.set_tag(
                    run_id, f"trainop.changed.{key}", f"attempt {config.attempt}: {value}"[:5000]
                )

    # -------------------------------------------------------------------------------------- the thread
    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        self._queue.put(("metrics", (step, dict(values), int(time.time() * 1000))))

    def checkpoint(self, kind: str, *, path: str, step: int, metrics: Mapping[str, float]) -> None:
        self._queue.put(("checkpoint", (kind, path, step, dict(metrics))))

    def _send_metrics(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[:1000], self._pending[1000:]
            try:
                self.client.log_batch(self.run_id, metrics=batch)
            except Exception:
                self._pending = batch + self._pending
                raise

    def _handle(self, kind: str, payload: Any) -> None:
        from mlflow.entities import Metric

        if kind == "metrics":
            step, values, stamp = payload
            self._pending.extend(Metric(key, float(v), stamp, step) for key, v in sorted(values.items()))
            del self._pending[:-_MAX_PENDING]
            self._send_metrics()
        elif kind == "checkpoint":
            name, path, step, metrics = payload
            self.client.set_tag(self.run_id, f"trainop.checkpoint.{name}", path)
            self.client.set_tag(self.run_id, f"trainop.checkpoint.{name}.step", str(step))
            self.client.log_dict(
                self.run_id, {"path": path, "step": step, "metrics": metrics}, f"checkpoints/{name}.json"
            )
        elif kind == "finish":
            self._send_metrics()
            self.client.set_terminated(self.run_id, status="FINISHED")

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait (up to ``timeout_s``) until everything queued so far was handled."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.05)

    def _run(self) -> None:
        backoff = 0.0
        while True:
            kind, payload = self._queue.get()
            if kind == "stop":
                self._queue.task_done()
                return
            try:
                self._handle(kind, payload)
                backoff = 0.0
            except Exception as exc:
                backoff = min(60.0, max(1.0, backoff * 2))
                log.warning(
                    "MLflow %s for run %s failed (%s); kept for the next try in %.0fs",
                    kind,
                    self.run_id,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                    backoff,
                )
                time.sleep(backoff)
            finally:
                self._queue.task_done()

    def close(self, *, completed: bool, timeout_s: float = 30.0) -> None:
        if completed:
            self._queue.put(("finish", None))
        else:
            self._queue.put(("metrics", (0, {}, 0)))  # a last try for what is pending
        self._queue.put(("stop", None))
        self._thread.join(timeout_s)
        if self._thread.is_alive() or self._pending:
            log.warning("MLflow run %s: %d metric points could not be sent", self.run_id, len(self._pending))


def open_sweep_run(config: trainer_config.SweepConfig, *, experiment_dir: pathlib.Path) -> str | None:
    """The sweep's parent MLflow run (created, or found again by a new attempt of the sweep); None when the
    template asks for no MLflow or the server cannot be used (trials then log without a parent)."""
    settings = config.spec.template.tracking.mlflow
    if settings is None:
        return None
    uri = tracking_uri(settings)
    if uri is None:
        return None
    try:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        found = client.get_experiment_by_name(settings.experiment)
        experiment_id = (
            found.experiment_id if found is not None else client.create_experiment(settings.experiment)
        )
        run_file = experiment_dir / "trainop" / RUN_FILE
        try:
            run_id: str | None = json.loads(run_file.read_text())["runId"]
        except (OSError, ValueError, KeyError):
            runs = client.search_runs(
                [experiment_id],
                filter_string=f"tags.`trainop.sweep` = '{config.experiment_name}'",
                max_results=1,
            )
            run_id = str(runs[0].info.run_id) if runs else None
        if run_id is None:
            tags = {
                "mlflow.runName": config.sweep_name,
                "trainop.sweep": config.experiment_name,
                "trainop.run": config.experiment_name,
                "trainop.namespace": config.status_target.namespace if config.status_target else "",
            }
            run_id = str(client.create_run(experiment_id, tags=tags).info.run_id)
            sweep = config.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
            sweep.pop("template", None)
            params = [Param(k, v[:6000]) for k, v in sorted(flatten(sweep).items())]
            for start in range(0, len(params), 100):
                client.log_batch(run_id, params=params[start : start + 100])
            log.info("MLflow parent run %s for sweep %s", run_id, config.sweep_name)
        run_file.parent.mkdir(parents=True, exist_ok=True)
        run_file.write_text(json.dumps({"runId": run_id, "experimentId": experiment_id, "uri": uri}))
        client.set_tag(run_id, "trainop.attempt", str(config.attempt))
        return run_id
    except Exception as exc:
        log.warning(
            "spec.template.tracking.mlflow: no parent run for the sweep at %s (%s); trials log without one",
            uri,
            str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
        )
        return None


class TensorBoardLog:
    """Scalars as TensorBoard event files under ``<run>/tensorboard``."""

    def __init__(self, log_dir: pathlib.Path) -> None:
        from tensorboardX import SummaryWriter

        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self._writer = SummaryWriter(logdir=str(log_dir), flush_secs=10)

    def scalars(self, prefix: str, step: int, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self._writer.add_scalar(f"{prefix}/{name}", float(value), global_step=step)

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()


class Tracking:
    """What ``spec.tracking`` asks for, on rank 0; a no-op facade when nothing is asked."""

    def __init__(self, *, mlflow: MlflowRun | None, tensorboard: TensorBoardLog | None) -> None:
        self.mlflow = mlflow
        self.tensorboard = tensorboard

    @classmethod
    def start(cls, config: trainer_config.TrainerConfig, *, run_dir: pathlib.Path) -> Tracking:
        settings = config.spec.tracking
        mlflow_run: MlflowRun | None = None
        if settings.mlflow is not None:
            uri = tracking_uri(settings.mlflow)
            if uri is None:
                log.warning(
                    "spec.tracking.mlflow.trackingUriSecret: %s is not set in this pod, so nothing goes to "
                    "MLflow; check that the Secret %s has the key %s",
                    MLFLOW_URI_ENV,
                    settings.mlflow.tracking_uri_secret.name if settings.mlflow.tracking_uri_secret else "?",
                    settings.mlflow.tracking_uri_secret.key if settings.mlflow.tracking_uri_secret else "?",
                )
            else:
                try:
                    mlflow_run = MlflowRun(config=config, run_dir=run_dir, uri=uri)
                except Exception as exc:
                    log.warning(
                        "spec.tracking.mlflow: the tracking server at %s cannot be used (%s); training goes "
                        "on without MLflow",
                        uri,
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                    )
        board = TensorBoardLog(run_dir / TENSORBOARD_DIR) if settings.tensorboard else None
        return cls(mlflow=mlflow_run, tensorboard=board)

    @property
    def active(self) -> bool:
        return self.mlflow is not None or self.tensorboard is not None

    def status(self) -> experiment.TrackingStatus:
        return experiment.TrackingStatus(
            mlflow_run_id=self.mlflow.run_id if self.mlflow else None,
            mlflow_experiment_id=self.mlflow.experiment_id if self.mlflow else None,
            tensorboard_log_dir=str(self.tensorboard.log_dir) if self.tensorboard else None,
        )

    def report(self, step: int, values: Mapping[str, float]) -> None:
        if self.mlflow is not None:
            self.mlflow.metrics(step, values)
        if self.tensorboard is not None:
            self.tensorboard.scalars("train", step, values)

    def evaluation(self, step: int, values: Mapping[str, float]) -> None:
        if self.mlflow is not None:
            self.mlflow.metrics(step, {f"eval/{k}": v for k, v in values.items()})
        if self.tensorboard is not None:
            self.tensorboard.scalars("eval", step, values)

    def attempt(self, step: int, attempt: int) -> None:
        """The attempt (and worker-group start) as a metric: MLflow keeps the history a tag cannot."""
        if self.mlflow is not None:
            self.mlflow.metrics(step, {"trainop.attempt": float(attempt)})

    def checkpoint(self, kind: str, *, path: str, step: int, metrics: Mapping[str, float]) -> None:
        if self.mlflow is not None:
            self.mlflow.checkpoint(kind, path=path, step=step, metrics=metrics)

    def flush(self) -> None:
        if self.mlflow is not None:
            self.mlflow.flush()

    def close(self, *, completed: bool) -> None:
        if self.mlflow is not None:
            self.mlflow.close(completed=completed)
        if self.tensorboard is not None:
            self.tensorboard.close()
