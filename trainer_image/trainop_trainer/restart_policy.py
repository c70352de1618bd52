"""In-attempt restarts decided inside Ray Train's controller: the failure classes' budgets as Ray Train's
``FailurePolicy``, so a restartable failure restarts only the worker group (issue #17's fast recovery).

Before, Ray Train restarted nothing (``FailureConfig(max_failures=0)``): every worker-group failure ended
Ray Train's controller, and the driver classified it and built a new ``TorchTrainer`` (a new controller
actor, a new placement group, then the new workers). On a busy 2-core machine that new controller alone
took 50 s (the demo, 2026-11-27), on the GPU machine about 5 s (docs/benchmarks-gpu.md).

Now the driver hands the controller a :class:`BudgetedFailurePolicy`. On a ``WorkerGroupError`` it
classifies the failure from the ranks' own reports in the driver's store (``ray_train.classify_run_failure``,
with the ranks Ray says failed), applies the driver's rule (``failures.decide``: the class restarts inside
an attempt, its budget and ``maxWorkerFailures`` allow, the driver is not stopping) and answers RETRY (the
controller starts a new worker group on the same placement group) or RAISE (the attempt ends). Each
decision is posted to the store (:func:`decision_key`); the driver's :class:`DecisionWatcher` records it on
``status.workerFailures`` and logs it, so the policy never talks to the API (the controller actor does not
carry the driver's environment). ``used(X)`` is the driver's snapshot when the trainer was built (the
operator's ``restartsByReason`` cannot change during the attempt) plus the policy's own decisions.

Each worker group reads its number (``watchdog.GENERATION_KEY``) from the store when it starts; the policy
bumps it before answering RETRY (the driver before a restart of its own), so the new group's reports and
heartbeats never meet the old group's, and each group's failure has at most one decision.

The hook is Ray Train 2.60's ``DataParallelTrainer._initialize_and_run_controller(failure_policy=...)``, a
private method: :func:`supported` says whether it is there, and without it the driver keeps its own loop
(a new controller per restart), which remains the fallback for failures the policy did not decide
(``ControllerError``: a worker group that could not start, left to Ray Train's default policy).
"""

from __future__ import annotations

import collections
import importlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import ray
from ray.train.torch import TorchTrainer
from ray.train.v2._internal.execution.callback import WorkerGroupCallback
from ray.train.v2._internal.execution.failure_handling import FailureDecision, FailurePolicy
from ray.train.v2._internal.execution.failure_handling.default import DefaultFailurePolicy
from ray.train.v2.api.config import FailureConfig
from ray.train.v2.api.exceptions import TrainingFailedError, WorkerGroupError

from trainop.api import trainer_config
from trainop_trainer import config as config_module
from trainop_trainer import failures, switches
from trainop_trainer.lean_trainer import LeanTorchTrainer

log = logging.getLogger(__name__)
# In the controller actor only Ray Train's logger has handlers (its controller logs and the console): the
# policy's and the stopper's lines go through a child of it, next to Ray Train's own.
_controller_log = logging.getLogger("ray.train.trainop")

_HOOK = "_initialize_and_run_controller"


def decision_key(generation: int) -> str:
    """Where the policy posts its decision on the failure of worker group ``generation`` (one at most)."""
    return f"trainop/decision/{generation}"


def supported() -> bool:
    """Whether this Ray Train lets the driver hand its controller a failure policy."""
    return callable(getattr(TorchTrainer, _HOOK, None))


