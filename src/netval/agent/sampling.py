"""Collector reads off the event loop, with a deadline and at most one stuck thread.

Reading sysfs is usually fast, but a firmware-backed counter file of a wedged NIC (or any
file that blocks in open() or read(), like a FIFO) can hang the reading thread for good.
On the event loop that would stall MQTT keepalives and the peer responder too, so peers
would blame this node for loss. So one dedicated daemon thread takes the samples; the loop
waits at most `deadline` seconds for each. A read that misses it yields a `SampleMissing`
naming where the thread is blocked (the file it is reading, found from the thread's stack),
and while that read stays blocked no further read is started: a wedged file costs one
thread, not one per cycle. The thread is a daemon so a stuck read never keeps the process
from exiting.
"""

from __future__ import annotations

import asyncio
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePath
from types import FrameType
from typing import Final, Protocol

from netval.model.snapshot import Sample

MIN_DEADLINE: Final = 0.5
MAX_DEADLINE: Final = 10.0


class Collector(Protocol):
    def sample(self) -> Sample: ...


def default_deadline(interval_seconds: float) -> float:
    """Half the interval, within [0.5 s, 10 s]: the report still goes out in its slot."""
    return min(max(interval_seconds / 2, MIN_DEADLINE), MAX_DEADLINE)


@dataclass(frozen=True, slots=True)
class SampleMissing:
    """No sample this cycle: `reason` says why, for the report's error results."""

    reason: str


_Job = tuple[Callable[[], Sample], "asyncio.Future[Sample]", asyncio.AbstractEventLoop]


class BoundedSampler:
    """`await sample()`: the collector's sample, or `SampleMissing` after `deadline` s."""

    def __init__(self, collector: Collector, *, deadline: float) -> None:
        self.collector = collector
        self.deadline = deadline
        self.latest: Sample | None = None  # newest sample that arrived (peers list netdevs)
        self.timeouts = 0  # reads that missed their deadline
        self.errors = 0  # reads that raised
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._busy_since: float | None = None  # monotonic start of the read in progress

    @property
    def blocked(self) -> bool:
        """True while a read that missed its deadline is still in progress."""
        return self._busy_since is not None and time.monotonic() - self._busy_since >= (
            self.deadline
        )

    async def sample(self) -> Sample | SampleMissing:
        loop = asyncio.get_running_loop()
        if self._busy_since is not None:
            self.timeouts += 1
            since = time.monotonic() - self._busy_since
            return SampleMissing(f"collector read still blocked after {since:.1f} s{self._where()}")
        self._ensure_thread()
        future: asyncio.Future[Sample] = loop.create_future()
        self._busy_since = time.monotonic()
        self._jobs.put((self.collector.sample, future, loop))
        try:
            sample = await asyncio.wait_for(asyncio.shield(future), self.deadline)
        except TimeoutError:
            self.timeouts += 1
            return SampleMissing(
                f"collector read did not finish within {self.deadline:g} s{self._where()}"
            )
        except Exception as exc:
            self.errors += 1
            return SampleMissing(f"collector read raised {type(exc).__name__}: {exc}"[:300])
        self.latest = sample
        return sample

    def latest_source(self) -> _LatestSample:
        """A sync `sample()` for the peer service: the newest sample, never a fresh read."""
        return _LatestSample(self)

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._work, name="netval-collector", daemon=True)
            self._thread.start()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            read, future, loop = job
            try:
                result: Sample | BaseException = read()
            except BaseException as exc:  # handed to the loop, which decides
                result = exc
            self._busy_since = None
            try:
                loop.call_soon_threadsafe(_settle, future, result)
            except RuntimeError:  # the loop is closed: nobody waits any more
                return

    def _where(self) -> str:
        thread = self._thread
        if thread is None or thread.ident is None:
            return ""
        frame = sys._current_frames().get(thread.ident)
        where = blocked_at(frame)
        return f" (blocked at {where})" if where else ""

    def close(self) -> None:
        """Let an idle worker end (a blocked one ends with the process: it is a daemon)."""
        self._jobs.put(None)


class _LatestSample:
    def __init__(self, sampler: BoundedSampler) -> None:
        self._sampler = sampler

    def sample(self) -> Sample:
        if self._sampler.latest is None:
            raise LookupError("no sample taken yet")
        return self._sampler.latest


def _settle(future: asyncio.Future[Sample], result: Sample | BaseException) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


def blocked_at(frame: FrameType | None) -> str | None:
    """The file a thread is blocked on: the innermost frame with a path-like `path` local,
    else the innermost function's name and line."""
    innermost = frame
    while frame is not None:
        path = frame.f_locals.get("path")
        if isinstance(path, PurePath | str) and path:
            return os.fspath(path)
        frame = frame.f_back
    if innermost is None:
        return None
    code = innermost.f_code
    return f"{code.co_name} ({os.path.basename(code.co_filename)}:{innermost.f_lineno})"


__all__ = ["BoundedSampler", "Collector", "SampleMissing", "blocked_at", "default_deadline"]
