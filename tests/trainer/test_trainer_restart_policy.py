"""trainop's failure policy inside Ray Train's controller (restart_policy.py), without a Ray cluster.

The policy gets Ray Train's own exception types (``WorkerGroupError`` with the failed ranks, as Ray's poll
builds it; ``ControllerError``) and reads the ranks' reports from a real ``torch.distributed.TCPStore``
served in this process, as the driver serves it; its decisions go back through that store to a real
``DecisionWatcher`` which records them in a real ``FailureBook`` (status.json, local mode). Nothing is
mocked. The whole path on real Ray (a killed worker, a frozen rank, a user's exception restarted inside the
controller) is in test_trainer_ray.py.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import time
from typing import Any

import pytest
import torch.distributed as dist
import trainer_support
from ray.exceptions import ActorDiedError
from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError
from ray.train.v2._internal.execution.failure_handling import FailureDecision
from ray.train.v2.api.config import FailureConfig
from ray.train.v2.api.exceptions import ControllerError, WorkerGroupError

from trainop.api import trainer_config
from trainop_trainer import failures, ray_train, restart_policy, watchdog

SPEC = {
    "workload": {"model": "mlp"},
    "hyperparameters": {"maxSteps": 100},
    "failurePolicy": {"maxWorkerFailures": 3, "budgets": {"userCodeError": 1, "unknown": 2}},
}


@pytest.fixture
def store() -> Any:
    return dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=10)
    )


def config_for(tmp_path: pathlib.Path, spec: dict[str, Any] = SPEC) -> trainer_config.TrainerConfig:
    return trainer_config.TrainerConfig.model_validate(
        {"jobName": "job", "runName": "job", "storagePath": str(tmp_path), "attempt": 1, "spec": spec},
        by_alias=True,
    )


def policy_for(
    config: trainer_config.TrainerConfig, store: Any, *, used: dict[str, int] | None = None, restarts: int = 0
) -> restart_policy.BudgetedFailurePolicy:
    policy = restart_policy.BudgetedFailurePolicy(
        FailureConfig(max_failures=0),
        config=config,
        store_address=f"127.0.0.1:{store.port}",
        world_size=2,
        used=used or {},
        restarts=restarts,
    )
    # As Ray ships it to the controller actor: pickled, reconnecting to the store where it runs.
    import pickle

    return pickle.loads(pickle.dumps(policy))  # type: ignore[no-any-return]


def report(store: Any, group: int, rank: int, failure: failures.Failure) -> None:
    store.set(watchdog.store_key(group, "failure", rank), json.dumps(failure.to_dict()))


def rank_died(rank: int) -> WorkerGroupError:
    return WorkerGroupError(f"rank {rank} died", {rank: ActorDiedError()})


def test_a_users_exception_restarts_the_group_within_its_budget_then_ends_the_attempt(
    tmp_path: pathlib.Path, store: Any
) -> None:
    config = config_for(tmp_path)
    policy = policy_for(config, store)
    assert watchdog.generation(store, -1) == 0
    bad = failures.Failure(
        failures.USER_CODE_ERROR, "ValueError: bad at model.py:3 (forward)", rank=1, step=9
    )

    report(store, 0, 1, bad)
    error = WorkerGroupError("rank 1 raised", {1: ValueError("bad")})
    assert policy.make_decision(error) == FailureDecision.RETRY
    assert watchdog.generation(store, -1) == 1  # the new group reads 1: the old group's reports are not its
    first = json.loads(store.get(restart_policy.decision_key(0)))
    assert first == {
        "failure": bad.to_dict(),
        "why": "",
        "generation": 0,
        "restarts": 1,
        "used": 1,
        "allowed": 1,
    }

    report(store, 1, 1, bad)
    assert policy.make_decision(error) == FailureDecision.RAISE  # budgets.userCodeError: 1 is used up
    second = json.loads(store.get(restart_policy.decision_key(1)))
    assert second["why"] == "1 UserCodeError failure used up spec.failurePolicy.budgets.userCodeError (1)"
    assert watchdog.generation(store, -1) == 1  # no new group


def test_a_dead_rank_is_named_from_rays_failed_ranks_before_its_peers_noticed(
    tmp_path: pathlib.Path, store: Any
) -> None:
    """Rank 0 is still blocked in a collective (no report yet): the dead one is rank 1, as Ray says."""
    policy = policy_for(config_for(tmp_path), store)
    assert policy.make_decision(rank_died(1)) == FailureDecision.RETRY
    decision = json.loads(store.get(restart_policy.decision_key(0)))
    assert decision["failure"]["reason"] == failures.UNKNOWN
    assert decision["failure"]["rank"] == 1 and decision["failure"]["message"].startswith("rank 1's worker")


def test_the_operators_attempts_count_against_the_budget_and_so_does_max_worker_failures(
    tmp_path: pathlib.Path, store: Any
) -> None:
    config = config_for(tmp_path)
    spent = policy_for(config, store, used={failures.UNKNOWN: 2})
    assert spent.make_decision(rank_died(0)) == FailureDecision.RAISE
    assert "budgets.unknown (2)" in json.loads(store.get(restart_policy.decision_key(0)))["why"]

    out_of_restarts = policy_for(config, store, restarts=3)
    assert out_of_restarts.make_decision(rank_died(0)) == FailureDecision.RAISE
    why = json.loads(store.get(restart_policy.decision_key(0)))["why"]  # same group: the newer decision
    assert why == "3 in-attempt restarts used up spec.failurePolicy.maxWorkerFailures (3)"


def test_a_preemption_and_a_stopping_driver_end_the_attempt(tmp_path: pathlib.Path, store: Any) -> None:
    config = config_for(tmp_path)
    report(store, 0, 0, failures.Failure(failures.PREEMPTED, "rank 0: another worker received SIGTERM", 0))
    assert policy_for(config, store).make_decision(rank_died(1)) == FailureDecision.RAISE
    assert (
        "Preempted is not restarted inside an attempt" in store.get(restart_policy.decision_key(0)).decode()
    )

    store.delete_key(watchdog.store_key(0, "failure", 0))
    stop_file = ray_train.config_module.paths_for(config).stop_file
    stop_file.parent.mkdir(parents=True, exist_ok=True)
    stop_file.write_text("signal 15\n")  # what the driver's SIGTERM handler writes
    assert policy_for(config, store).make_decision(rank_died(1)) == FailureDecision.RAISE
    assert json.loads(store.get(restart_policy.decision_key(0)))["why"] == "the driver is stopping"


def test_a_worker_group_that_cannot_start_is_left_to_ray_trains_default_policy(
    tmp_path: pathlib.Path, store: Any
) -> None:
    policy = policy_for(config_for(tmp_path), store)
    startup = ControllerError(WorkerGroupStartupTimeoutError(0))
    assert (
        policy.make_decision(startup) == FailureDecision.RETRY
    )  # Ray's default: controller_failure_limit -1
    assert not store.check([restart_policy.decision_key(0)])
    assert policy.make_decision(ControllerError(RuntimeError("scheduler gone"))) == FailureDecision.RAISE


def test_the_driver_records_each_decision_in_order_on_the_status(tmp_path: pathlib.Path, store: Any) -> None:
    config = config_for(tmp_path)
    status_file = ray_train.config_module.paths_for(config).status_file
    status_file.parent.mkdir(parents=True, exist_ok=True)
    book = ray_train.FailureBook(config, status_file=status_file)
    recorded: list[dict[str, Any]] = []

    def on_decision(decision: dict[str, Any]) -> None:
        ray_train._record_decision(book, decision)
        recorded.append(decision)

    watcher = restart_policy.DecisionWatcher(store, on_decision, first=0, interval_s=0.05).start()
    policy = policy_for(config, store)
    assert policy.make_decision(rank_died(1)) == FailureDecision.RETRY
    deadline = time.monotonic() + 10
    while not recorded and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [d["generation"] for d in recorded] == [0]  # handed over while training goes on
    assert policy.make_decision(rank_died(0)) == FailureDecision.RETRY
    assert policy.make_decision(rank_died(0)) == FailureDecision.RAISE  # budgets.unknown: 2
    last = watcher.close()
    assert last is not None and last["generation"] == 2 and last["why"]
    assert [d["generation"] for d in recorded] == [0, 1, 2]
    written = json.loads(status_file.read_text())["workerFailures"]
    assert written["counts"] == {failures.UNKNOWN: 2}
    assert [(e["rank"], e["restarted"]) for e in written["last"]] == [(0, False), (0, True), (1, True)]


def test_this_ray_train_has_the_hook_the_policy_needs() -> None:
    """Ray Train 2.60's private hook; if an upgrade removes it, this fails (the driver would fall back to a
    new controller per restart, slower but correct)."""
    assert restart_policy.supported()


def test_restarts_in_the_controller_are_the_default_and_the_driver_loop_is_a_switch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trainop_trainer import switches

    assert switches.DEFAULTS["restarts"] == "controller" and switches.restarts_in_controller()
    with trainer_support.switches_from_env(monkeypatch, "restarts=driver"):
        assert not switches.restarts_in_controller()
    with pytest.raises(ValueError, match="restarts='ray'; choose one of controller, driver"):
        switches.parse("restarts=ray")


def test_the_failed_group_stopper_is_the_default_and_uses_ray_train_hooks_that_exist(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FailedGroupStopper relies on Ray Train 2.60's worker-group callback and two WorkerGroup methods; if an
    upgrade renames them this fails (the stall test in test_trainer_ray.py shows what it does)."""
    from ray.train.v2._internal.execution.callback import WorkerGroupCallback
    from ray.train.v2._internal.execution.worker_group import WorkerGroup

    from trainop_trainer import switches

    assert callable(WorkerGroupCallback.before_worker_group_shutdown)
    assert callable(WorkerGroup.get_latest_poll_status) and callable(WorkerGroup.get_workers)
    assert issubclass(restart_policy.FailedGroupStopper, WorkerGroupCallback)
    assert switches.DEFAULTS["failed_group"] == "kill" and switches.kill_failed_group()
    with trainer_support.switches_from_env(monkeypatch, "failed_group=graceful"):
        assert not switches.kill_failed_group()
    with pytest.raises(ValueError, match="failed_group='never'; choose one of kill, graceful"):
        switches.parse("failed_group=never")
