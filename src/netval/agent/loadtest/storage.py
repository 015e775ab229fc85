"""Bulk reads of a storage endpoint (by its name in the validation's checks.storage) for a
planned window: the same HTTP/1.1 GET as `storage.throughput` (`netval.agent.storage`), but
bound by time, not bytes: read again and again until the window ends; only bytes that
arrive after the warm-up count.

Each reader reads something of its own, so the store cannot answer every node from one
cached object: its own object when the endpoint's path holds `{node}` (replaced by this
node's name), else its own byte range of the one object (`part` of `parts`, HTTP Range;
the object's size from a first one-byte ranged GET). A store that ignores Range (200, not
206) fails the read: the readers would share one object. A reader alone (`parts` 1) reads
the whole object.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from netval.agent.storage.http import HttpHead, build_http_request, read_http_head
from netval.agent.storage.net import ProbeFailure, Progress, Stream, close_writer, connect
from netval.agent.storage.target import HTTP_PROTOCOLS, target_of
from netval.model.loadplan import StorageResult, StorageTask
from netval.model.spec import StorageEndpoint

READ_CHUNK: Final = 1 << 18
PHASE_SECONDS: Final = 5.0  # connect and response head, and the longest stall
NODE_PLACEHOLDER: Final = "{node}"
_CONTENT_RANGE: Final = re.compile(r"^bytes\s+\d+-\d+/(\d+)$")


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


@dataclass(frozen=True, slots=True)
class Share:
    """What this reader reads: an endpoint (its path made this node's own) and a range."""

    endpoint: StorageEndpoint
    own_object: bool
    first: int | None = None
    last: int | None = None

    @property
    def range_header(self) -> dict[str, str]:
        if self.first is None or self.last is None:
            return {}
        return {"Range": f"bytes={self.first}-{self.last}"}


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


async def _get(share: Share, headers: dict[str, str]) -> tuple[Stream, HttpHead]:
    target = target_of(share.endpoint)
    stream = await connect(target, Progress("connecting"))
    request = build_http_request(
        "GET", target.host_header, target.request_target,
        {"Accept-Encoding": "identity", **headers},
    )  # fmt: skip
    stream.writer.write(request)
    await stream.writer.drain()
    head = await read_http_head(stream.reader, stream.address)
    return stream, head


async def object_size(endpoint: StorageEndpoint) -> int:
    """The object's size from a one-byte ranged GET; ProbeFailure if the store ignores
    Range or does not say the size."""
    target = target_of(endpoint)
    stream: Stream | None = None
    try:
        async with asyncio.timeout(PHASE_SECONDS):
            stream, head = await _get(Share(endpoint, False), {"Range": "bytes=0-0"})
        status = head.status
        if status not in (200, 206):
            raise ProbeFailure(head.said("GET", target.shown))
        if status != 206:
            raise ProbeFailure(
                f"GET {target.shown} with Range answered {status}, not 206: the store ignores "
                "byte ranges (put {node} in the path to give each reader its own object)"
            )
        match = _CONTENT_RANGE.match(head.headers.get("content-range", ""))
        if match is None:
            raise ProbeFailure(f"GET {target.shown} answered 206 without the object's size")
        return int(match.group(1))
    except TimeoutError:
        raise ProbeFailure(f"no answer for {PHASE_SECONDS:g} s from {target.shown}") from None
    finally:
        if stream is not None:
            await close_writer(stream.writer)


async def share_of(task: StorageTask, endpoint: StorageEndpoint, node: str) -> Share:
    path = endpoint.path or "/"
    if NODE_PLACEHOLDER in path:
        own = endpoint.model_copy(update={"path": path.replace(NODE_PLACEHOLDER, node)})
        return Share(own, True)
    if task.parts <= 1:
        return Share(endpoint, False)
    size = await object_size(endpoint)
    if size < task.parts:
        raise ProbeFailure(f"the object ({size} bytes) is smaller than {task.parts} readers")
    first = task.part * size // task.parts
    last = (task.part + 1) * size // task.parts - 1
    return Share(endpoint, False, first, last)


async def _read_once(share: Share, end: float, count: _Count) -> bool:
    """One GET of this reader's share; True when it was read to its end before `end`."""
    target = target_of(share.endpoint)
    stream: Stream | None = None
    try:
        async with asyncio.timeout(PHASE_SECONDS):
            stream, head = await _get(share, share.range_header)
        if head.status != (206 if share.range_header else 200):
            raise ProbeFailure(head.said("GET", target.shown))
        reader = stream.reader
        while (left := end - time.time()) > 0:
            async with asyncio.timeout(min(left, PHASE_SECONDS)):
                chunk = await reader.read(READ_CHUNK)
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
    task: StorageTask,
    endpoint: StorageEndpoint | None,
    start: float,
    halt: asyncio.Event,
    node: str = "",
) -> StorageResult:
    """Read from `start` (epoch) for the task's warm-up and measured seconds, or until `halt`;
    a failure is the result's `error`, never an exception."""
    measure_start = start + task.warmup_seconds
    end = measure_start + task.seconds
    count = _Count(measure_start)
    error: str | None = None
    share: Share | None = None
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
        reader = asyncio.create_task(_read_share(task, endpoint, node, end, count))
        stopper = asyncio.create_task(halt.wait())
        await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not reader.done():
            reader.cancel()
            error = "stopped early"
        elif (exc := reader.exception()) is not None:
            error = (str(exc) or type(exc).__name__)[:200]
        else:
            share = reader.result()
    finished = min(time.time(), end)
    begun = count.first or measure_start
    extra = {
        "own_object": share.own_object if share else False,
        "range_first": share.first if share else None,
        "range_last": share.last if share else None,
    }
    if error is not None or finished <= begun:
        return StorageResult(
            window=task.window, endpoint=task.endpoint, bytes=count.bytes,
            start=_at(measure_start), end=_at(end), error=error or "no measured time", **extra,
        )  # fmt: skip
    return StorageResult(
        window=task.window, endpoint=task.endpoint, bytes=count.bytes,
        start=_at(measure_start), end=_at(finished), **extra,
    )  # fmt: skip


async def _read_share(
    task: StorageTask, endpoint: StorageEndpoint, node: str, end: float, count: _Count
) -> Share:
    share = await share_of(task, endpoint, node)
    while time.time() < end:
        if not await _read_once(share, end, count):
            break
    return share
