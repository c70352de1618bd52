"""docs/operator.md's list of the fields a TrainingJob may not change is the model's."""

from __future__ import annotations

import pathlib
import re
from typing import Any

from trainop.api import trainingjob

ROOT = pathlib.Path(__file__).resolve().parents[2]

JOB: dict[str, Any] = {
    "apiVersion": "trainop.dev/v1alpha1",
    "kind": "TrainingJob",
    "metadata": {"name": "mlp", "namespace": "team-a", "uid": "0f0e0d0c-0000-4000-8000-000000000001"},
    "spec": {
        "workload": {"model": "mlp"},
        "hyperparameters": {"maxSteps": 50},
        "workers": {"replicas": 2, "gpusPerWorker": 0, "cpusPerWorker": 1, "memoryPerWorker": "2Gi"},
    },
}


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_the_operators_immutable_fields_list_is_trainingjobs() -> None:
    text = _flat((ROOT / "docs" / "operator.md").read_text())
    listed = text.split("(`trainingjob.IMMUTABLE_FIELDS`: ", 1)[1].split(";", 1)[0]
    documented = set(re.findall(r"`([^`]+)`", listed))
    assert documented == {".".join(path) for path in trainingjob.IMMUTABLE_FIELDS}