class BudgetedFailurePolicy(FailurePolicy):
    """Ray Train's failure policy for one attempt's trainer (runs in the controller actor; pickled)."""

    def __init__(
        self,
        failure_config: FailureConfig,
        *,
        config: trainer_config.TrainerConfig,
        store_address: str,
        world_size: int,
        used: Mapping[str, int],
        restarts: int,
    ) -> None:
        super().__init__(failure_config)
        self._default = DefaultFailurePolicy(failure_config)
        self.config = config
        self.store_address = store_address
        self.world_size = world_size
        self.used = dict(used)
        self.restarts = restarts
        self._store: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_store"] = None  # a TCPStore client is not picklable: reconnect where the policy runs
        return state

    def make_decision(self, training_failed_error: TrainingFailedError) -> FailureDecision:
        if not isinstance(training_failed_error, WorkerGroupError):
            return self._default.make_decision(training_failed_error)
        try:
            return self._decide(training_failed_error)
        except Exception:
            # The driver then classifies the failure itself, as without the policy.
            log.exception("trainop's failure policy failed; the driver decides")
            return FailureDecision.RAISE

    def _decide(self, error: WorkerGroupError) -> FailureDecision:
        from trainop_trainer import ray_train, watchdog

        if self._store is None:
            self._store = watchdog.connect(self.store_address)
        store = self._store
        current = watchdog.generation(store, -1)
        if current < 0:
            raise RuntimeError("the driver's store did not answer")
        failure = ray_train.classify_run_failure(
            store, current, self.world_size, str(error), failed_ranks=sorted(error.worker_failures)
        )
        policy = self.config.spec.failure_policy
        decision = failures.decide(
            failure,
            used=self.used.get(failure.reason, 0),
            allowed=failures.budget(policy, failure.reason),
            restarts=self.restarts,
            max_worker_failures=policy.max_worker_failures,
            stopping=_stopping(self.config),
            generation=current,
        )
        why = decision["why"]
        if not why:
            self.used[failure.reason] = decision["used"]
            self.restarts = decision["restarts"]
            store.add(watchdog.GENERATION_KEY, 1)  # before the new group starts and reads it
        store.set(decision_key(current), json.dumps(decision))
        _controller_log.info(
            "trainop: worker group %d failed (%s, rank %s): %s",
            current,
            failure.reason,
            failure.rank,
            f"the attempt ends ({why})" if why else "restarting the worker group from the newest checkpoint",
        )
        return FailureDecision.RAISE if why else FailureDecision.RETRY


def _stopping(config: trainer_config.TrainerConfig) -> bool:
    """The driver received SIGTERM/SIGINT: it wrote the stop file (``preempt.install_driver_handler``)."""
    try:
        return config_module.paths_for(config).stop_file.exists()
    except Exception:
        return False


class DecisionWatcher:
    """The driver's side: the policy's decisions, from worker group ``first`` on and in order, handed to
    ``on_decision`` (which records each on the status) from a thread that checks the store every
    ``interval_s`` (one small read; one watcher per job)."""

    def __init__(
        self,
        store: Any,
        on_decision: Callable[[dict[str, Any]], None],
        *,
        first: int,
        interval_s: float = 0.5,
    ) -> None:
        self.store = store
        self.on_decision = on_decision
        self.interval_s = interval_s
        self.next = first
        self.last: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="restart-decisions", daemon=True)

    def start(self) -> DecisionWatcher:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.drain()

    def drain(self) -> None:
        """Hand over every decision posted so far (also called once more after ``fit()`` returned)."""
        with self._lock:
            while True:
                key = decision_key(self.next)
                try:
                    if not self.store.check([key]):
                        return
                    decision = json.loads(self.store.get(key))
                except Exception as exc:
                    log.warning(
                        "reading the failure policy's decision on group %d failed (%s)", self.next, exc
                    )
                    return
                self.next += 1
                self.last = decision
                try:
                    self.on_decision(decision)
                except Exception:
                    log.exception("recording the failure policy's decision on group %d failed", self.next - 1)

    def close(self) -> dict[str, Any] | None:
        """Stop, hand over what is left, and return the last decision (None when there was none)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.drain()
        return self.last


class FailedGroupStopper(WorkerGroupCallback):
    """Kills a failed worker group's workers at once, before Ray Train's graceful shutdown of the group.

    Ray Train shuts a worker group down in two waits: its Torch backend asks every worker to destroy its
    process group (up to ``TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S``, 30 s, unless a worker is already dead),
    then every worker's actor to run its shutdown hooks (``_shutdown_workers(patience_s=5)``), and kills the
    workers after that. When one rank failed, the others are usually in a collective with it, and a worker
    whose process group cannot be destroyed cannot answer the second wait either: on the CPU a frozen
    (stalled) rank; on the GPU machine a surviving rank whose peer died, in every restart measured on
    2026-11-27 (docs/benchmarks-gpu.md, "Recovery in Ray Train's controller"), even though it answered a
    0.5 s ping just before the backend's shutdown (an earlier version of this callback killed only the
    workers that did not answer one): the backend gives up on the dead rank at once, but the survivor's
    actor is still running ``destroy_process_group`` on an NCCL communicator with a collective pending.
    Nothing is lost by not waiting: the hooks only reset Ray's metrics, a committed checkpoint is on the
    storage already, and one still being written is not committed (Ray kills the workers after its patience
    anyway). So when the latest poll of the group reported an error, this callback, first in the
    controller's list, kills every worker of the group; the graceful steps that follow find dead actors and
    end at once (Ray Train then logs "Graceful shutdown of backend failed. This is expected if one of the
    workers has crashed.", which the callback's own line announces). A group that finished, and a group the
    user aborts, are left to Ray. Runs in the controller actor; ``TRAINOP_SWITCHES=failed_group=graceful``
    leaves it out.
    """

    def before_worker_group_shutdown(self, worker_group: Any) -> None:
        status = worker_group.get_latest_poll_status()
        if status is None or not status.errors:
            return
        workers = list(worker_group.get_workers() or [])
        _controller_log.info(
            "trainop: the worker group failed (ranks %s): killing its %d workers now instead of Ray Train's "
            "graceful shutdown, which waits for ranks stuck in a collective with a failed one (the "
            "'Graceful shutdown of backend failed' warning that follows is expected)",
            sorted(status.errors),
            len(workers),
        )
        for worker in workers:
            try:
                ray.kill(worker.actor, no_restart=True)
            except Exception as exc:  # already gone: Ray's own shutdown goes on as before
                _controller_log.debug("trainop: killing a worker of the failed group: %s", exc)


#: Seconds between a group's start and its spares' start: the spares import torch and the trainer, which
#: would otherwise compete for the CPUs with the group's own start-up (model, checkpoint, first steps).
SPARE_DELAY_S = float(os.environ.get("TRAINOP_SPARE_DELAY_S", "20"))
#: How long Ray keeps a warm spare worker process alive while no actor takes it (the raylet's idle-worker
#: killer spares it until then): a day, longer than any attempt between two restarts is likely to run.
SPARE_KEEP_ALIVE_S = 24 * 3600


def _process_facts() -> tuple[str, float]:
    """Runs in a Train worker: its process's serialized runtime env (what the raylet matches a process to
    an actor by) and the process's start time (seconds since the epoch, from /proc)."""
    with open("/proc/self/stat") as stat:
        start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
    with open("/proc/stat") as stat:
        boot = next(int(line.split()[1]) for line in stat if line.startswith("btime "))
    started = boot + start_ticks / os.sysconf("SC_CLK_TCK")
    context: Any = ray.get_runtime_context()
    return str(context.get_runtime_env_string()), started


