"""Bulk reads of a storage endpoint (by its name in the validation's checks.storage) for a
planned window: the same HTTP/1.1 GET as `storage.throughput` (`netval.agent.storage`), but
bound by time, not bytes: the object is read again and again until the window ends, and
only bytes that arrive after the warm-up count."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Final

from netval.agent.storage.http import build_http_request, read_http_head
from netval.agent.storage.net import ProbeFailure, Progress, close_writer, connect
from netval.agent.storage.target import HTTP_PROTOCOLS, target_of
from netval.model.loadplan import StorageResult, StorageTask
from netval.model.spec import StorageEndpoint

READ_CHUNK: Final = 1 << 18
PHASE_SECONDS: Final = 5.0  # connect and response head, and the longest stall


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


class _Count:
    def __init__(self, measure_start: float) -> None:
        self.measure_start = measure_start
        self.bytes = 0
        self.first: float | None = None

    def add(self, n: int, now: float) -> None:
        if now >= self.measure_start:
            if self.first is None:
                self.first = now
            self.bytes += n


async def _read_once(endpoint: StorageEndpoint, end: float, count: _Count) -> bool:
    """One GET of the object; True when it was read to its end before `end`."""
    target = target_of(endpoint)
    stream = None
    try:
        async with asyncio.timeout(PHASE_SECONDS):
            stream = await connect(target, Progress("connecting"))
            request = build_http_request(
                "GET", target.host_header, target.request_target, {"Accept-Encoding": "identity"}
            )
            stream.writer.write(request)
            await stream.writer.drain()
            head = await read_http_head(stream.reader, stream.address)
        if head.status not in (200, 206):
            raise ProbeFailure(head.said("GET", target.shown))
        while (left := end - time.time()) > 0:
            async with asyncio.timeout(min(left, PHASE_SECONDS)):
                chunk = await stream.reader.read(READ_CHUNK)
            if not chunk:
                return True
            count.add(len(chunk), time.time())
        return False
    except TimeoutError:
        if end - time.time() > 0:
            raise ProbeFailure(f"no data for {PHASE_SECONDS:g} s from {target.shown}") from None
        return False
    finally:
        if stream is not None:
            await close_writer(stream.writer)


async def read_endpoint(
    task: StorageTask, endpoint: StorageEndpoint | None, start: float, halt: asyncio.Event
) -> StorageResult:
    """Read from `start` (epoch) for the task's warm-up and measured seconds, or until `halt`;
    a failure is the result's `error`, never an exception."""
    measure_start = start + task.warmup_seconds
    end = measure_start + task.seconds
    count = _Count(measure_start)
    error: str | None = None
    if endpoint is None:
        error = f"no storage endpoint named {task.endpoint!r} in the validation"
    elif endpoint.protocol not in HTTP_PROTOCOLS or endpoint.path is None:
        error = f"endpoint {task.endpoint!r} is not http/s3 with a path"
    else:
        try:
            await asyncio.wait_for(halt.wait(), max(0.0, start - time.time()))
            error = "stopped before it started"
        except TimeoutError:
            pass
    if error is None and endpoint is not None:
        reader = asyncio.create_task(_read_until(endpoint, end, count))
        stopper = asyncio.create_task(halt.wait())
        await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not reader.done():
            reader.cancel()
            error = "stopped early"
        elif (exc := reader.exception()) is not None:
            error = (str(exc) or type(exc).__name__)[:200]
    finished = min(time.time(), end)
    begun = count.first or measure_start
    if error is not None or finished <= begun:
        return StorageResult(
            window=task.window, endpoint=task.endpoint, bytes=count.bytes,
            start=_at(measure_start), end=_at(end), error=error or "no measured time",
        )  # fmt: skip
    return StorageResult(
        window=task.window,
        endpoint=task.endpoint,
        bytes=count.bytes,
        start=_at(measure_start),
        end=_at(finished),
    )


async def _read_until(endpoint: StorageEndpoint, end: float, count: _Count) -> None:
    while time.time() < end:
        if not await _read_once(endpoint, end, count):
            return
