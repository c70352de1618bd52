"""User workloads: ``spec.workload.entrypoint: "pkg.module:function"`` and the context handed to it.

The function is called once per worker as ``function(ctx)`` with a ``Context`` that offers the same services
as the built-in loop: the free-form ``spec.workload.config`` (``ctx.config``), rank / world size / device,
``prepare_model`` (device + DDP), checkpoint ``save_checkpoint`` / ``load_checkpoint`` (the built-in loop's
committed, validated, pruned checkpoints; rank 0's state is saved), and ``step_done`` for metrics,
progress reporting and the decisions every rank must take together (``checkpoint_due``, ``should_stop``).
A minimal loop::

    def train(ctx):
        model = ctx.prepare_model(MyNet())
        opt = torch.optim.SGD(model.parameters(), lr=ctx.hyperparameters.learning_rate)
        start = 0
        if (restored := ctx.load_checkpoint()) is not None:
            model.module.load_state_dict(restored.state["model"]); opt.load_state_dict(restored.state["opt"])
            start = restored.step
        for step in range(start + 1, ctx.total_steps + 1):
            loss = ...; loss.backward(); opt.step(); opt.zero_grad()
            ctx.step_done(step, loss=loss.detach(), samples=batch_size)
            if ctx.checkpoint_due:
                ctx.save_checkpoint({"model": model.module.state_dict(), "opt": opt.state_dict()}, step=step)
            if ctx.should_stop:
                return

``step_done``, ``save_checkpoint`` and ``load_checkpoint`` are collective: every rank calls them at the
same steps. Reports to Ray Train happen inside ``step_done`` at ``spec.reporting`` intervals only.

Evaluation (``spec.evaluation``): register a hook with ``ctx.on_evaluate(fn)``; ``fn()`` runs on every
rank inside ``step_done`` at the evaluation steps (``everySteps``; ``everyEpochs`` counts the epochs you pass
to ``step_done(epoch=...)``) and after the last step, returns ``{"loss": ..., "accuracy": ...}`` (the same
keys on every rank); the numbers are averaged over ranks and published like the built-in loop's
(``status.evaluation``, metrics, MLflow/TensorBoard). With ``checkpoint.keepBest`` the evaluated step sets
``checkpoint_due``, and the next ``save_checkpoint`` of that step carries the evaluation, which ranks it.

A bad entrypoint fails before any worker starts, with one sentence naming ``spec.workload.entrypoint``.
"""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainop.api import trainingjob
from trainop_trainer import evaluation, parallelize, stateful, step_schedule
from trainop_trainer.runtime import Runtime
from trainop_trainer.step_schedule import Outcome

UserFunction = Callable[["Context"], Any]


class EntrypointError(ValueError):
    """``spec.workload.entrypoint`` does not name a callable."""


def resolve(entrypoint: str, *, field_name: str = "spec.workload.entrypoint") -> UserFunction:
    """Import ``pkg.module`` and return its ``function``; ``EntrypointError`` (one sentence, naming
    ``field_name``) otherwise."""
    field = f"{field_name} {entrypoint!r}"
    module_name, sep, attr = entrypoint.partition(":")
    if not sep or not module_name or not attr:
        raise EntrypointError(f"{field} must have the form 'pkg.module:function'; add the ':function' part")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise EntrypointError(
            f"{field}: module {module_name!r} cannot be imported ({exc}); install the package that provides "
            "it in the trainer image (or put it on PYTHONPATH), or correct the module path"
        ) from None
    except Exception as exc:
        raise EntrypointError(
            f"{field}: importing module {module_name!r} raised {type(exc).__name__}: {exc}; fix that error "
            "in your module"
        ) from None
    if not hasattr(module, attr):
        raise EntrypointError(
            f"{field}: module {module_name!r} has no attribute {attr!r}; name a function defined in that "
            "module, as 'pkg.module:function'"
        )
    function = getattr(module, attr)
    if not callable(function):
        raise EntrypointError(
            f"{field}: {module_name}.{attr} is a {type(function).__name__}, not a callable; point it at a "
            "function that takes the trainop context"
        )
    result: UserFunction = function
    return result


@dataclasses.dataclass(frozen=True)
class Restored:
    step: int
    epoch: int
    state: dict[str, Any]


