"""Node writes, paced: one queue entry per node, written at a fixed rate (a token bucket).

A mass transition (1 % of a 100,000-node fleet failing within a minute) asks for a thousand
Node patches at once; sent as fast as the worker threads allow they would take the API
server's priority seats from every other client. So the gating round does not write: it says
what each node should carry (`want`), and one drain task writes at most `rate` Nodes per second
with bursts of `burst`. Per node there is one entry holding the latest wish: a node whose
verdict changes twice while queued is written once, with the newest value; a node whose wish
returns to what it already carries leaves the queue unwritten. Entries leave in the order they
were first dirtied (FIFO), so no node starves behind a flapping one. Nothing is dropped: a
failed write goes back to the queue's tail, and every round re-derives the wishes from what the
Nodes carry anyway.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

from netval.operator.gating.decisions import NodeChange

log = logging.getLogger("netval.operator")

# dirty -> written, seconds (the histogram's upper bounds; +Inf implied)
LATENCY_BUCKETS: Final = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class TokenBucket:
    """`rate` tokens per second, at most `burst` saved up; starts full."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"rate must be > 0 and burst >= 1, got {rate}, {burst}")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now

    def wait_time(self) -> float:
        """Seconds until a token is there (0: now)."""
        self._refill()
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) / self.rate

    async def take(self) -> None:
        # One sleep computed from the deficit is enough: the refill after it covers a token
        # (a second pass only on a clock that advanced less than asked).
        for _ in range(3):
            delay = self.wait_time()
            if delay <= 0:
                break
            await asyncio.sleep(delay)
        self._refill()
        self._tokens -= 1


class LatencyHistogram:
    """Cumulative-bucket counts, as Prometheus exports a histogram."""

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def buckets(self) -> list[tuple[str, int]]:
        """[(upper bound, cumulative count)], "+Inf" last."""
        out: list[tuple[str, int]] = []
        running = 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


Write = Callable[[NodeChange], Awaitable[bool | None]]


class NodeWriteQueue:
    """The latest wanted (label, taint) per node, drained at the token bucket's rate by
    `run`; `write(change)` returns True when written, False when the Node is gone, None
    (or raises) when it failed and must be tried again."""

    def __init__(
        self,
        write: Write,
        bucket: TokenBucket,
        concurrency: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._write = write
        self.bucket = bucket
        self._clock = clock
        self._limit = asyncio.Semaphore(concurrency)
        # node -> (latest change, first-dirty time); dict order is first-dirty order
        self.pending: dict[str, tuple[NodeChange, float]] = {}
        self.inflight: dict[str, NodeChange] = {}
        # in flight, and a round since found the node needs nothing: a failed write of it is
        # not put back (it would write a wish nobody has any more)
        self._withdrawn: set[str] = set()
        self._ready = asyncio.Event()
        self.written = 0
        self.coalesced = 0  # wishes replaced by a newer one before they were written
        self.retried = 0
        self.latency = LatencyHistogram()

    def __len__(self) -> int:
        return len(self.pending)

    def want(self, change: NodeChange) -> None:
        """`change.node` should carry `change`; a queued older wish for it is replaced in
        place (its first-dirty time and place kept)."""
        node = change.node
        self._withdrawn.discard(node)
        queued = self.pending.get(node)
        if self.inflight.get(node) == change:
            if queued is not None:  # back to what is being written: nothing more to do
                del self.pending[node]
            return
        if queued is None:
            self.pending[node] = (change, self._clock())
            self._ready.set()
        elif queued[0] != change:
            self.pending[node] = (change, queued[1])
            self.coalesced += 1

    def reconcile(self, changes: Mapping[str, NodeChange]) -> None:
        """This round's complete wish list (nodes whose (label, taint) differ from what they
        carry): queued nodes missing from it already carry what they should."""
        for node in [n for n in self.pending if n not in changes]:
            del self.pending[node]
        self._withdrawn.update(n for n in self.inflight if n not in changes)
        for change in changes.values():
            self.want(change)

    async def run(self) -> None:
        """Drain until cancelled: one token per write, at most `concurrency` in flight."""
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                if not self.pending:
                    self._ready.clear()
                    await self._ready.wait()
                    continue
                await self._limit.acquire()
                await self.bucket.take()
                if not self.pending:  # emptied by a reconcile while waiting
                    self._limit.release()
                    continue
                node = next(iter(self.pending))
                change, dirty_at = self.pending.pop(node)
                self.inflight[node] = change
                task = asyncio.create_task(self._one(change, dirty_at))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:
            for task in tasks:
                task.cancel()

    async def _one(self, change: NodeChange, dirty_at: float) -> None:
        try:
            done: bool | None = None
            try:
                done = await self._write(change)
            except Exception as exc:  # the write logs what failed; the entry comes back
                log.debug("node write %s failed: %s", change.node, exc)
            if (
                done is None
                and change.node not in self.pending
                and change.node not in self._withdrawn
            ):
                self.retried += 1
                self.pending[change.node] = (change, dirty_at)  # the tail, not dropped
                self._ready.set()
            elif done:
                self.written += 1
                self.latency.observe(self._clock() - dirty_at)
        finally:
            self.inflight.pop(change.node, None)
            self._withdrawn.discard(change.node)
            self._limit.release()
