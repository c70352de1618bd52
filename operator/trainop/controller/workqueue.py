"""A keyed work queue with client-go's semantics, for the reconcile workers. In memory, by design.

- A key is queued at most once, however many events name it (bursts of pod or RayJob events collapse).
- A key is never processed by two workers at once: a key added while it is being processed is marked
  dirty and queued again when its worker calls :meth:`done`.
- :meth:`add_after` schedules a key (restart backoff, deadlines, TTLs); the earliest schedule wins.
- A key added with ``new=True`` (an owner no reconcile has seen yet) is served before the others, and
  while a new key is being processed and none is left to serve, the others are held back -- for at most
  ``hold`` seconds in a row, then served in turn until no new key is in flight. A burst of new owners is
  then not slowed by the status updates of the ones before it (those updates, and the writes they cause,
  compete with the new owners' child creation for the apiserver). No key waits for new ones without
  bound: one that has been ready for ``max_wait`` seconds is served before any new key. A key re-queued
  by :meth:`done` or :meth:`add_after` is not new; the engine marks new only owners without a recorded
  phase, which one reconcile ends. Without ``hold`` and ``max_wait`` new keys are merely served first.
- :meth:`retry_delay` gives per-key exponential backoff after errors; :meth:`forget` resets it.

Nothing here needs to survive the process: every deadline it holds is derived from owner status (for
instance ``status.nextRestartTime``), and on start the watch's initial listing queues every owner again.
This module must not know what a key means.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class ShutDown(Exception):
    """Raised by :meth:`WorkQueue.get` once the queue is shut down."""


class WorkQueue(Generic[K]):
    def __init__(
        self,
        *,
        base_delay: float = 0.5,
        max_delay: float = 60.0,
        hold: float = 0.0,
        max_wait: float | None = None,
    ) -> None:
        self._ready: collections.deque[K] = collections.deque()
        self._ready_at: dict[K, float] = {}  # when each key of _ready was queued (monotonic)
        self._max_wait = max_wait
        self._new: collections.deque[K] = collections.deque()  # served before _ready
        self._new_processing: set[K] = set()
        self._hold = hold
        self._holding_since: float | None = None  # when the others were first held back, this round
        self._queued: set[K] = set()
        self._processing: set[K] = set()
        self._dirty: set[K] = set()
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._failures: collections.Counter[K] = collections.Counter()
        self._wakeup = asyncio.Event()
        self._shut_down = False
        self._base_delay = base_delay
        self._max_delay = max_delay

    def __len__(self) -> int:
        return len(self._ready) + len(self._new)

    def add(self, key: K, *, new: bool = False) -> None:
        if self._shut_down:
            return
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        if new:
            self._new.append(key)
        else:
            self._ready.append(key)
            self._ready_at[key] = time.monotonic()
        self._wakeup.set()

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        scheduled = self._timers.get(key)
        if scheduled is not None:
            if scheduled[0] <= due:
                return
            scheduled[1].cancel()
        self._timers[key] = (due, loop.call_at(due, self._fire, key))

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> K:
        while True:
            if self._shut_down:
                raise ShutDown
            if self._new and not self._overdue():
                key = self._new.popleft()
                self._new_processing.add(key)
                break
            wait: float | None = None
            if self._ready:
                wait = None if self._new else self._held_for()
                if wait is None:
                    key = self._ready.popleft()
                    self._ready_at.pop(key, None)
                    break
            self._wakeup.clear()
            if wait is None:
                await self._wakeup.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), wait)
        self._queued.discard(key)
        self._processing.add(key)
        return key

    def _overdue(self) -> bool:
        """Whether the oldest key that is not new has waited ``max_wait`` seconds."""
        if self._max_wait is None or not self._ready:
            return False
        return time.monotonic() - self._ready_at[self._ready[0]] >= self._max_wait

    def _held_for(self) -> float | None:
        """How much longer the keys that are not new wait (None: serve them now)."""
        if not self._new_processing or self._hold <= 0:
            self._holding_since = None
            return None
        now = time.monotonic()
        if self._holding_since is None:
            self._holding_since = now
        left = self._holding_since + self._hold - now
        return left if left > 0 else None

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._new_processing:
            self._new_processing.discard(key)
            if not self._new_processing:
                self._holding_since = None
            self._wakeup.set()  # the others may be held back no longer
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def retry_delay(self, key: K) -> float:
        """The delay before retrying ``key`` after one more failure: base * 2^failures, capped."""
        failures = self._failures[key]
        self._failures[key] += 1
        return float(min(self._base_delay * 2 ** min(failures, 30), self._max_delay))

    def forget(self, key: K) -> None:
        """Reset ``key``'s error backoff (after a success)."""
        self._failures.pop(key, None)

    def drop(self, key: K) -> None:
        """Forget everything about ``key`` (its owner is gone): schedules and error counts."""
        self._failures.pop(key, None)
        scheduled = self._timers.pop(key, None)
        if scheduled is not None:
            scheduled[1].cancel()

    def shut_down(self) -> None:
        self._shut_down = True
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self._wakeup.set()
