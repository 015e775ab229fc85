"""A keyed work queue in the manner of controller-runtime's (client-go `workqueue`): what a
per-object reconciler takes its work from.

- Dedup: a key added while it waits is queued once; a key added while a worker processes it
  is queued again when that worker is `done` with it (never two workers on one key).
- Per-item backoff: `add_rate_limited` re-adds a key after `base * 2**(failures - 1)` seconds
  (at most `cap`); `forget` resets its count once it succeeded.
- `add_after`: a key re-added later (the earliest of several requests wins).

Pure asyncio, no I/O; imports nothing of the operator.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self, *, base_delay: float = 0.5, max_delay: float = 30.0) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()  # waiting to be processed (in _queue, or after `done`)
        self._processing: set[K] = set()
        self._failures: dict[K, int] = {}
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._ready = asyncio.Event()
        self.adds = 0  # keys that were queued (not deduplicated away)

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def idle(self) -> bool:
        """Nothing queued, in process or waiting for its delay."""
        return not self._queue and not self._processing and not self._timers

    def add(self, key: K) -> None:
        if key in self._dirty:
            return
        self._dirty.add(key)
        self.adds += 1
        if key in self._processing:
            return  # `done` queues it again
        self._queue.append(key)
        self._ready.set()

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        at = loop.time() + delay
        known = self._timers.get(key)
        if known is not None:
            if known[0] <= at:
                return
            known[1].cancel()
        self._timers[key] = (at, loop.call_at(at, self._fire, key))

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def add_rate_limited(self, key: K) -> float:
        """Queue `key` again after its backoff; the delay (seconds)."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = min(self.max_delay, self.base_delay * 2.0 ** min(failures - 1, 30))
        self.add_after(key, delay)
        return delay

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        """`key` succeeded: its next failure starts from `base_delay` again."""
        self._failures.pop(key, None)

    async def get(self) -> K:
        """The next key (FIFO); the caller must call `done(key)` when it finished it."""
        while not self._queue:
            self._ready.clear()
            await self._ready.wait()
        key = self._queue.popleft()
        if not self._queue:
            self._ready.clear()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self._ready.set()

    def close(self) -> None:
        """Cancel the delayed adds (the owner stops)."""
        for _, timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
