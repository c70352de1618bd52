"""The phase state machine: ``next_status(verdict, current, observed) -> Transition``, a pure function.

::

    (new) -> Pending -> Provisioning -> Running -> Succeeded
               ^             |            |
               |             +-----+------+--> Failed   (no restarts left, deadline, RayJob invalid/stopped)
               |                   |
               |                   v  (RayJob FAILED or stalled; its class's budget not used up)
               +----(backoff)--- Restarting              attempt N+1, same run name: resumes
               |
               +----(suspend: false)-- Suspended <-- (spec.suspend: true, from any unfinished phase)

    Pending       the attempt's RayJob is created; KubeRay has not reported on it yet
    Provisioning  KubeRay is creating the Ray cluster / submitting the Ray job
    Running       the Ray job runs (KubeRay: jobStatus RUNNING)

Only the operator-owned part of the status is read and written here (``operator_status.OperatorStatus``,
as extended by the owner's kind); the trainer's fields (progress, checkpoint, network) never pass through
this module, so a status patch made from its result cannot overwrite them. One of them is read, as an
observation: with checkpoints in a bucket, the driver's start-up check (``status.storage``, in
``Observed.storage_check``) is the truth StorageReady tells -- the operator has no claim to look at and not
the job's credentials.

The status tells the truth at every moment: ``children`` names only objects that exist or that the
reconcile writing it is about to create, and while the RayJob cannot be created -- its storage does not
exist yet, or a namesake's leftover is still being deleted -- the phase stays Pending, ``children.rayJob``
stays empty and the conditions say what is awaited. No RayJob (so no pod) starts before its claim exists.

Restart timing is persisted, never only slept on: entering Restarting records ``nextRestartTime``; the
next attempt starts on the first reconcile at or after it, whichever operator process runs it. A Transition
carries ``requeue_after`` so the caller can schedule that reconcile. The caller must write the status
before acting on the Transition (creating or deleting RayJobs): the status is the record of intent, so a
crash between the two repeats the same actions and never loses a failure or double-counts a restart.

Every failed attempt is classified (``failures.classify``: the trainer's account, the pod facts, the
RayJob; a worker the trainer saw die without a word waits up to EVIDENCE_WAIT_S after the RayJob's end
for the pods' facts before it is recorded as Unknown) and the class decides: a failure of class X is
retried iff used(X) = restartsByReason[X] + workerFailures.counts[X] (the trainer's in-attempt restarts)
is below failurePolicy.budgets[X], and maxRestarts (when set) is not reached. Preempted and NodeLost
restart at once; other classes wait backoffSeconds doubled per earlier restart of that class.

The operator's watchdog: while Running, a TrainingJob whose ``status.progress.updated`` is older than
stallTimeoutSeconds + 2 x reporting.everySeconds, counted from the later of that time and the Running
condition's lastTransitionTime (a new attempt re-arms it), is stalled: Progressing=False/Stalled, a Warning
Event, and the attempt is failed as Stalled -- its RayJob deleted, a new attempt resuming from the newest
checkpoint. Its timing is a ``requeue_after`` like a restart's, recomputed from the status at every
reconcile: no timer lives only in memory.

Suspend is not a restart: resuming creates attempt N+1 but leaves ``restarts`` alone, and resets
``startTime`` (the activeDeadlineSeconds clock stops while suspended, as for batch/v1 Jobs).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping

from trainop.api import manifest, operator_status, trainer_config, trainingjob
from trainop.api.operator_status import MAX_FAILURE_HISTORY, Children, Failure, FailureReason, Phase
from trainop.controller import acceptance, conditions, failures, goodput, kinds, observe

# How long after a RayJob's end a worker process that died without a word (the trainer's Unknown) waits for
# the pods' facts before it is recorded as Unknown: a container's OOMKilled status can reach the API after
# the RayJob reports FAILED (the kubelet's status sync against Ray's detection of the dead worker).
EVIDENCE_WAIT_S = 10.0

# Phases whose entry is announced with an Event: outcomes and what a user did or must look at. Entering
# Pending or Provisioning is progress, which the status shows; an Event for it would be one more write per
# job (and per attempt) saying what `kubectl get` already says.
ANNOUNCED_PHASES = frozenset(
    {Phase.RUNNING, Phase.RESTARTING, Phase.SUSPENDED, Phase.SUCCEEDED, Phase.FAILED}
)


# The Warning Event's reason when an attempt starts while the job's trainop.dev/price-per-gpu-hour
# annotation is not a price (``trainer_config.price_annotation_problem``).
INVALID_PRICE = "InvalidPriceAnnotation"


@dataclasses.dataclass(frozen=True)
class Observed:
    now: datetime.datetime
    generation: int | None
    # Every RayJob labelled with the owner, by name (only the current attempt's matters).
    ray_jobs: Mapping[str, observe.RayJobObservation]
    claim: observe.ClaimObservation | None
    pod_problems: tuple[observe.Problem, ...] = ()
    # Problems creating children in the previous reconcile, by child kind ("PersistentVolumeClaim", "RayJob").
    create_errors: Mapping[str, observe.Problem] = dataclasses.field(default_factory=dict)
    # RayJobs labelled with this owner's name that another incarnation of it made (a deleted namesake's).
    foreign_ray_jobs: frozenset[str] = frozenset()
    # Server-side applied children under this owner's names seen being deleted ("Role mlp-trainer").
    leftovers: tuple[str, ...] = ()
    # The Ray pods of the stored attempt and the one before it that may still run, by attempt: a new attempt
    # waits until no pod of an earlier one may run, whose workers may still be writing the checkpoint it
    # resumes from (the preStop hook's, within the pods' grace period).
    attempt_pods: Mapping[int, tuple[observe.PodLife, ...]] = dataclasses.field(default_factory=dict)
    # Ray pods under this owner's name that a deleted incarnation of it made and that may still run: its
    # checkpoint claim outlives it (a namesake adopts it), so they may still be writing into it.
    namesake_pods: tuple[observe.PodLife, ...] = ()
    # The trainer driver's start-up check of the checkpoint storage (status.storage), read only: with
    # checkpoint.storage.s3 it is what StorageReady says (``conditions.object_storage``).
    storage_check: trainingjob.StorageStatus | None = None
    # The trainer's records, read only: its account of failures (status.workerFailures) and its last
    # progress report (status.progress), for the failure class, the budgets, the watchdog and goodput.
    worker_failures: trainingjob.WorkerFailures | None = None
    progress: trainingjob.Progress | None = None
    # What the attempt's Ray pods showed while it ran (``failures.pod_facts``), kept by the reconciler.
    pod_facts: tuple[failures.PodFact, ...] = ()
    # spec.ttlSecondsAfterFinished as stored, unchecked: the TTL of a spec that never validated (there is
    # no accepted spec to read it from); anything but an integer in range is no TTL.
    raw_ttl_seconds_after_finished: object = None


@dataclasses.dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str
    # What makes this Event unique in the owner's life (a transition, at an attempt): the Event's name is
    # derived from it, so a reconcile repeated after a crash posts it once, not twice.
    key: str = ""


@dataclasses.dataclass(frozen=True)
class Transition:
    """One evaluation of the state machine: the status it leads to, and what the caller does next."""

    status: operator_status.OperatorStatus
    events: tuple[Event, ...] = ()
    # The only RayJob of this owner that may exist; the caller deletes every other one.
    ray_job: str | None = None
    create_ray_job: bool = False
    # Create or update the ConfigMap, claim, ServiceAccount, Role and RoleBinding.
    apply_children: bool = False
    # Add this owner's reference to the checkpoint claim found under its name (deleteWithJob: true).
    adopt_claim: bool = False
    delete_owner: bool = False
    requeue_after: float | None = None
    restarted: bool = False
    time_to_running: float | None = None
    # The class of the failure this transition records (counted once its status is written).
    failed: FailureReason | None = None


def restart_delay(
    policy: trainingjob.FailurePolicy, restarts: int, reason: FailureReason | None = None
) -> int:
    """Seconds before a restart after ``restarts`` earlier ones (of the same class): backoffSeconds doubling
    per restart, capped; none for the classes the cluster causes (Preempted, NodeLost)."""
    if reason in trainingjob.NO_BACKOFF_REASONS:
        return 0
    return min(policy.backoff_seconds * int(2 ** min(restarts, 32)), policy.max_backoff_seconds)


# What to change when a class's budget is used up, after "fix ..., or raise the budget".
BUDGET_HINTS: dict[FailureReason, str] = {
    FailureReason.PREEMPTED: "the cluster keeps taking the pods away: move the job to nodes that are not "
    "reclaimed",
    FailureReason.NODE_LOST: "nodes keep failing under the job: ask the cluster's operators",
    FailureReason.OOM_KILLED: "lower hyperparameters.batchSizePerWorker or raise workers.memoryPerWorker",
    FailureReason.STALLED: "find where it hangs (the stacks the trainer wrote, the worker logs), or raise "
    "spec.failurePolicy.stallTimeoutSeconds if a step, checkpoint or evaluation really takes that long",
    FailureReason.NCCL_ERROR: "check the network between the workers (status.network; NCCL_DEBUG=INFO in "
    "the worker logs)",
    FailureReason.USER_CODE_ERROR: "fix the code",
    FailureReason.INFRA_ERROR: "fix the image or what the pods ask for (kubectl describe the Ray pods)",
    FailureReason.INVALID_SPEC: "fix the spec",
    FailureReason.UNKNOWN: "read the Ray job's logs (kubectl trainop logs)",
}


def budget_used(
    status: operator_status.OperatorStatus,
    worker_failures: trainingjob.WorkerFailures | None,
    reason: FailureReason,
) -> int:
    """used(X): new attempts after X (operator) plus in-attempt restarts after X (trainer)."""
    return status.restarts_by_reason.get(reason.value, 0) + failures.worker_failure_counts(
        worker_failures
    ).get(reason.value, 0)


def stall_after(spec: trainingjob.TrainingJobSpec) -> float:
    """Seconds without a status.progress update after which the operator's watchdog fires."""
    return spec.failure_policy.stall_timeout_seconds + 2 * spec.reporting.every_seconds


