"""Node writes, paced: one queue entry per node, written at a fixed rate (a token bucket).

A mass transition (1 % of a 100,000-node fleet failing within a minute) asks for a thousand
Node patches at once; sent as fast as the worker threads allow they would take the API
server's priority seats from every other client. So the gating round does not write: it says
what each node should carry (`want`), and one drain task writes at most `rate` Nodes per second
with bursts of `burst`. Per node there is one entry holding the latest wish: a node whose
verdict changes twice while queued is written once, with the newest value; a node whose wish
returns to what it already carries leaves the queue unwritten. Two classes: a write that
excludes a node (label `unhealthy`, the taint) goes before every write that lets workloads on
(`NodeChange.excludes`), so a node failing during a relabel of the whole fleet is excluded
within seconds, not after it; within a class entries leave in the order they were first
dirtied (FIFO), so no node starves behind a flapping one. Nothing is dropped: a failed write
goes back to its class's tail, and every round re-derives the wishes from what the Nodes
carry anyway. `pending_exclusions` names the nodes whose exclusion is not written yet (the
gate releaser waits for them).
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
        # node -> (latest change, first-dirty time), per class; dict order is first-dirty
        # order; exclusions are drained first
        self._excluding: dict[str, tuple[NodeChange, float]] = {}
        self._including: dict[str, tuple[NodeChange, float]] = {}
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
        return len(self._excluding) + len(self._including)

    @property
    def pending(self) -> dict[str, tuple[NodeChange, float]]:
        """Every queued wish, in the order they are written (a copy)."""
        return {**self._excluding, **self._including}

    def pending_exclusions(self) -> set[str]:
        """Nodes whose exclusion (label `unhealthy`, the taint) is queued or being written."""
        out = set(self._excluding)
        out.update(n for n, change in self.inflight.items() if change.excludes)
        return out

    def _queued(self, node: str) -> tuple[NodeChange, float] | None:
        found = self._excluding.get(node)
        return found if found is not None else self._including.get(node)

    def _drop(self, node: str) -> None:
        self._excluding.pop(node, None)
        self._including.pop(node, None)

    def _put(self, change: NodeChange, dirty_at: float) -> None:
        """Queue at its class's tail (or in place, when it is already queued there)."""
        node = change.node
        into, other = (
            (self._excluding, self._including) if change.excludes
            else (self._including, self._excluding)
        )  # fmt: skip
        other.pop(node, None)
        into[node] = (change, dirty_at)

    def want(self, change: NodeChange) -> None:
        """`change.node` should carry `change`; a queued older wish for it is replaced in
        place (its first-dirty time kept; its place too, unless it changes class)."""
        node = change.node
        self._withdrawn.discard(node)
        queued = self._queued(node)
        if self.inflight.get(node) == change:
            if queued is not None:  # back to what is being written: nothing more to do
                self._drop(node)
            return
        if queued is None:
            self._put(change, self._clock())
            self._ready.set()
        elif queued[0] != change:
            self._put(change, queued[1])
            self.coalesced += 1

    def reconcile(self, changes: Mapping[str, NodeChange]) -> None:
        """This round's complete wish list (nodes whose (label, taint) differ from what they
        carry): queued nodes missing from it already carry what they should."""
        for table in (self._excluding, self._including):
            for node in [n for n in table if n not in changes]:
                del table[node]
        self._withdrawn.update(n for n in self.inflight if n not in changes)
        for change in changes.values():
            self.want(change)

    def _next(self) -> tuple[NodeChange, float] | None:
        for table in (self._excluding, self._including):
            if table:
                node = next(iter(table))
                return table.pop(node)
        return None

    async def run(self) -> None:
        """Drain until cancelled: one token per write, at most `concurrency` in flight."""
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                if not len(self):
                    self._ready.clear()
                    await self._ready.wait()
                    continue
                await self._limit.acquire()
                await self.bucket.take()
                taken = self._next()  # the oldest exclusion, else the oldest inclusion
                if taken is None:  # emptied by a reconcile while waiting
                    self._limit.release()
                    continue
                change, dirty_at = taken
                self.inflight[change.node] = change
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
                and self._queued(change.node) is None
                and change.node not in self._withdrawn
            ):
                self.retried += 1
                self._put(change, dirty_at)  # its class's tail, not dropped
                self._ready.set()
            elif done:
                self.written += 1
                self.latency.observe(self._clock() - dirty_at)
        finally:
            self.inflight.pop(change.node, None)
            self._withdrawn.discard(change.node)
            self._limit.release()
