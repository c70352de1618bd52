"""The Checkpointer: a registry of stateful parts, saved and restored with torch.distributed.checkpoint.

A training loop registers what a checkpoint is made of (``register("model", stateful.ModelState(model))``,
... — see ``stateful``) and calls two collective methods, on every rank at the same step:

- ``save(step=..., wait=...)``: every rank writes its own share in parallel (DDP's replicated tensors are
  written once, spread over the ranks; FSDP2's shards by their owners) through ``dcp.async_save`` on a gloo
  group of its own. The training thread only stages the state off the device: into pinned host memory on
  a side stream with ``async_staging`` on CUDA (the loop calls ``wait_for_staging`` before it next changes
  the state: before the forward pass when the model has buffers, else before the optimizer step), a plain
  copy otherwise. Serialising and writing run on a background thread; rank 0 writes DCP's ``.metadata``
  last, which commits the checkpoint (``checkpoint_store``), then applies retention and publishes the
  checkpoint to status and metrics. One save is in flight at most: a save requested while the previous one
  is still being written waits for it. ``wait=True`` (stopping, preemption, the end) returns once
  committed.
- ``load()``: rank 0 picks the newest valid checkpoint (``checkpoint_store.newest_valid``: broken ones are
  moved aside), every rank loads its share of it — resharding to this world size, whatever it was saved
  with — and if any rank fails to read it, every rank falls back to the previous one. Format-1 checkpoints
  (before DCP) load through ``checkpoint_legacy``.

Retention (rank 0, after each commit): the ``keepLast`` newest committed checkpoints stay, and with
``checkpoint.keepBest`` also the best one by its evaluation metric (``save(evaluation=...)`` puts the
evaluation into the manifest): it is never pruned, whatever its age, until a better one is committed. The
best is found again from the manifests on the volume when a worker group starts, so restarts and new
attempts keep it. Retention is decided here, not in the store (the store's ``prune`` only spares what it is
told to keep), so another storage backend keeps the same rule.

How it relates to Ray Train: these checkpoints are never passed to ``ray.train.report(checkpoint=...)``:
that call is a barrier that copies the directory synchronously, and Ray's registry refuses to restore once a
directory it knows is deleted, which keep-last pruning and quarantine do. The same ``load`` serves an
in-attempt restart of the worker group and a new attempt (same run name and storage path).

It must not decide when to save (``step_schedule``) nor know what a part holds (``stateful``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import inspect
import io
import logging
import pathlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save

from trainop.api import experiment
from trainop_trainer import checkpoint_legacy, distributed, run_record, stateful
from trainop_trainer.checkpoint_store import Checkpoint, CheckpointError, CheckpointStore, Manifest

log = logging.getLogger(__name__)

try:  # PyTorch >= 2.9: staging with pinned memory on a side stream
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
except ImportError:  # pragma: no cover - older PyTorch stages with a blocking copy inside async_save
    DefaultStager = None  # type: ignore[assignment,misc]
    StagingOptions = None  # type: ignore[assignment,misc]

# dcp.async_save(async_stager=...) came with DefaultStager; without it, async_save stages by a plain copy.
_TAKES_STAGER = DefaultStager is not None and "async_stager" in inspect.signature(dcp_async_save).parameters

OnCommitted = Callable[[Checkpoint, float], None]
# DCP reports a failure on any rank as CheckpointException, a BaseException (so that it is not swallowed).
READ_WRITE_ERRORS = (Exception, CheckpointException)


def _per_rank_key(name: str, rank: int) -> str:
    return f"{name}_rank{rank}"


@dataclasses.dataclass
class _InFlight:
    step: int
    started: float
    stall: float  # seconds the training thread spent so far
    staging: concurrent.futures.Future[Any] | None
    committed: concurrent.futures.Future[Checkpoint]


class Checkpointer:
    def __init__(
        self,
        *,
        root: pathlib.Path,
        ctx: distributed.WorkerContext,
        keep_last: int,
        record: run_record.RunRecord,
        on_committed: OnCommitted | None = None,
        keep_best: experiment.KeepBest | None = None,
    ) -> None:
        self.store = CheckpointStore(root)
        self._ctx = ctx
        self._keep_last = keep_last
        self._keep_best = keep_best
        self.best: Checkpoint | None = None  # rank 0: the best committed checkpoint by keepBest
        self._record = record
        self._on_committed = on_committed
        self._parts: dict[str, stateful.Part] = {}
        # DCP's collectives run on the background thread: a group of their own never interleaves with the
        # control channel's or the gradients'. async_save needs a CPU backend in any case.
        self._group: Any = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self._committer = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="ckpt-commit"
        )
        self._stagers: dict[bool, Any] = {}
        self._in_flight: _InFlight | None = None
        self.last_step: int | None = None  # the newest checkpoint this worker saved or resumed from
        self.last_committed: Checkpoint | None = None
        if ctx.is_rank0:
            self.store.remove_stale()
            self.best = self._find_best()

    # --------------------------------------------------------------------------------------- retention
    def _value(self, saved: Checkpoint) -> float | None:
        if self._keep_best is None:
            return None
        return saved.manifest.evaluation.get(self._keep_best.metric)

    def _better(self, candidate: Checkpoint, than: Checkpoint | None) -> bool:
        value = self._value(candidate)
        if value is None or value != value:  # no such metric at this step, or NaN
            return False
        if than is None:
            return True
        current = self._value(than)
        if current is None:
            return True
        assert self._keep_best is not None
        return value < current if self._keep_best.mode == experiment.BestMode.MIN else value > current

    def _find_best(self) -> Checkpoint | None:
        """The best committed checkpoint on the volume (a restart or a new attempt finds it again)."""
        if self._keep_best is None:
            return None
        best: Checkpoint | None = None
        for _, path in reversed(self.store.step_dirs()):  # oldest first: a tie keeps the older one
            if not self.store.is_committed(path):
                continue
            try:
                candidate = Checkpoint(path=path, manifest=self.store.validate(path))
            except CheckpointError:
                continue
            if self._better(candidate, best):
                best = candidate
        return best

    def best_status(self) -> experiment.BestCheckpoint | None:
        """``status.checkpoint.best`` (rank 0; None without keepBest or before an evaluated checkpoint)."""
        if self._keep_best is None or self.best is None:
            return None
        value = self._value(self.best)
        assert value is not None
        return experiment.BestCheckpoint(
            step=self.best.step, metric=self._keep_best.metric, value=value, path=str(self.best.path)
        )

    def _retain(self, saved: Checkpoint) -> None:
        """Rank 0 after a commit: a new best replaces the old, then everything beyond keepLast but the best
        is deleted."""
        if self._better(saved, self.best):
            if self.best is not None:
                log.info(
                    "checkpoint step %d is the new best by %s (%s -> %s)",
                    saved.step,
                    self._keep_best.metric if self._keep_best else "?",
                    self._value(self.best),
                    self._value(saved),
                )
            self.best = saved
        keep = () if self.best is None else (self.best.path,)
        for removed in self.store.prune(keep_last=self._keep_last, keep=keep):
            log.info("pruned %s (keepLast=%d)", removed.name, self._keep_last)

    def register(self, name: str, part: stateful.Part) -> None:
        if name in self._parts:
            raise ValueError(f"checkpoint part {name!r} is registered twice")
        self._parts[name] = part

    @property
    def parts(self) -> Mapping[str, stateful.Part]:
        return self._parts

    # ------------------------------------------------------------------------------------------ saving
    def _state_to_save(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for name, part in self._parts.items():
            key = _per_rank_key(name, self._ctx.rank) if getattr(part, "per_rank", False) else name
            state[key] = part
        return state

    def _stager(self, async_staging: bool) -> Any:
        if not _TAKES_STAGER:
            return None
        on_cuda = self._ctx.device.type == "cuda"
        key = on_cuda and async_staging
        if key in self._stagers and not _reusable(self._stagers[key]):
            self._stagers.pop(key).close()
        if key not in self._stagers:
            if on_cuda:
                options = StagingOptions(
                    use_pinned_memory=True,
                    use_shared_memory=False,
                    use_async_staging=async_staging,
                    use_non_blocking_copy=True,
                )
            else:
                options = StagingOptions(
                    use_pinned_memory=False,
                    use_shared_memory=False,
                    use_async_staging=False,
                    use_non_blocking_copy=False,
                )
            # Created lazily, on the training thread after training started: DefaultStager's side stream
            # must be created after the default stream is in use.
            self._stagers[key] = DefaultStager(options)
        stager = self._stagers[key]
        if key:
            # The staging stream copies while the training stream runs on: it must first see this step's
            # optimizer update, which may still be queued on the training stream.
            # (DefaultStager keeps its stream private; without it, wait for the training stream instead.)
            training_stream = torch.cuda.current_stream(self._ctx.device)
            staging_stream = getattr(stager, "_staging_stream", None)
            try:
                staging_stream.wait_stream(training_stream)  # type: ignore[union-attr]
            except (AttributeError, TypeError):
                training_stream.synchronize()
        return stager

    def save(
        self,
        *,
        step: int,
        epoch: int,
        progress: Mapping[str, int],
        metrics: Mapping[str, float],
        wait: bool,
        async_staging: bool = False,
        evaluation: Mapping[str, float] | None = None,
    ) -> None:
        """Collective. Stage every part's state and write it in the background (see the module docstring).
        With ``async_staging`` the caller must call ``wait_for_staging`` before it changes any part."""
        self._settle_previous()
        started = time.perf_counter()
        manifest = Manifest(
            step=step,
            epoch=epoch,
            time=run_record.utc_now(),
            world_size=self._ctx.world_size,
            parts=tuple(sorted(self._parts)),
            progress=dict(progress),
            metrics={k: float(v) for k, v in metrics.items()},
            evaluation={k: float(v) for k, v in (evaluation or {}).items()},
        )
        path = self.store.step_path(step)
        if self._ctx.is_rank0:
            self.store.prepare(manifest)  # before any rank can write: DCP plans through rank 0 first
        options: dict[str, Any] = {"process_group": self._group}
        if _TAKES_STAGER:
            options["async_stager"] = self._stager(async_staging)
        if self._group is None:
            options["no_dist"] = True
        response: Any = dcp_async_save(self._state_to_save(), checkpoint_id=str(path), **options)
        staging: concurrent.futures.Future[Any] | None = getattr(response, "staging_completion", None)
        upload: concurrent.futures.Future[Any] = getattr(response, "upload_completion", response)
        committed = self._committer.submit(self._commit, upload, manifest, path, started)
        self._in_flight = _InFlight(
            step=step,
            started=started,
            stall=time.perf_counter() - started,
            staging=staging,
            committed=committed,
        )
        self.last_step = step
        if staging is None:
            self._log_stall()
        if wait:
            self.wait()

    def wait_for_staging(self) -> None:
        """Block until the state being saved is copied off the device (a no-op when nothing is staging)."""
        flight = self._in_flight
        if flight is None or flight.staging is None:
            return
        waited = time.perf_counter()
        flight.staging.result()
        flight.stall += time.perf_counter() - waited
        flight.staging = None
        self._log_stall()

    def _log_stall(self) -> None:
        flight = self._in_flight
        if flight is not None and self._ctx.is_rank0:
            log.info("checkpoint step %d: %.3fs on the training thread", flight.step, flight.stall)

    def _commit(
        self, upload: concurrent.futures.Future[Any], manifest: Manifest, path: pathlib.Path, started: float
    ) -> Checkpoint:
        upload.result()  # every rank's data written, rank 0 wrote .metadata: committed
        seconds = time.perf_counter() - started
        saved = Checkpoint(path=path, manifest=manifest)
        self.last_committed = saved
        if self._ctx.is_rank0:
            self._retain(saved)
            log.info("checkpoint step %d committed to %s in %.2fs", manifest.step, path, seconds)
        if self._on_committed is not None:
            try:
                self._on_committed(saved, seconds)
            except Exception:
                log.exception("checkpoint callback failed (the checkpoint itself is fine)")
        return saved

    def _settle_previous(self) -> None:
        """Before a new save: the previous one must be done; its failure is logged, training goes on."""
        try:
            self.wait()
        except READ_WRITE_ERRORS:
            log.exception("a background checkpoint write failed; training continues")

    def wait(self) -> Checkpoint | None:
        """Block until the save in flight (if any) is committed; re-raise its error."""
        flight = self._in_flight
        if flight is None:
            return self.last_committed
        try:
            self.wait_for_staging()
            return flight.committed.result()
        finally:
            self._in_flight = None

    # ----------------------------------------------------------------------------------------- loading
    def _broadcast(self, obj: Any) -> Any:
        if self._group is None or self._ctx.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]

    def _all_ok(self, ok: bool) -> bool:
        if self._group is None or self._ctx.world_size == 1:
            return ok
        flag = torch.tensor([0 if ok else 1], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        return int(flag.item()) == 0

    def load(self) -> Checkpoint | None:
        """Collective: restore every registered part from the newest checkpoint that loads on every rank."""
        failed: list[str] = []
        while True:
            chosen: tuple[str, str] | None = None
            if self._ctx.is_rank0:
                found = self.store.newest_valid()
                chosen = None if found is None else (found.path.name, found.manifest.to_json())
            chosen = self._broadcast(chosen)
            if chosen is None:
                if failed:
                    raise CheckpointError(
                        f"checkpoint(s) {', '.join(failed)} failed to load and no older checkpoint exists; "
                        "they were moved aside, so the next start of the worker group begins at step 0"
                    )
                log.info("no checkpoint under %s: starting from step 0", self.store.root)
                return None
            path = self.store.root / chosen[0]
            manifest = Manifest.from_json(chosen[1])
            error: str | None = None
            try:
                self._load_parts(path, manifest)
            except READ_WRITE_ERRORS as exc:  # a read error on this rank: every rank falls back together
                error = _first_line(exc)
            if self._all_ok(error is None):
                break
            log.warning(
                "checkpoint %s failed to load (%s); falling back to the previous checkpoint",
                path,
                error or "on another rank",
            )
            failed.append(path.name)
            if self._ctx.is_rank0:
                self.store.quarantine(path)
        saved = Checkpoint(path=path, manifest=manifest)
        self.last_step = manifest.step
        self.last_committed = saved
        if self._ctx.is_rank0:
            log.info("resuming from %s (step %d, epoch %d)", path, manifest.step, manifest.epoch)
            self._record.resumed(step=manifest.step, path=str(path))
        return saved

    def _load_parts(self, path: pathlib.Path, manifest: Manifest) -> None:
        rank = self._ctx.rank
        if manifest.legacy:
            checkpoint_legacy.load_into(self._parts, path, manifest, rank=rank)
            return
        templated: dict[str, Any] = {}
        template_free: dict[str, stateful.Part] = {}
        for name, part in self._parts.items():
            if name not in manifest.parts:
                log.warning("checkpoint %s holds no %r; it keeps its fresh state", path.name, name)
            elif getattr(part, "template_free", False):
                template_free[name] = part
            elif not getattr(part, "per_rank", False):
                templated[name] = part
            elif rank < manifest.world_size:
                templated[_per_rank_key(name, rank)] = part
            else:
                log.warning(
                    "checkpoint %s was saved by %d ranks: rank %d keeps its fresh %r state",
                    path.name,
                    manifest.world_size,
                    rank,
                    name,
                )
        if templated:
            dcp_load(
                templated, checkpoint_id=str(path), process_group=self._group, no_dist=self._group is None
            )
        if template_free:
            from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

            loaded = _load_state_dict_from_keys(
                keys=set(template_free), checkpoint_id=str(path), process_group=self._group
            )
            for name, part in template_free.items():
                part.load_state_dict(loaded.get(name) or {"tree": _empty_tree()})

    def close(self) -> None:
        """Wait for the save in flight (re-raising its error) and release the background threads."""
        try:
            self.wait()
        finally:
            self._committer.shutdown(wait=True)
            for stager in self._stagers.values():
                stager.close()


def _reusable(stager: Any) -> bool:
    """Whether a DefaultStager can stage another save. PyTorch 2.11's closes its StateDictStager at the end
    of every stage (pytorch/pytorch#183413, fixed in 2.12 by #183424), which empties its copy table: the next
    save then fails with ``KeyError: <class 'type'>`` (seen on the FSDP benchmark, torch 2.11, H200). Such a
    stager is replaced for each save; its pinned staging buffers are then not reused across saves."""
    inner = getattr(stager, "_state_dict_stager", None)
    table = getattr(inner, "_deepcopy_dispatch", None)
    return table is None or bool(table)


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    # CheckpointException carries every rank's traceback: its last line names the error.
    return f"{type(exc).__name__}: {lines[-1].strip() if lines else ''}"


def _empty_tree() -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save({}, buffer)
    return buffer
