"""Local mode (``trainop run``): a manifest trains on the local Ray runtime, survives an injected worker
failure, and ends with the status the CR would carry."""

from __future__ import annotations

import io
import pathlib
import signal

import pytest
import yaml

from trainop_trainer import local

MANIFEST = """
apiVersion: trainop.dev/v1alpha1
kind: TrainingJob
metadata:
  name: local-demo
spec:
  workload:
    model: mlp
    dataset: {kind: synthetic, numSamples: 2048, numClasses: 10, numWorkers: 0}
  hyperparameters: {maxSteps: 80, batchSizePerWorker: 16, learningRate: 0.05}
  precision: fp32
  workers: {replicas: 2, gpusPerWorker: 0, cpusPerWorker: 1}
  checkpoint: {intervalSteps: 20}
  network: {profile: tcp, probe: false}
  reporting: {everySteps: 10, metricsPort: 29310}
"""


@pytest.mark.ray
@pytest.mark.slow
def test_run_manifest_recovers_from_an_injected_failure_and_prints_the_final_status(
    ray_cluster: str, tmp_path: pathlib.Path
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(MANIFEST)
    out = io.StringIO()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = local.run_manifest(path, inject_failure_at_step=30, state_dir=tmp_path / "state", out=out)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    text = out.getvalue()

    assert code == 0, text
    assert "a worker will be killed once" in text
    assert "worker group restarted (restart 1 of this run): resumed from checkpoint step 20" in text
    status = yaml.safe_load(text[text.index("status:\n") :])["status"]
    assert status["phase"] == "Succeeded"
    assert (status["progress"]["step"], status["progress"]["workerRestarts"]) == (80, 1)
    assert status["checkpoint"]["step"] == 80
    assert status["checkpoint"]["path"] == str(tmp_path / "state" / "local-demo" / "checkpoints" / "step_80")
    assert (status["workers"], status["gpus"]) == (2, 0)
    assert (tmp_path / "state" / "local-demo" / "trainer.json").is_file()