class WarmSpares(WorkerGroupCallback):
    """After a worker group starts, one idle Ray worker process per Train worker on each of the group's
    nodes, so that a restarted group's actors start in processes that have imported torch, Ray Train and
    the trainer already (issue #17's fast recovery: new processes were ~80 % of an in-attempt restart).

    The raylets preload those modules into every Python worker they start (``RAY_preload_python_modules``,
    ``trainer_config.PRELOAD_MODULES``; the operator sets it on a TrainingJob's worker pods, ``ray_train``
    for a local runtime), and this callback asks each raylet to start ``n`` workers now
    (``PrestartWorkers``, with the workers' own runtime env, kept alive for :data:`SPARE_KEEP_ALIVE_S`).
    The raylet gives a new actor an idle worker of the same job and runtime env when it has one. Only for a
    Ray cluster that is the job's own (``trainer_config.WARM_SPARES_ENV``, set by the operator on a
    TrainingJob's pods): on a shared runtime (a sweep's trials, the test tier's Ray) spares would pile up.
    Everything runs on a thread of the controller actor, :data:`SPARE_DELAY_S` after the group started, and
    nothing of it can fail the run: a spare that cannot be started is logged, and a restart then starts its
    processes as before. Each group start also logs how many of its workers started in a process that was
    ready before the group (a spare, or one of the idle workers Ray starts for a new job).
    """

    def __init__(self) -> None:  # built in the driver, pickled to the controller: no thread objects yet
        self._group_started = 0.0
        self._group_stopped: threading.Event | None = None

    def before_worker_group_start(self, worker_group_context: Any) -> None:
        self._group_started = time.time()

    def after_worker_group_start(self, worker_group: Any) -> None:
        workers = list(worker_group.get_workers() or [])
        stopped = self._group_stopped = threading.Event()
        if workers:
            threading.Thread(
                target=self._prestart,
                args=(workers, self._group_started, stopped),
                name="trainop-spares",
                daemon=True,
            ).start()

    def before_worker_group_shutdown(self, worker_group: Any) -> None:
        if self._group_stopped is not None:
            self._group_stopped.set()

    def _prestart(self, workers: list[Any], group_started: float, stopped: threading.Event) -> None:
        try:
            facts = ray.get([worker.actor.execute.remote(_process_facts) for worker in workers], timeout=120)
            spares = sum(1 for _, created in facts if created < group_started)
            _controller_log.info(
                "trainop: %d of this group's %d workers started in a process that was ready before the group "
                "(a warm spare, or an idle worker Ray started itself)",
                spares,
                len(workers),
            )
            if stopped.wait(SPARE_DELAY_S):
                return
            per_node = collections.Counter(worker.metadata.node_id for worker in workers)
            started = prestart_workers(per_node, runtime_env=facts[0][0])
            _controller_log.info(
                "trainop: %d warm spare worker process(es) started on %d node(s) for a restarted group",
                started,
                len(per_node),
            )
        except Exception as exc:  # an optimisation only: a restart then starts new processes, as before
            _controller_log.warning("trainop: no warm spare workers (%s: %s)", type(exc).__name__, exc)


