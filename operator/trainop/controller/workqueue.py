"""A keyed work queue with client-go's semantics, for the reconcile workers. In memory, by design.

- A key is queued at most once, however many events name it (bursts of pod or RayJob events collapse).
- A key is never processed by two workers at once: a key added while it is being processed is marked
  dirty and queued again when its worker calls :meth:`done`.
- :meth:`add_after` schedules a key (restart backoff, deadlines, TTLs); the earliest schedule wins.
- :meth:`retry_delay` gives per-key exponential backoff after errors; :meth:`forget` resets it.

Nothing here needs to survive the process: every deadline it holds is derived from owner status (for
instance ``status.nextRestartTime``), and on start the watch's initial listing queues every owner again.
This module must not know what a key means.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class ShutDown(Exception):
    """Raised by :meth:`WorkQueue.get` once the queue is shut down."""


class WorkQueue(Generic[K]):
    def __init__(self, *, base_delay: float = 0.5, max_delay: float = 60.0) -> None:
        self._ready: collections.deque[K] = collections.deque()
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
        return len(self._ready)

    def add(self, key: K) -> None:
        if self._shut_down:
            return
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._ready.append(key)
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
        while not self._ready:
            if self._shut_down:
                raise ShutDown
            self._wakeup.clear()
            await self._wakeup.wait()
        if self._shut_down:
            raise ShutDown
        key = self._ready.popleft()
        self._queued.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
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
