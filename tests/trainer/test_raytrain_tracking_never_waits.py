"""``spec.workload.rayTrain``: a tracking outage never holds the function's reports.

trainop's Ray Train callback turns every ``ray.train.report`` into status, events and tracking; Ray Train
runs it in its controller, and the function's next report waits until the controller took the previous one,
so the callback must not wait for MLflow. A real MLflow client on a file store (``MLFLOW_ALLOW_FILE_STORE``)
that disappears after the run was opened — every later call fails and the tracking thread backs off 1 s,
2 s, 4 s — and the callback's real sinks on a temporary directory; nothing is mocked.
"""

from __future__ import annotations

import atexit
import pathlib
import shutil
import time
from typing import Any

import pytest

from trainop.api import trainer_config
from trainop_trainer import config as config_module
from trainop_trainer import raytrain_function, tracking


def function_config(storage: pathlib.Path, uri: str) -> trainer_config.TrainerConfig:
    spec: dict[str, Any] = {
        "workload": {"rayTrain": "trainop_ray_example.digits:train_loop_per_worker", "config": {}},
        "hyperparameters": {"epochs": 1},
        "workers": {"replicas": 1, "gpusPerWorker": 0, "cpusPerWorker": 1},
        "network": {"profile": "tcp", "probe": False},
        "tracking": {"mlflow": {"trackingUri": uri, "experiment": "outage"}},
    }
    return trainer_config.TrainerConfig.model_validate(
        {"jobName": "fn", "runName": "fn", "storagePath": str(storage), "attempt": 1, "spec": spec},
        by_alias=True,
    )


def test_reports_do_not_wait_for_an_mlflow_server_that_went_away(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for key, value in tracking._CLIENT_LIMITS.items():
        monkeypatch.setenv(key, value)  # (MlflowRun sets them for the process; restored after the test)
    store = tmp_path / "mlruns"
    config = function_config(tmp_path / "runs", store.as_uri())
    callback = raytrain_function.StatusCallback(
        config_json=config_module.dumps(config), launch_id="l", started_at=time.time()
    )
    callback._open()  # the run is opened while the store is there
    assert callback.tracking.mlflow is not None
    try:
        shutil.rmtree(store)
        store.write_text("not a directory any more")  # every later MLflow call fails

        for step in (1, 2, 3):
            callback.after_report(None, [{"step": step, "loss": 1.0 / step}], None)

        # The reports returned with the tracking thread's work still queued: each failed call holds its
        # item for the backoff (1, 2, 4 s), so the third report's metrics are handled 7 s after the first
        # fails at the earliest. A callback that waited for the thread (a flush per report, until
        # 2026-12-07) returned with nothing left queued. A count of queued work, not a time: it fails
        # wrongly only if the three calls themselves took those 7 s.
        assert callback.tracking.mlflow._queue.unfinished_tasks >= 1
        events = (tmp_path / "runs" / "fn" / "trainop" / "events.jsonl").read_text()
        assert events.count('"report"') == 3
    finally:
        # The thread is still backing off: the exit-time flush would wait for it at this test process's end.
        atexit.unregister(callback.tracking.flush)
        callback.status.close()