def next_status(
    verdict: acceptance.Acceptance, current: operator_status.OperatorStatus, observed: Observed
) -> Transition:
    return _Evaluation(verdict, current, observed).run()


class _Evaluation:
    """One evaluation of the state machine; a class only to share the working copy between its steps."""

    def __init__(
        self, verdict: acceptance.Acceptance, current: operator_status.OperatorStatus, observed: Observed
    ) -> None:
        self.verdict = verdict
        self.current = current
        self.observed = observed
        self.now = observed.now
        self.status = current.model_copy(deep=True)
        self.status.observed_generation = observed.generation
        self.note: tuple[str, str] | None = None  # (reason, message) explaining the phase
        self.events: list[Event] = []
        self.requeues: list[float] = []
        self.ray: observe.RayJobObservation | None = None
        self.stall: str | None = None  # the watchdog's finding, when it fired in this evaluation
        self.failed: FailureReason | None = None  # the class of a failure recorded in this evaluation

    # ----------------------------------------------------------------------------------------- flow
    def run(self) -> Transition:
        resource = self.verdict.resource
        if resource is None:
            if not self._finished:
                fields = "; ".join(str(e) for e in self.verdict.errors)
                self._finish(Phase.FAILED, "InvalidSpec", f"The spec is invalid: {fields}.")
            return self._expire(self._raw_ttl(), keep=None)
        self._describe_children(resource)
        life = kinds.lifecycle(resource)
        if self._never_started_for_an_invalid_spec():
            # The spec was fixed: the job failed before it ever ran, so it simply starts now.
            self.status.phase = None
            self.status.completion_time = None
        if self._finished:
            return self._after_finish(life)
        if self.status.phase is None:
            self.status.phase = Phase.PENDING
        if self._deadline_passed(life):
            return self._after_finish(life)
        if life.suspend:
            self._enter(
                Phase.SUSPENDED,
                "Suspended",
                f"spec.suspend is true: the RayJob is deleted and checkpoints stay in "
                f"{kinds.checkpoint_location(resource)}. Set suspend to false to resume from the latest "
                "checkpoint.",
            )
            self.status.next_restart_time = None
            return self._decide(apply_children=True)
        if self.status.phase == Phase.SUSPENDED:
            self.status.attempt += 1
            self.status.start_time = _fmt(self.now)
            self.status.phase = Phase.PENDING
            self.events.append(
                Event(
                    "Normal",
                    "Resumed",
                    f"spec.suspend is false: attempt {self.status.attempt} resumes "
                    "from the latest checkpoint.",
                    key=f"resumed/{self.status.attempt}",
                )
            )
        restarted = False
        if self.status.phase == Phase.RESTARTING:
            due = observe.parse_time(self.status.next_restart_time) or self.now
            if self.now < due:
                self.requeues.append((due - self.now).total_seconds())
                return self._decide(apply_children=True)
            self.status.attempt += 1
            self.status.restarts += 1
            ended = [f for f in self.status.failures if f.attempt == self.status.attempt - 1]
            if ended:
                cause = ended[-1].reason
                self.status.restarts_by_reason = {
                    **self.status.restarts_by_reason,
                    cause: self.status.restarts_by_reason.get(cause, 0) + 1,
                }
            self.status.next_restart_time = None
            self.status.phase = Phase.PENDING
            restarted = True
        if self.status.attempt == 0:
            self.status.attempt = 1
            self.status.start_time = self.status.start_time or _fmt(self.now)
        return self._follow_ray_job(resource, life, restarted=restarted)

    def _follow_ray_job(
        self, resource: manifest.Resource, life: kinds.Lifecycle, *, restarted: bool
    ) -> Transition:
        kind = self.verdict.kind
        attempt = self.status.attempt
        name = kind.ray_job_name(resource.metadata.name, attempt)
        self.ray = ray = self.observed.ray_jobs.get(name)
        state = ray.state if ray is not None else observe.AttemptState.ABSENT
        was_running = self.current.phase == Phase.RUNNING
        match state:
            case observe.AttemptState.ABSENT:
                blocker = self._ray_job_blocker(resource, name, attempt)
                if blocker is not None:
                    reason, awaited = blocker
                    self._enter(
                        Phase.PENDING,
                        reason,
                        f"Waiting for {awaited} before creating RayJob {name} (attempt {attempt}).",
                    )
                    self.status.children = _with_ray_job(self.status.children, None)
                    return self._decide(apply_children=True, ray_job=name)
                self._enter(
                    Phase.PENDING,
                    "Pending",
                    f"Waiting for KubeRay to start RayJob {name} (attempt {attempt}).",
                )
            case observe.AttemptState.NEW:
                self._enter(
                    Phase.PENDING,
                    "Pending",
                    f"Waiting for KubeRay to start RayJob {name} (attempt {attempt}).",
                )
            case observe.AttemptState.STARTING:
                self._enter(
                    Phase.PROVISIONING,
                    "Provisioning",
                    f"KubeRay is starting the Ray cluster of RayJob {name} (attempt {attempt}).",
                )
                stuck = self._stuck_pods(ray, life)
                if stuck is not None:
                    return self._after_failure_of(attempt, stuck, life)
            case observe.AttemptState.RUNNING:
                self._enter(
                    Phase.RUNNING,
                    "Running",
                    f"Attempt {attempt} runs in RayJob {name} with "
                    f"{kinds.worker_replicas(resource)} worker pods.",
                )
                assert ray is not None
                head_lost = next((p for p in ray.problems if p.reason == observe.HEAD_POD_LOST), None)
                if head_lost is not None:
                    return self._after_failure_of(attempt, self._head_lost(ray, head_lost), life)
                stall = self._stall(resource, was_running=was_running)
                if stall is not None:
                    self.stall = stall
                    self.events.append(Event("Warning", conditions.STALLED, stall, key=f"stalled/{attempt}"))
                    return self._after_failure_of(
                        attempt,
                        failures.Classification(FailureReason.STALLED, stall, "operator"),
                        life,
                    )
            case observe.AttemptState.SUCCEEDED:
                self._finish(Phase.SUCCEEDED, "Succeeded", f"Attempt {attempt} (RayJob {name}) finished.")
                return self._after_finish(life)
            case observe.AttemptState.STOPPED:
                self._finish(
                    Phase.FAILED,
                    "RayJobStopped",
                    f"The Ray job of RayJob {name} was stopped outside "
                    "trainop (ray job stop); use spec.suspend to pause.",
                )
                return self._after_finish(life)
            case observe.AttemptState.INVALID | observe.AttemptState.FAILED:
                assert ray is not None
                return self._after_failure(ray, life)
        time_to_running = None
        if self.status.phase == Phase.RUNNING and not was_running and ray is not None and ray.created:
            time_to_running = max((self.now - ray.created).total_seconds(), 0.0)
        create = ray is None
        if create:
            self._warn_of_a_bad_price(resource, attempt)
        # Named while it exists, or while this reconcile creates it; not while its creation keeps failing.
        named = not create or not self.observed.create_errors
        self.status.children = _with_ray_job(self.status.children, name if named else None)
        return self._decide(
            apply_children=True,
            ray_job=name,
            create_ray_job=create,
            restarted=restarted,
            time_to_running=time_to_running,
        )

    def _warn_of_a_bad_price(self, resource: manifest.Resource, attempt: int) -> None:
        """A Warning Event when the attempt being created gets its trainer config (so its price) while the
        job's price annotation is malformed: cost is an estimate, so the job runs, on the chart's price."""
        if not isinstance(resource, trainingjob.TrainingJob):
            return  # a sweep's config carries no price
        problem = trainer_config.price_annotation_problem(resource.metadata.annotations)
        if problem is not None:
            self.events.append(Event("Warning", INVALID_PRICE, problem, key=f"price/{attempt}"))

    def _after_failure(self, ray: observe.RayJobObservation, life: kinds.Lifecycle) -> Transition:
        attempt = self.status.attempt
        found = failures.classify(
            attempt=attempt,
            ray=ray,
            worker_failures=self.observed.worker_failures,
            facts=self.observed.pod_facts,
        )
        recorded = self.status.failures
        if (found.reason, found.source) == (FailureReason.UNKNOWN, "trainer") and ray.ended is not None:
            # The trainer saw a worker process vanish and nothing says why yet: a container OOM-killed
            # with it reaches the API as OOMKilled only after its kubelet's next status sync, which can
            # come after the RayJob's end. Wait a little for the pods' account.
            left = EVIDENCE_WAIT_S - (self.now - ray.ended).total_seconds()
            if left > 0 and not (recorded and recorded[-1].attempt == attempt):
                self.requeues.append(left)
                return self._decide(apply_children=True, ray_job=ray.name)
        return self._after_failure_of(attempt, found, life)

    def _after_failure_of(
        self, attempt: int, found: failures.Classification, life: kinds.Lifecycle
    ) -> Transition:
        """Record the failure of ``attempt`` (once), then restart within its class's budget or fail."""
        recorded = self.status.failures
        if recorded and recorded[-1].attempt == attempt:
            # Recorded by an earlier reconcile whose writes did not all land: the record decides.
            reason = failures.as_reason(recorded[-1].reason)
            message = recorded[-1].message
        else:
            reason, message = found.reason, found.message
            failure = Failure(attempt=attempt, reason=reason.value, message=message, time=_fmt(self.now))
            self.status.failures = [*recorded, failure][-MAX_FAILURE_HISTORY:]
            self.failed = reason
        what = f"Attempt {attempt} failed: {reason.value}: {message or 'no message'}"
        policy = life.failure_policy
        budget = policy.budgets.of(reason)
        used = budget_used(self.status, self.observed.worker_failures, reason)
        key = trainingjob.FailureBudgets.key(reason)
        if used >= budget:
            self._finish(
                Phase.FAILED,
                reason.value,
                f"{reason.value}: {message or 'no message'} (attempt {attempt}); the {key} budget ({budget}) "
                f"is used up: {BUDGET_HINTS[reason]}, or raise spec.failurePolicy.budgets.{key}.",
            )
            return self._after_finish(life)
        if policy.max_restarts is not None and self.status.restarts >= policy.max_restarts:
            self._finish(
                Phase.FAILED,
                reason.value,
                f"{what}; no restarts left (spec.failurePolicy.maxRestarts={policy.max_restarts}): raise or "
                "unset maxRestarts to let the per-class budgets decide.",
            )
            return self._after_finish(life)
        delay = restart_delay(policy, self.status.restarts_by_reason.get(reason.value, 0), reason)
        due = _ceil_second(self.now + datetime.timedelta(seconds=delay))
        self.status.next_restart_time = _fmt(due)
        self._enter(
            Phase.RESTARTING,
            reason.value,
            f"{what}. Attempt {attempt + 1} starts at {_fmt(due)} and resumes from the latest checkpoint "
            f"({key} budget: {used + 1} of {budget} used"
            + (
                f"; restart {self.status.restarts + 1} of maxRestarts {policy.max_restarts}"
                if policy.max_restarts is not None
                else ""
            )
            + ").",
        )
        self.requeues.append((due - self.now).total_seconds())
        return self._decide(apply_children=True)

    def _head_lost(self, ray: observe.RayJobObservation, problem: observe.Problem) -> failures.Classification:
        """A running attempt whose Ray cluster lost its head pod: KubeRay v1.5 neither makes a new head nor
        fails the RayJob (HTTPMode), so the attempt is over. Its class comes from what the pods showed (a
        deletion with a grace period is Preempted, a lost node NodeLost); without such a fact (an operator
        restarted since) it is NodeLost: a head pod goes only with its node or by someone's hand."""
        found = failures.classify_facts(self.observed.pod_facts, ended=None)
        text = f"RayJob {ray.name}: {problem.message}"
        if found is not None:
            return failures.Classification(found.reason, f"{text}; {found.message}", "pods")
        return failures.Classification(FailureReason.NODE_LOST, text, "rayjob")

    def _stuck_pods(
        self, ray: observe.RayJobObservation | None, life: kinds.Lifecycle
    ) -> failures.Classification | None:
        """InfraError when the starting attempt's Ray pods still wait on something that will not fix itself
        (``observe.STUCK_WAITING_REASONS``: an image pull, a missing Secret, a crash loop)
        ``stuckPodTimeoutSeconds`` after its RayJob was created; else None (and the reconcile at which it
        would fire is requested). Unschedulable pods wait: a node may join (an autoscaler)."""
        stuck = [p for p in self.observed.pod_problems if p.reason in observe.STUCK_WAITING_REASONS]
        if not stuck or ray is None or ray.created is None:
            return None
        limit = life.failure_policy.stuck_pod_timeout_seconds
        due = ray.created + datetime.timedelta(seconds=limit)
        if self.now < due:
            self.requeues.append((due - self.now).total_seconds())
            return None
        waited = int((self.now - ray.created).total_seconds())
        first = stuck[0]
        return failures.Classification(
            FailureReason.INFRA_ERROR,
            f"{first.reason}: {first.message}; the Ray pods of RayJob {ray.name} did not start in {waited} s "
            f"(spec.failurePolicy.stuckPodTimeoutSeconds: {limit})",
            "pods",
        )

    def _stall(self, resource: manifest.Resource, *, was_running: bool) -> str | None:
        """The watchdog's finding when the running attempt reported no progress for too long, else None
        (and the reconcile at which it would fire is requested). TrainingJobs only: a sweep's driver
        reports trials, not steps."""
        if not isinstance(resource, trainingjob.TrainingJob):
            return None
        spec = resource.spec
        limit = stall_after(spec)
        entered = self._running_since() if was_running else self.now
        progress = self.observed.progress
        reported = observe.parse_time(progress.updated) if progress is not None else None
        since = max(entered, reported) if reported is not None else entered
        if reported is None or reported < entered:
            # Before the attempt's first report: Ray Train's start-up, a compile, a data copy. Twice the
            # timeout, so a loaded cluster's start-up is not restarted as a stall.
            limit += spec.failure_policy.stall_timeout_seconds
        # The trainer's own account of a failure in this attempt (an in-attempt restart under way) re-arms
        # the clock: the restarted workers get the whole window to report, the operator does not race them.
        for entry in self.observed.worker_failures.last if self.observed.worker_failures else ():
            when = observe.parse_time(entry.time)
            if entry.attempt == self.status.attempt and when is not None and when > since:
                since = when
        due = since + datetime.timedelta(seconds=limit)
        if self.now < due:
            self.requeues.append((due - self.now).total_seconds())
            return None
        last = (
            f"the last one at {progress.updated} (step {progress.step})"
            if progress is not None and reported is not None and reported >= entered
            else "none since the attempt started running"
        )
        silent = int((self.now - since).total_seconds())
        return (
            f"Attempt {self.status.attempt} made no reported progress for {silent} s ({last}): longer "
            f"than spec.failurePolicy.stallTimeoutSeconds ({spec.failure_policy.stall_timeout_seconds}) + "
            "2 x "
            f"reporting.everySeconds ({spec.reporting.every_seconds:g}); its RayJob is deleted and a new "
            "attempt resumes from the latest checkpoint."
        )

    def _running_since(self) -> datetime.datetime:
        for condition in self.current.conditions:
            if condition.type == conditions.RUNNING and condition.status == "True":
                return observe.parse_time(condition.last_transition_time) or self.now
        return self.now

    def _after_finish(self, life: kinds.Lifecycle) -> Transition:
        """Finished: keep the last RayJob only if KubeRay finished it too; expire after the TTL."""
        resource = self.verdict.resource
        keep = None
        if resource is not None and self.status.attempt > 0:
            name = self.verdict.kind.ray_job_name(resource.metadata.name, self.status.attempt)
            self.ray = self.ray or self.observed.ray_jobs.get(name)
            if self.ray is not None and self.ray.state.terminal:
                keep = name
        self.status.children = _with_ray_job(self.status.children, keep)
        return self._expire(life.ttl_seconds_after_finished, keep=keep)

    def _expire(self, ttl: int | None, *, keep: str | None) -> Transition:
        """A finished owner: deleted once ``ttl`` seconds passed since its completionTime, else requeued."""
        completed = observe.parse_time(self.status.completion_time)
        if ttl is not None and completed is not None:
            due = completed + datetime.timedelta(seconds=ttl)
            if self.now >= due:
                return self._decide(ray_job=keep, delete_owner=True)
            self.requeues.append((due - self.now).total_seconds())
        return self._decide(ray_job=keep)

    def _raw_ttl(self) -> int | None:
        """ttlSecondsAfterFinished of a spec that never validated, when it is itself valid; else None."""
        ttl = self.observed.raw_ttl_seconds_after_finished
        if isinstance(ttl, bool) or not isinstance(ttl, int):
            return None
        if 0 <= ttl <= trainingjob.MAX_DURATION_SECONDS:
            return ttl
        return None

    # ---------------------------------------------------------------------------------------- steps
    def _never_started_for_an_invalid_spec(self) -> bool:
        failed = [c for c in self.current.conditions if c.type == conditions.FAILED and c.status == "True"]
        return (
            self.status.phase == Phase.FAILED
            and self.status.attempt == 0
            and bool(failed)
            and failed[0].reason == "InvalidSpec"
        )

    @property
    def _finished(self) -> bool:
        return self.status.phase is not None and self.status.phase.finished

    def _deadline_passed(self, life: kinds.Lifecycle) -> bool:
        started = observe.parse_time(self.status.start_time)
        deadline = life.active_deadline_seconds
        if deadline is None or started is None or life.suspend or self.status.phase == Phase.SUSPENDED:
            return False
        due = started + datetime.timedelta(seconds=deadline)
        if self.now < due:
            self.requeues.append((due - self.now).total_seconds())
            return False
        self._finish(
            Phase.FAILED,
            "DeadlineExceeded",
            f"The {self.verdict.kind.kind} ran longer than spec.activeDeadlineSeconds={deadline} (started "
            f"{self.status.start_time}); raise or unset activeDeadlineSeconds to allow longer runs.",
        )
        return True

    def _describe_children(self, resource: manifest.Resource) -> None:
        """Name the children that exist or that this reconcile creates (the RayJob is named later)."""
        kind = self.verdict.kind
        name = resource.metadata.name
        errors = self.observed.create_errors
        previous = self.status.children.ray_job if self.status.children else None
        self.status.children = Children(
            ray_job=previous,
            config_map=None if "ConfigMap" in errors else kind.config_map_name(name),
            persistent_volume_claim=self._claim_name_if_there(resource),
            service_account=None if "ServiceAccount" in errors else kind.service_account_name(name),
        )
        if isinstance(self.status, trainingjob.TrainingJobOperatorStatus):
            spec = kinds.training_spec(resource)
            self.status.workers = spec.workers.replicas
            self.status.gpus = spec.workers.replicas * spec.workers.gpus_per_worker

    def _claim_name_if_there(self, resource: manifest.Resource) -> str | None:
        claim = self.observed.claim
        if claim is None:
            return None
        if claim.phase == observe.ClaimPhase.MISSING:
            created_here = not kinds.training_spec(resource).checkpoint.storage.existing_claim
            return (
                claim.name
                if created_here and "PersistentVolumeClaim" not in self.observed.create_errors
                else None
            )
        if claim.being_deleted or (
            claim.ownership == observe.Ownership.OTHER and self._creates_claim(resource)
        ):
            return None
        return claim.name

    @staticmethod
    def _creates_claim(resource: manifest.Resource) -> bool:
        return not kinds.training_spec(resource).checkpoint.storage.existing_claim

    def _ray_job_blocker(
        self, resource: manifest.Resource, name: str, attempt: int
    ) -> tuple[str, str] | None:
        """(reason, what is awaited) while the attempt's RayJob must not be created yet; None when it may."""
        claim = self.observed.claim
        if claim is not None:
            if claim.being_deleted:
                return "WaitingForStorage", f"claim {claim.name}, which is being deleted, to go"
            if not self._creates_claim(resource) and claim.phase == observe.ClaimPhase.MISSING:
                return "WaitingForStorage", f"claim {claim.name} (spec.checkpoint.storage.existingClaim)"
            if self._creates_claim(resource) and claim.ownership == observe.Ownership.OTHER:
                return "WaitingForStorage", f"claim {claim.name}, which another object owns, to be deleted"
            if claim.phase == observe.ClaimPhase.LOST:
                return "WaitingForStorage", f"claim {claim.name} to get a volume back"
        kind = self.verdict.kind.kind
        if name in self.observed.foreign_ray_jobs:
            return "WaitingForDeletion", f"RayJob {name} of a deleted {kind} of the same name to be deleted"
        if self.observed.leftovers:
            gone = ", ".join(self.observed.leftovers)
            return "WaitingForDeletion", f"{gone} of a deleted {kind} of the same name to be deleted"
        namesakes = [life for life in self.observed.namesake_pods if life.may_run(self.now)]
        if namesakes:
            return "WaitingForDeletion", (
                f"the Ray pods of a deleted {kind} of the same name to stop "
                f"({self._wake_at_deadline(namesakes)}; they may still be writing its checkpoints)"
            )
        for earlier, lives in sorted(self.observed.attempt_pods.items()):
            if self._failed_ungracefully(earlier):
                # A rank died (its process, its node) or stalled: no graceful checkpoint of that attempt can
                # complete (every rank writes its shard), and a lost node's pod would hold the restart for its
                # whole grace period. Only a suspend (or restart) and a preemption stop the ranks gracefully.
                continue
            running = [life for life in lives if earlier < attempt and life.may_run(self.now)]
            if running:
                return (
                    "WaitingForPreviousAttempt",
                    f"the Ray pods of attempt {earlier} to stop ({self._wake_at_deadline(running)}; they may "
                    "still be writing the checkpoint this attempt resumes from)",
                )
        return None

    def _wake_at_deadline(self, running: list[observe.PodLife]) -> str:
        """Names the pods awaited; their events wake the owner as they go, but a lost node's pod sends
        none: a requeue wakes it at the first deletion deadline."""
        dues = [life.deletion_due for life in running if life.deletion_due is not None]
        if dues:
            self.requeues.append(max((min(dues) - self.now).total_seconds(), 0.0) + 1.0)
        more = f" and {len(running) - 1} more" if len(running) > 1 else ""
        return f"{running[0].name}{more}"

    def _failed_ungracefully(self, attempt: int) -> bool:
        return any(f.attempt == attempt and f.reason != FailureReason.PREEMPTED for f in self.status.failures)

    def _adopts_claim(self) -> bool:
        """A claim under the name this owner creates, without owner, while deleteWithJob asks for one."""
        resource = self.verdict.resource
        claim = self.observed.claim
        return (
            resource is not None
            and claim is not None
            and self._creates_claim(resource)
            and kinds.training_spec(resource).checkpoint.storage.delete_with_job
            and claim.phase != observe.ClaimPhase.MISSING
            and not claim.being_deleted
            and claim.ownership == observe.Ownership.NONE
        )

    def _enter(self, phase: Phase, reason: str, message: str) -> None:
        self.status.phase = phase
        self.note = (reason, message)

    def _finish(self, phase: Phase, reason: str, message: str) -> None:
        self._enter(phase, reason, message)
        self.status.completion_time = _fmt(self.now)
        self.status.next_restart_time = None

    def _decide(
        self,
        *,
        apply_children: bool = False,
        ray_job: str | None = None,
        create_ray_job: bool = False,
        delete_owner: bool = False,
        restarted: bool = False,
        time_to_running: float | None = None,
    ) -> Transition:
        if self.status.phase in (Phase.RESTARTING, Phase.SUSPENDED):
            self.status.children = _with_ray_job(self.status.children, None)
        self._set_goodput()
        self._set_conditions()
        phase = self.status.phase
        assert phase is not None
        if phase != self.current.phase and phase in ANNOUNCED_PHASES:
            _, message = self._phase_note()
            kind = "Warning" if phase in (Phase.RESTARTING, Phase.FAILED) else "Normal"
            counts = f"{self.status.attempt}/{self.status.restarts}/{len(self.status.failures)}"
            self.events.append(Event(kind, phase.value, message, key=f"phase/{phase.value}/{counts}"))
        for condition in conditions.new_problems(self.current.conditions, self.status.conditions):
            when = f"{self.status.attempt}/{self.observed.generation}"
            key = f"problem/{condition.type}/{condition.reason}/{when}"
            self.events.append(Event("Warning", condition.reason, condition.message, key=key))
        adopt = apply_children and self._adopts_claim()
        if adopt:
            assert self.observed.claim is not None
            claim = self.observed.claim.name
            self.events.append(
                Event(
                    "Normal",
                    "ClaimAdopted",
                    f"Claim {claim} existed before this {self.verdict.kind.kind} and has no owner: it is "
                    "adopted (spec.checkpoint.storage.deleteWithJob is true), so it is deleted with the "
                    f"{self.verdict.kind.kind}.",
                    key=f"adopted/{claim}",
                )
            )
        return Transition(
            status=self.status,
            events=tuple(self.events),
            ray_job=ray_job,
            create_ray_job=create_ray_job,
            apply_children=apply_children,
            adopt_claim=adopt,
            delete_owner=delete_owner,
            requeue_after=min(self.requeues) if self.requeues and not delete_owner else None,
            restarted=restarted,
            time_to_running=time_to_running,
            failed=self.failed,
        )

    def _phase_note(self) -> tuple[str, str]:
        """Why the phase is what it is; carried over from the Running condition when nothing new happened."""
        if self.note is not None:
            return self.note
        for condition in self.current.conditions:
            if condition.type == conditions.RUNNING and self.current.phase == self.status.phase:
                return condition.reason, condition.message
        phase = self.status.phase
        assert phase is not None
        return phase.value, f"The phase is {phase.value}."

    def _set_goodput(self) -> None:
        resource = self.verdict.resource
        if not isinstance(self.status, trainingjob.TrainingJobOperatorStatus) or not isinstance(
            resource, trainingjob.TrainingJob
        ):
            return
        until = observe.parse_time(self.status.completion_time) or self.now
        measured = goodput.compute(
            resource.spec, self.observed.progress, start_time=self.status.start_time, until=until
        )
        if measured is not None:
            self.status.goodput = measured

    def _stall_finding(self) -> str | None:
        """The watchdog's finding for the current attempt: fired now, or recorded as its failure."""
        if self.stall is not None:
            return self.stall
        ended = self.status.failures[-1] if self.status.failures else None
        if (
            self.status.phase in (Phase.RESTARTING, Phase.FAILED)
            and ended is not None
            and ended.attempt == self.status.attempt
            and ended.reason == FailureReason.STALLED.value
        ):
            return ended.message
        return None

    def _set_conditions(self) -> None:
        phase = self.status.phase
        assert phase is not None
        resource = self.verdict.resource
        existing = bool(resource and not self._creates_claim(resource))
        errors = self.observed.create_errors
        if resource is not None and kinds.training_spec(resource).checkpoint.storage.s3 is not None:
            storage = conditions.object_storage(
                kinds.checkpoint_location(resource), self.observed.storage_check, attempt=self.status.attempt
            )
        else:
            storage = conditions.storage(
                self.observed.claim,
                existing=existing,
                create_error=errors.get("PersistentVolumeClaim"),
                kind=self.verdict.kind.kind,
            )
        desired = [
            *conditions.spec(self.verdict, self.observed.generation),
            storage,
            conditions.ray_cluster(
                phase,
                self.ray,
                [*(self.ray.problems if self.ray else ()), *self.observed.pod_problems],
                errors.get("RayJob"),
                self.status.children.ray_job if self.status.children else None,
            ),
            *conditions.phase(phase, *self._phase_note()),
            conditions.progressing(phase, self._stall_finding(), self._watchdog_note()),
        ]
        self.status.conditions = conditions.merge(
            self.current.conditions, desired, now=_fmt(self.now), generation=self.observed.generation
        )

    def _watchdog_note(self) -> str:
        resource = self.verdict.resource
        if not isinstance(resource, trainingjob.TrainingJob):
            return "The sweep's driver runs; the operator's stall watchdog watches TrainingJobs only."
        return (
            f"The attempt runs; the operator restarts it if status.progress is not updated for "
            f"{stall_after(resource.spec):g} s (stallTimeoutSeconds + 2 x reporting.everySeconds)."
        )


def _with_ray_job(children: Children | None, ray_job: str | None) -> Children | None:
    if children is None:
        return None
    return children.model_copy(update={"ray_job": ray_job})


def _ceil_second(value: datetime.datetime) -> datetime.datetime:
    if value.microsecond:
        return value.replace(microsecond=0) + datetime.timedelta(seconds=1)
    return value


def _fmt(value: datetime.datetime) -> str:
    return observe.format_time(value)