def prestart_workers(per_node: Mapping[str, int], *, runtime_env: str) -> int:
    """Ask the raylet of each node in ``per_node`` to start that many Python workers of this job with the
    serialized ``runtime_env``; the number asked for. The raylet's ``PrestartWorkers`` call, with the
    cluster's token when token authentication is on (Ray's own clients send it the same way)."""
    # Ray's generated gRPC modules and its token loader are untyped internals of Ray 2.60 (the image's).
    grpc: Any = importlib.import_module("grpc")
    raylet: Any = importlib.import_module("ray._raylet")
    common: Any = importlib.import_module("ray.core.generated.common_pb2")
    node_manager: Any = importlib.import_module("ray.core.generated.node_manager_pb2")
    node_manager_grpc: Any = importlib.import_module("ray.core.generated.node_manager_pb2_grpc")
    runtime_environment: Any = importlib.import_module("ray.core.generated.runtime_environment_pb2")
    ray_api: Any = ray

    header = raylet.AuthenticationTokenLoader.instance().get_token_for_http_header(ignore_auth_mode=True)
    metadata = tuple((key.lower(), value) for key, value in header.items())
    job_id = bytes.fromhex(ray_api.get_runtime_context().get_job_id())
    addresses = {
        node["NodeID"]: f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}"
        for node in ray_api.nodes()
        if node.get("Alive")
    }
    asked = 0
    for node_id, count in per_node.items():
        with grpc.insecure_channel(addresses[node_id]) as channel:
            node_manager_grpc.NodeManagerServiceStub(channel).PrestartWorkers(
                node_manager.PrestartWorkersRequest(
                    language=common.Language.PYTHON,
                    job_id=job_id,
                    runtime_env_info=runtime_environment.RuntimeEnvInfo(serialized_runtime_env=runtime_env),
                    keep_alive_duration_secs=SPARE_KEEP_ALIVE_S,
                    num_workers=count,
                ),
                metadata=metadata,
                timeout=30,
            )
        asked += count
    return asked


class PolicyTorchTrainer(LeanTorchTrainer):
    """A ``TorchTrainer`` (:class:`LeanTorchTrainer`) whose controller decides restarts with the policy
    ``failure_policy`` builds, (unless ``switches`` say ``failed_group=graceful``) stops a failed group with
    :class:`FailedGroupStopper`, and with ``warm_spares`` (a TrainingJob's own Ray cluster, in-attempt
    restarts allowed) keeps :class:`WarmSpares`."""

    def __init__(
        self,
        *args: Any,
        failure_policy: Callable[[FailureConfig], FailurePolicy],
        warm_spares: bool = False,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self._trainop_failure_policy = failure_policy
        self._trainop_kill_failed_group = switches.kill_failed_group()
        self._trainop_warm_spares = warm_spares

    def _initialize_and_run_controller(self, **controller_init_kwargs: Any) -> Any:
        ray_default = controller_init_kwargs["failure_policy"]  # built by fit() from RunConfig.failure_config
        controller_init_kwargs["failure_policy"] = self._trainop_failure_policy(ray_default.failure_config)
        if self._trainop_kill_failed_group:
            # First, so that it runs before the Torch backend's graceful shutdown waits on the workers.
            controller_init_kwargs["callbacks"] = [FailedGroupStopper(), *controller_init_kwargs["callbacks"]]
        if self._trainop_warm_spares:
            controller_init_kwargs["callbacks"] = [*controller_init_kwargs["callbacks"], WarmSpares()]
        return super()._initialize_and_run_controller(**controller_init_kwargs)
