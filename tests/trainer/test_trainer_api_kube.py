"""The apiserver enforces the trainer's new fields as the models do: ``spec.parallelism`` and
``hyperparameters.batchSizePerWorker: auto`` (an int-or-string with a CEL rule).

Real kube-apiserver with the CRDs of crds/ (the control-plane tier); the same manifests through the pydantic
models must agree.
"""

from __future__ import annotations

from typing import Any

import kubernetes
import pydantic
import pytest

from trainop.api import trainingjob

GROUP, VERSION, PLURAL = "trainop.dev", "v1alpha1", "trainingjobs"

CASES: list[tuple[str, dict[str, Any], dict[str, Any], str | None]] = [
    ("auto-batch", {"batchSizePerWorker": "auto"}, {"strategy": "fsdp"}, None),
    ("integer-batch", {"batchSizePerWorker": 64}, {"strategy": "hsdp", "cpuOffload": True}, None),
    ("word-batch", {"batchSizePerWorker": "biggest"}, {}, "batchSizePerWorker must be an integer"),
    ("zero-batch", {"batchSizePerWorker": 0}, {}, "batchSizePerWorker must be an integer"),
    ("offload-ddp", {}, {"strategy": "ddp", "cpuOffload": True}, "parallelism.cpuOffload offloads FSDP"),
    ("ac-every-0", {}, {"activationCheckpointing": {"mode": "blocks", "every": 0}}, "every"),
]


def manifest(name: str, hyperparameters: dict[str, Any], parallelism: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "workload": {"model": "gpt-small"},
            "hyperparameters": {"maxSteps": 10, **hyperparameters},
            "parallelism": parallelism,
        },
    }


@pytest.mark.parametrize(
    ("name", "hyperparameters", "parallelism", "refusal"), CASES, ids=[c[0] for c in CASES]
)
def test_the_apiserver_and_the_models_accept_and_refuse_the_same_parallelism_and_batch_settings(
    control_plane: Any,
    namespace: str,
    name: str,
    hyperparameters: dict[str, Any],
    parallelism: dict[str, Any],
    refusal: str | None,
) -> None:
    body = manifest(name, hyperparameters, parallelism)
    api = kubernetes.client.CustomObjectsApi(control_plane.api_client())
    try:
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        server_error = None
    except kubernetes.client.ApiException as exc:
        assert exc.status == 422, exc.body
        server_error = str(exc.body)
    try:
        trainingjob.TrainingJobSpec.model_validate(body["spec"], by_alias=True)
        model_error = None
    except pydantic.ValidationError as exc:
        model_error = str(exc)

    if refusal is None:
        assert server_error is None and model_error is None, (server_error, model_error)
    else:
        assert server_error is not None and refusal in server_error, server_error
        assert model_error is not None