class Context:
    """What a user function gets. Attributes are read-only facts; methods are the trainer's services."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        spec = runtime.spec
        self.spec: trainingjob.TrainingJobSpec = spec
        self.config: dict[str, Any] = dict(spec.workload.config)
        self.hyperparameters: trainingjob.Hyperparameters = spec.hyperparameters
        self.rank = runtime.ctx.rank
        self.world_size = runtime.ctx.world_size
        self.local_rank = runtime.ctx.local_rank
        self.device = runtime.ctx.device
        self.is_rank0 = runtime.ctx.is_rank0
        # spec.data's directory (/data in a cluster, already filled when the source is a bucket), or None.
        self.data_dir: pathlib.Path | None = runtime.data_dir
        self.total_steps: int | None = spec.hyperparameters.max_steps
        self.checkpoint_due = False
        self.should_stop = False
        self._decision = step_schedule.NOTHING
        self._reports = runtime.reports
        self._user_state = stateful.UserState(is_rank0=runtime.ctx.is_rank0)
        runtime.checkpointer.register(stateful.USER, self._user_state)
        self._epoch = 0
        self._evaluate: Callable[[], Mapping[str, float]] | None = None
        self._evaluation: tuple[int, dict[str, float]] | None = None  # (step, metrics) of the last one
        self._evaluated_epoch: int | None = None
        runtime.schedule.reset_clocks()
        self._reports.start(0)

    def on_evaluate(self, evaluate: Callable[[], Mapping[str, float]]) -> None:
        """Register the evaluation hook: called with no arguments on every rank at the evaluation steps
        (``spec.evaluation``), it returns the metrics of the model as it is (loss, accuracy, ...)."""
        self._evaluate = evaluate

    def _evaluation_due(self, step: int) -> bool:
        evaluation = self.spec.evaluation
        if evaluation is None or self._evaluate is None:
            return False
        if self._evaluation is not None and self._evaluation[0] == step:
            return False
        if evaluation.every_steps is not None and step % evaluation.every_steps == 0:
            return True
        if (
            evaluation.every_epochs is not None
            and self._epoch != self._evaluated_epoch
            and self._epoch > 0
            and self._epoch % evaluation.every_epochs == 0
        ):
            return True
        return self.total_steps is not None and step >= self.total_steps

    def evaluate_now(self, step: int) -> dict[str, float]:
        """Collective: run the evaluation hook, average its numbers over ranks and publish them."""
        assert self._evaluate is not None
        local = self._evaluate()
        metrics = evaluation.mean_over_ranks(self._runtime.control, sorted(local.items()))
        self._evaluation = (step, metrics)
        self._evaluated_epoch = self._epoch
        self._runtime.publish_evaluation(step=step, epoch=self._epoch, metrics=metrics)
        return metrics

    def prepare_model(self, model: nn.Module, *, channels_last: bool = False) -> nn.Module:
        """Move ``model`` to this worker's device and wrap it in DDP (``.module`` is your model)."""
        model.to(self.device)
        if channels_last:
            model.to(memory_format=torch.channels_last)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return parallelize.time_ddp_start_only(DistributedDataParallel(model, device_ids=device_ids))

    def load_checkpoint(self) -> Restored | None:
        """The newest valid checkpoint's state (collective), or None on a fresh start."""
        saved = self._runtime.checkpointer.load()
        if saved is None:
            return None
        state = self._user_state.restored or {}
        self._user_state.restored = None
        self._epoch = saved.manifest.epoch
        self._reports.start(saved.step)
        return Restored(step=saved.step, epoch=saved.manifest.epoch, state=state)

    def save_checkpoint(self, state: Mapping[str, Any], *, step: int, epoch: int | None = None) -> None:
        """Save ``state`` (tensors and plain data) as the checkpoint of ``step`` (collective; rank 0's
        ``state`` is what ``load_checkpoint`` returns). ``state`` is copied before this returns, so training
        may change it at once; the write runs in the background, except when training is stopping."""
        self._user_state.pending = state
        try:
            self._runtime.checkpointer.save(
                step=step,
                epoch=self._epoch if epoch is None else epoch,
                progress={},
                metrics={},
                wait=self.should_stop,
                evaluation=self._evaluation[1] if self._evaluation and self._evaluation[0] == step else None,
            )
        finally:
            self._user_state.pending = None
        self.checkpoint_due = False
        self._runtime.injector.after_step(step, checkpointed_now=True)

    def step_done(
        self,
        step: int,
        *,
        loss: torch.Tensor | float | None = None,
        samples: int | None = None,
        epoch: int | None = None,
        metrics: Mapping[str, float] | None = None,
    ) -> None:
        """Call after every optimizer step on every rank. Updates metrics, reports at the configured interval,
        and sets ``checkpoint_due`` / ``should_stop`` for this step (the same on every rank)."""
        runtime = self._runtime
        runtime.heartbeat.beat(step)
        if epoch is not None:
            self._epoch = epoch
        if loss is not None:
            self._reports.window.add_loss(loss)
        self._reports.step_finished(step, samples=samples)
        decision = runtime.schedule.poll(step)
        self._decision = decision
        evaluated = not decision.stop and self._evaluation_due(step)
        if evaluated:
            self.evaluate_now(step)
        if decision.report:
            self._report(step, metrics, to_ray=decision.ray_report)
        self.checkpoint_due = decision.checkpoint or (
            evaluated and self.spec.checkpoint.keep_best is not None
        )
        self.should_stop = decision.stop
        runtime.injector.after_step(step, checkpointed_now=False)
        runtime.profiler.after_step(step, decision)

    def _report(self, step: int, metrics: Mapping[str, float] | None, *, to_ray: bool) -> None:
        self._reports.report(
            step=step, total_steps=self.total_steps, epoch=self._epoch, to_ray=to_ray, extra=metrics
        )

    def outcome(self) -> Outcome:
        return self._decision.outcome

    @property
    def last_step(self) -> int:
        return self._reports.last_step

    @property
    def unreported_steps(self) -> bool:
        return self._reports.needs_final_report(self.last_step)

    def report_now(self) -> None:
        """Report progress immediately (collective); the loop's final report uses it."""
        self._report(self.last_step, None, to_ray=True)


def run(runtime: Runtime) -> Outcome:
    """Resolve and call the user's function with a fresh ``Context``."""
    entrypoint = runtime.spec.workload.entrypoint
    assert entrypoint is not None
    function = resolve(entrypoint)
    ctx = Context(runtime)
    function(ctx)
    outcome = ctx.outcome()
    if outcome == Outcome.COMPLETED and ctx.unreported_steps:
        ctx.report_now()
    runtime.finish(outcome, ctx.last_step)
    return outcome
