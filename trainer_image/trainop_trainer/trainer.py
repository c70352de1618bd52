"""The built-in train loop: a ``Trainer`` with ``forward_backward_step``, ``train_step`` and ``train``.

Parallelism is applied in one place, ``parallelize.apply``: device, activation checkpointing,
``torch.compile``, then DDP or FSDP2 (``spec.parallelism``).

The hot loop stays lean: no host-device synchronisation per step (the loss is accumulated on the device
and read only at report time), non-blocking copies from pinned memory with the next batch prefetched on a
side stream, fused optimizers on CUDA, ``zero_grad(set_to_none=True)``, no gradient reduction for all but
the last micro-batch of a gradient-accumulation group (DDP's ``no_sync``, FSDP2's
``set_requires_gradient_sync``). ``ray.train.report`` runs only at report time (``spec.reporting``), never
per step: it is a barrier across ranks.

Evaluation (``spec.evaluation``): after the steps ``evaluation.Evaluator.due`` names (every rank the
same), the model is evaluated on the held-out split or the evaluation dataset, before that step's report
and checkpoint; the numbers go to ``status.evaluation``, the metrics and the tracking backends, and into
the checkpoint's manifest when that step is checkpointed. With ``checkpoint.keepBest`` every evaluated
step is also checkpointed, so the best model is always on the volume.

Checkpoints: the Trainer registers its parts with the runtime's ``Checkpointer`` — model, optimizer, LR
schedule, grad scaler, train state (the step), sampler position (epoch, micro-batches consumed in it, their
size); the runtime registered every rank's RNG state — and saves with asynchronous staging: before it next
changes the state (the forward pass when the model has buffers, else the optimizer step) it waits for the
copy to finish. Exact resume: the sampler restarts mid-epoch at the same index and every rank's RNG
continues; on deterministic kernels (CPU) a resumed run is bitwise equal to an uninterrupted one.

Benchmarks can ask, through the environment, for a profiler window or A/B blocks of runtime switches
(``bench_hooks``); the loop marks its parts (``trainop.data``, ``trainop.control``, ...) for that trace.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import default_collate

from trainop.api import resources, trainingjob
from trainop_trainer import (
    batch_finder,
    bench_hooks,
    data,
    evaluation,
    parallelize,
    schedule,
    stateful,
    storage,
    switches,
)
from trainop_trainer.bench_hooks import section
from trainop_trainer.runtime import Runtime
from trainop_trainer.step_schedule import Decision, Outcome
from trainop_trainer.workloads import Batch, Workload

log = logging.getLogger(__name__)


def build_optimizer(
    model: nn.Module, hp: trainingjob.Hyperparameters, device: torch.device, *, cpu_offload: bool = False
) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    # Fused kernels on GPUs; with FSDP's CPU offload the parameters the optimizer updates are on the CPU.
    fused = device.type == "cuda" and not cpu_offload
    if hp.optimizer == trainingjob.OptimizerName.SGD:
        return torch.optim.SGD(
            params,
            lr=hp.learning_rate,
            momentum=hp.momentum,
            weight_decay=hp.weight_decay,
            fused=fused or None,
        )
    cls = torch.optim.AdamW if hp.optimizer == trainingjob.OptimizerName.ADAMW else torch.optim.Adam
    return cls(params, lr=hp.learning_rate, weight_decay=hp.weight_decay, fused=fused or None)


def total_steps_for(hp: trainingjob.Hyperparameters, steps_per_epoch: int) -> int:
    """Optimizer steps of the whole run: maxSteps, or epochs x steps per epoch, whichever ends first."""
    limits = []
    if hp.max_steps is not None:
        limits.append(hp.max_steps)
    if hp.epochs is not None:
        limits.append(hp.epochs * steps_per_epoch)
    return min(limits)


class Trainer:
    def __init__(self, *, runtime: Runtime, workload: Workload) -> None:
        self.runtime = runtime
        self.workload = workload
        spec = runtime.spec
        self.spec = spec
        self.hp = spec.hyperparameters
        ctx = runtime.ctx
        self.ctx = ctx
        self.device = ctx.device
        self.accum = self.hp.gradient_accumulation_steps

        self.parallel = parallelize.apply(
            workload.model, blocks=workload.blocks, spec=spec, ctx=ctx, channels_last=workload.channels_last
        )
        self.model = self.parallel.model  # what the optimizer and the checkpoints see
        self.train_model = self.parallel.train_model
        self.optimizer = build_optimizer(
            self.model, self.hp, self.device, cpu_offload=self.parallel.cpu_offload
        )

        self.autocast_dtype = self.parallel.autocast_dtype
        self.scaler = torch.amp.GradScaler(
            self.device.type, enabled=spec.precision == trainingjob.Precision.FP16
        )

        self.sampler = data.ResumableDistributedSampler(
            workload.dataset, num_replicas=ctx.world_size, rank=ctx.rank, seed=self.hp.seed
        )
        self.batch_size = self._choose_batch_size()
        self.loader = data.make_loader(
            workload.dataset,
            self.sampler,
            batch_size=self.batch_size,
            num_workers=spec.workload.dataset.num_workers,
            pin_memory=self.device.type == "cuda",
        )
        self.batches = data.DeviceBatches(self.loader, device=self.device, to_device=workload.to_device)
        self.steps_per_epoch = data.batches_per_epoch(self.sampler, self.batch_size) // self.accum
        if self.steps_per_epoch < 1:
            num_samples = self.sampler.total_size
            raise ValueError(
                f"spec.workload.dataset: {num_samples} samples make no full optimizer step for "
                f"{ctx.world_size} workers x batchSizePerWorker {self.batch_size} x "
                f"gradientAccumulationSteps {self.accum}: use more samples or a smaller batch"
            )
        self.total_steps = total_steps_for(self.hp, self.steps_per_epoch)
        self.schedule = schedule.LearningRateSchedule(
            kind=self.hp.schedule.kind.value,
            total_steps=self.total_steps,
            warmup_steps=self.hp.schedule.warmup_steps,
            min_lr_ratio=self.hp.schedule.min_lr_ratio,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.schedule)

        self.train_state = stateful.TrainState()
        self.position = stateful.DataPosition(world_size=ctx.world_size, batch_size=self.batch_size)
        self.reports = runtime.reports
        self.reports.batch_size_per_worker = self.batch_size
        self._window = runtime.reports.window
        self.checkpointer = runtime.checkpointer
        for name, part in (
            (stateful.MODEL, stateful.ModelState(self.model)),
            (stateful.OPTIMIZER, stateful.OptimizerState(self.model, self.optimizer)),
            (stateful.LR_SCHEDULE, stateful.LRSchedulerState(self.scheduler)),
            (stateful.GRAD_SCALER, stateful.GradScalerState(self.scaler)),
            (stateful.TRAIN_STATE, self.train_state),
            (stateful.SAMPLER, self.position),
        ):
            self.checkpointer.register(name, part)
        self.evaluator: evaluation.Evaluator | None = None
        if spec.evaluation is not None and workload.eval_dataset is not None:
            self.evaluator = evaluation.Evaluator(
                evaluation=spec.evaluation,
                dataset=workload.eval_dataset,
                task=workload.task,
                ctx=ctx,
                batch_size=self.batch_size,
                to_device=workload.to_device,
                autocast=self._autocast,
                steps_per_epoch=self.steps_per_epoch,
                total_steps=self.total_steps,
            )
        # DDP's wrapper would synchronise buffers in an evaluation's forward pass: evaluate the bare module.
        # FSDP's sharded model is its own train model (its forward pass gathers the shards).
        self.eval_model = (
            self.model if self.parallel.strategy == trainingjob.ParallelismStrategy.DDP else self.train_model
        )
        self._evaluation: tuple[int, dict[str, float]] | None = None  # (step, metrics) of the last one
        # Buffers change in the forward pass (batch-norm statistics, DDP's buffer broadcast): a checkpoint
        # being staged must then be copied before the next forward, else before the next optimizer step.
        self._stage_before_forward = any(True for _ in self.model.buffers())
        # Off unless a benchmark's environment asks for a trace window or A/B blocks (bench_hooks).
        self.bench = bench_hooks.BenchHooks.from_env(
            ctx=ctx, samples_per_step=self.batch_size * self.accum * ctx.world_size
        )

    # The loop's counters live in the checkpointed parts.
    @property
    def step(self) -> int:
        return self.train_state.step

    @step.setter
    def step(self, value: int) -> None:
        self.train_state.step = value

    @property
    def epoch(self) -> int:
        return self.position.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.position.epoch = value

    @property
    def batches_in_epoch(self) -> int:
        return self.position.batches_in_epoch

    @batches_in_epoch.setter
    def batches_in_epoch(self, value: int) -> None:
        self.position.batches_in_epoch = value

    # -------------------------------------------------------------------------------------------- set-up
    def _choose_batch_size(self) -> int:
        """``batchSizePerWorker``, or with ``auto`` the finder's choice (``batch_finder``), which also sets
        the optimizer's base learning rate by the job's rule. Collective."""
        hp = self.hp
        if hp.batch_size_per_worker != trainingjob.AUTO:
            return int(hp.batch_size_per_worker)
        runtime, ctx = self.runtime, self.ctx
        path = runtime.paths.batch_size_file
        earlier = batch_finder.read_choice(path) if ctx.is_rank0 else None
        choice: batch_finder.Choice | None = runtime.control.broadcast_object(earlier)
        if choice is None:
            choice = self._find_batch_size()
            if ctx.is_rank0:
                storage.write_text(path, choice.to_json())
        if ctx.is_rank0:
            batch_finder.log_choice(choice, reused=earlier is not None)
        for group in self.optimizer.param_groups:
            group["lr"] = choice.learning_rate
        return choice.batch_size

    def _find_batch_size(self) -> batch_finder.Choice:
        search = self.hp.batch_size_search
        control = self.runtime.control
        gauge: batch_finder.CudaGauge | batch_finder.CpuGauge
        if self.device.type == "cuda":
            gauge = batch_finder.CudaGauge(self.device, headroom=search.memory_headroom)
        else:
            # The fitted size when memoryPerWorker is unset (the operator writes it into the config too).
            memory = batch_finder.quantity_bytes(resources.worker_memory(self.spec))
            gauge = batch_finder.CpuGauge(memory_bytes=memory, processes=1, headroom=search.memory_headroom)
        budget = int(-control.all_reduce_max(-float(gauge.budget)))  # the smallest budget of all ranks
        ddp = self.parallel.strategy == trainingjob.ParallelismStrategy.DDP
        restore = batch_finder.probe_state(model=self.model, optimizer=self.optimizer)
        self.train_model.train()

        def measure(batch_size: int) -> int | None:
            inputs, targets = self._probe_batch(batch_size)
            gauge.reset()
            peak: int | None
            try:
                # DDP: no collective inside a probe (no_sync); FSDP: its collectives are part of the step.
                self.forward_backward_step(inputs, targets, sync_grads=not ddp)
                self.optimizer.step()  # learning rate 0: allocates the optimizer state, changes nothing
                self.optimizer.zero_grad(set_to_none=True)
                peak = gauge.peak()
            except (RuntimeError, torch.OutOfMemoryError) as exc:
                if not batch_finder.is_out_of_memory(exc):
                    raise
                self.optimizer.zero_grad(set_to_none=True)
                peak = None
            del inputs, targets
            worst = control.all_reduce_max(float("inf") if peak is None else float(peak))
            return None if worst == float("inf") else int(worst)

        # A batch can only be as large as one rank's share of an epoch allows (one full optimizer step).
        largest = min(search.max_batch_size, self.sampler.num_samples // self.accum)
        try:
            batch_size, probes = batch_finder.search(
                measure, budget=budget, multiple_of=search.multiple_of, max_batch=largest, verify_next=ddp
            )
        finally:
            restore()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            if self.spec.compile:
                torch._dynamo.reset()  # probing compiled for several shapes; train with the chosen one
        return batch_finder.Choice(
            batch_size=batch_size,
            learning_rate=batch_finder.learning_rate_for(self.hp, batch_size),
            budget_bytes=budget,
            probes=tuple(probes),
        )

    def _probe_batch(self, batch_size: int) -> Batch:
        dataset = self.workload.dataset
        indices = [i % len(dataset) for i in range(batch_size)]  # type: ignore[arg-type]
        getitems = getattr(dataset, "__getitems__", None)
        cpu_batch = (
            getitems(indices) if callable(getitems) else default_collate([dataset[i] for i in indices])
        )
        return self.workload.to_device(cpu_batch, self.device)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    # ---------------------------------------------------------------------------------------- the steps
    def forward_backward_step(
        self, inputs: torch.Tensor, targets: torch.Tensor, *, sync_grads: bool
    ) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns the (detached) unscaled loss."""
        with self.parallel.gradient_sync(sync_grads):
            with self._autocast():
                outputs = self.train_model(inputs)
                loss = self.workload.loss_fn(outputs, targets)
            # Without accumulation no division: one kernel (and its backward) less per step, outside the
            # compiled graph when the model is compiled.
            scaled = loss if self.accum == 1 else loss / self.accum
            self.scaler.scale(scaled).backward()  # type: ignore[no-untyped-call]
        return loss.detach()

    def train_step(self, micro_batches: list[Batch]) -> None:
        """One optimizer step over ``gradient_accumulation_steps`` micro-batches."""
        beat = self.runtime.heartbeat
        if self._stage_before_forward:
            self.checkpointer.wait_for_staging()
        last = len(micro_batches) - 1
        beat.enter("forward_backward")  # DDP's gradient all-reduce runs inside the backward pass
        with section("forward_backward"):
            for index, (inputs, targets) in enumerate(micro_batches):
                loss = self.forward_backward_step(inputs, targets, sync_grads=index == last)
                self._window.add_loss(loss)
        beat.enter("optimizer")
        with section("optimizer"):
            if self.hp.gradient_clip_norm is not None:
                self.scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(
                    self.model.parameters(), self.hp.gradient_clip_norm, foreach=True
                )
            self.checkpointer.wait_for_staging()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            self.scheduler.step()

    # ------------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, *, wait: bool = False) -> None:
        self.checkpointer.save(
            step=self.step,
            epoch=self.epoch,
            progress={
                "batchesInEpoch": self.batches_in_epoch,
                "samplesInEpoch": self.batches_in_epoch * self.batch_size * self.ctx.world_size,
            },
            metrics={} if self.reports.last_loss is None else {"loss": self.reports.last_loss},
            wait=wait,
            async_staging=True,
            evaluation=self._evaluation[1] if self._evaluation and self._evaluation[0] == self.step else None,
        )

    def restore(self) -> None:
        self.checkpointer.load()

    # --------------------------------------------------------------------------------------- reporting
    def report(self, *, to_ray: bool, final: bool = False) -> None:
        with section("report"):
            self.reports.report(
                step=self.step,
                total_steps=self.total_steps,
                final=final,
                epoch=self.epoch,
                to_ray=to_ray,
                learning_rate=float(self.optimizer.param_groups[0]["lr"]),
                # The last evaluation, so that a sweep can optimise a validation metric (eval_accuracy, ...).
                ray_extra=None
                if self._evaluation is None
                else {f"eval_{k}": v for k, v in self._evaluation[1].items()},
            )

    # ------------------------------------------------------------------------------------------- loop
    def _epoch_batches(self) -> Iterator[list[Batch]]:
        """The remaining accumulation groups of the current epoch."""
        self.sampler.set_epoch(self.epoch)
        self.sampler.set_start_index(self.batches_in_epoch * self.batch_size)
        batches = iter(self.batches)
        while True:
            self.runtime.heartbeat.enter("data")
            with section("data"):
                group = list(itertools.islice(batches, self.accum))
            if len(group) < self.accum:
                return
            yield group

    def evaluate(self) -> dict[str, float]:
        """Collective: evaluate the model now and publish the numbers."""
        assert self.evaluator is not None
        self.checkpointer.wait_for_staging()  # a checkpoint being staged must see the state as it was
        metrics = self.evaluator.evaluate(self.eval_model)
        self.evaluator.last_step = self.step
        self._evaluation = (self.step, {k: v for k, v in metrics.items() if k != "samples"})
        self.runtime.publish_evaluation(step=self.step, epoch=self.epoch, metrics=metrics)
        return metrics

    def _after_step(self, decision: Decision) -> None:
        evaluated = False
        if self.evaluator is not None and not decision.stop and self.evaluator.due(self.step):
            self.evaluate()
            evaluated = True
        if decision.report:
            self.report(to_ray=decision.ray_report, final=decision.stop)
        checkpoint = decision.checkpoint or (evaluated and self.spec.checkpoint.keep_best is not None)
        if checkpoint:
            self.save_checkpoint(wait=decision.stop)
        self.runtime.injector.after_step(self.step, checkpointed_now=checkpoint)
        self.runtime.profiler.after_step(self.step, decision)

    def train(self) -> Outcome:
        collector = Collector(switches.gc_mode())
        try:
            return self._train(collector)
        finally:
            collector.stop()

    def _train(self, collector: Collector) -> Outcome:
        self.runtime.heartbeat.enter("checkpoint")  # loading
        self.restore()
        runtime = self.runtime
        if self.ctx.is_rank0:
            log.info(
                "training %s: step %d of %d, epoch %d, %d steps per epoch, %d workers",
                self.workload.name,
                self.step,
                self.total_steps,
                self.epoch,
                self.steps_per_epoch,
                self.ctx.world_size,
            )
        self.train_model.train()
        runtime.schedule.reset_clocks()
        self.reports.start(self.step)
        samples_per_step = self.accum * self.batch_size
        outcome = Outcome.COMPLETED
        collector.start()
        first_step = True
        while self.step < self.total_steps and outcome == Outcome.COMPLETED:
            for group in self._epoch_batches():
                self.train_step(group)
                if first_step:  # check_compiled owns the spec.compile condition
                    parallelize.check_compiled(self.spec, self.workload.name, rank0=self.ctx.is_rank0)
                    first_step = False
                self.step += 1
                collector.after_step(self.step)
                runtime.heartbeat.beat(self.step)
                self.batches_in_epoch += self.accum
                with section("metrics"):
                    self.reports.step_finished(self.step, samples=samples_per_step)
                runtime.heartbeat.enter("control")
                with section("control"):
                    decision = runtime.schedule.poll(self.step)
                runtime.heartbeat.enter("report/evaluate/checkpoint")
                self._after_step(decision)
                self.bench.after_step(self.step)
                if decision.stop:
                    outcome = decision.outcome
                    break
                if self.step >= self.total_steps:
                    break
            else:
                self.epoch += 1
                self.batches_in_epoch = 0
        return self._finish(outcome)

    def _finish(self, outcome: Outcome) -> Outcome:
        self.bench.close()
        if outcome == Outcome.COMPLETED:
            if self.reports.needs_final_report(self.step):
                self.report(to_ray=True)
            if self.checkpointer.last_step != self.step:
                self.save_checkpoint(wait=True)
        self.runtime.finish(outcome, self.step)
        if self.ctx.is_rank0:
            log.info("training %s at step %d of %d", outcome.value, self.step, self.total_steps)
        return outcome


#: ``gc=synced``: every rank collects Python's young generations at the steps divisible by this.
GC_EVERY_STEPS = 50


class Collector:
    """Python's garbage collection during the training loop (the ``gc`` switch). ``auto`` leaves it alone;
    ``synced`` freezes what exists when training starts, turns automatic collection off and collects the
    young generations on every rank at the same steps, then restores the collector when training ends."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self._was_enabled: bool | None = None

    def start(self) -> None:
        if self.mode != "synced" or self._was_enabled is not None:
            return
        self._was_enabled = gc.isenabled()
        gc.collect()
        gc.freeze()
        gc.disable()
        log.info(
            "gc=synced: automatic collection off, a young-generation collection every %d steps",
            GC_EVERY_STEPS,
        )

    def after_step(self, step: int) -> None:
        if self._was_enabled is not None and step % GC_EVERY_STEPS == 0:
            gc.collect(1)

    def stop(self) -> None:
        if self._was_enabled is None:
            return
        gc.unfreeze()
        if self._was_enabled:
            gc.enable()
        self._was_enabled = None
