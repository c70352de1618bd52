"""The sweep driver's status patch on a real kube-apiserver, with the sweep's own service-account token.

The ServiceAccount, Role and RoleBinding are the operator's (``trainop.controller.children.desired_rbac``:
get/patch of ``tuningsweeps/status`` of this sweep only). The driver's publisher patches through the
trainer's ``KubernetesSink`` with ``TRAINOP_KUBE_HOST`` / ``TRAINOP_KUBE_TOKEN_FILE`` /
``TRAINOP_KUBE_CA_FILE``, as in the trainer's own test; the records come from a ``TrialBook`` fed the events
Tune would send (no Ray here: the Ray tests cover the books against real sweeps). Needs the control-plane
tier (tests/controlplane).
"""

from __future__ import annotations

import pathlib
import time
from typing import Any

import kubernetes
import pytest

from trainop.api import base, trainer_config, tuningsweep
from trainop.controller import children, kinds
from trainop_trainer.sweep import book, layout, monitor

pytestmark = pytest.mark.controlplane

PLURAL = "tuningsweeps"
NAME = "lr"


def sweep_manifest() -> dict[str, Any]:
    return {
        "apiVersion": base.API_VERSION,
        "kind": "TuningSweep",
        "metadata": {"name": NAME},
        "spec": {
            "template": {"workload": {"model": "mlp"}, "hyperparameters": {"maxSteps": 100}},
            "searchSpace": {
                "hyperparameters.learningRate": {"type": "loguniform", "lower": 1e-4, "upper": 0.1}
            },
            "numTrials": 4,
        },
    }


def create_sweep_with_operator_rbac(control_plane: Any, namespace: str) -> tuningsweep.TuningSweep:
    client = control_plane.api_client()
    custom = kubernetes.client.CustomObjectsApi(client)
    body = custom.create_namespaced_custom_object(
        base.GROUP, base.VERSION, namespace, PLURAL, sweep_manifest()
    )
    custom.patch_namespaced_custom_object_status(  # what the operator owns, set before the driver runs
        base.GROUP,
        base.VERSION,
        namespace,
        PLURAL,
        NAME,
        {"status": {"phase": "Running", "attempt": 1}},
        _content_type="application/merge-patch+json",
    )
    resource = kinds.parse(body)
    assert isinstance(resource, tuningsweep.TuningSweep)
    core, rbac = kubernetes.client.CoreV1Api(client), kubernetes.client.RbacAuthorizationV1Api(client)
    for child in children.desired_rbac(resource):
        if child["kind"] == "ServiceAccount":
            core.create_namespaced_service_account(namespace, child)
        elif child["kind"] == "Role":
            rbac.create_namespaced_role(namespace, child)
        else:
            rbac.create_namespaced_role_binding(namespace, child)
    return resource


def wait_until_token_may_patch_status(control_plane: Any, token: str, namespace: str) -> None:
    """RBAC objects take effect in the apiserver's authorizer shortly after creation; the sink's final flush
    is a single try, so wait until the token is allowed before publishing."""
    client = control_plane.api_client(token=token)
    review = {
        "spec": {
            "resourceAttributes": {
                "group": base.GROUP,
                "resource": PLURAL,
                "subresource": "status",
                "name": NAME,
                "namespace": namespace,
                "verb": "patch",
            }
        }
    }
    try:
        api = kubernetes.client.AuthorizationV1Api(client)
        deadline = time.monotonic() + 30
        while not api.create_self_subject_access_review(review).status.allowed:
            assert time.monotonic() < deadline, "the sweep's token was never allowed to patch its status"
            time.sleep(0.2)
    finally:
        client.close()


def fed_book() -> book.TrialBook:
    """Four trials as Tune would report them: one finished, one cut by ASHA, one running, one waiting."""
    trials = book.TrialBook(metric="loss", mode=tuningsweep.Mode.MIN, max_t=100)
    for index, lr in enumerate([0.01, 0.0001, 0.05, 0.002]):
        trials.observe(f"t{index}", status=book.TUNE_PENDING, parameters={"hyperparameters.learningRate": lr})
    for trial_id in ("t0", "t1", "t2"):
        trials.started(trial_id)
    trials.result("t0", {"step": 50, "loss": 0.9})
    trials.result("t0", {"step": 100, "loss": 0.25})
    trials.completed("t0")
    trials.observe("t0", status=book.TUNE_TERMINATED, parameters={})
    trials.result("t1", {"step": 20, "loss": 2.3, "done": True})
    trials.completed("t1")
    trials.observe("t1", status=book.TUNE_TERMINATED, parameters={})
    trials.result("t2", {"step": 40, "loss": 0.5})
    return trials


def test_driver_status_patch_with_the_sweeps_token_sticks_and_kubectl_shows_trials_running_best(
    control_plane: Any, namespace: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    resource = create_sweep_with_operator_rbac(control_plane, namespace)
    token_file = tmp_path / "token"
    account = kinds.TUNING_SWEEP.service_account_name(NAME)
    token = control_plane.service_account_token(namespace, account, create=False)
    token_file.write_text(token)
    wait_until_token_may_patch_status(control_plane, token, namespace)
    monkeypatch.setenv("TRAINOP_KUBE_HOST", control_plane.server_url)
    monkeypatch.setenv("TRAINOP_KUBE_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("TRAINOP_KUBE_CA_FILE", str(control_plane.pki.ca_cert_path))
    config = trainer_config.for_sweep(resource, storage_path=str(tmp_path), attempt=1, in_cluster=True)
    assert config.status_target is not None and config.status_target.plural == PLURAL
    paths = layout.SweepPaths.for_config(config)
    publisher = monitor.StatusPublisher(paths=paths, sweep_name=NAME, target=config.status_target)
    sweep_monitor = monitor.SweepMonitor(
        book=fed_book(), publisher=publisher, spec=resource.spec, key=str(paths.experiment_dir)
    )

    sweep_monitor.on_step_end(iteration=1, trials=[])  # the first publish of an attempt, never throttled
    sweep_monitor.publisher.close()  # flushes the patch in flight

    custom = kubernetes.client.CustomObjectsApi(control_plane.api_client())
    status = custom.get_namespaced_custom_object(base.GROUP, base.VERSION, namespace, PLURAL, NAME)["status"]
    assert status["trials"] == {
        "total": 4,
        "pending": 1,
        "running": 1,
        "succeeded": 1,
        "failed": 0,
        "earlyStopped": 1,
    }
    assert status["bestTrial"] == {
        "id": "t0",
        "parameters": {"hyperparameters.learningRate": 0.01},
        "metric": "loss",
        "value": 0.25,
    }
    assert status["updated"]
    assert (status["phase"], status["attempt"]) == ("Running", 1)  # the operator's fields are untouched
    assert sweep_monitor.publisher.paths.status_file.is_file()  # and the copy on the volume
    rows = control_plane.kubectl("get", "tuningsweeps", "-n", namespace, "--no-headers").stdout.split()
    assert rows[:5] == [NAME, "Running", "4", "1", "0.25"]
