"""`storage.throughput`: a ranged GET of the object at `path`, bounded, and its verdict.

For s3/http endpoints with `path` and `minThroughputMBps`, on the cycles the caller asks for:
reads up to `THROUGHPUT_MAX_BYTES` of the object, for at most `THROUGHPUT_MAX_SECONDS`, and
reports MB/s = 10^6 bytes per second over the body transfer.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Final

from pydantic import JsonValue

from netval.agent.storage.http import build_http_request, read_http_head
from netval.agent.storage.judge import endpoint_result
from netval.agent.storage.net import (
    ProbeFailure,
    Progress,
    Stream,
    close_writer,
    connect,
    network_failure,
)
from netval.agent.storage.reach import Reach
from netval.agent.storage.target import HTTP_PROTOCOLS, Target
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.model.spec import StorageEndpoint

__all__ = [
    "THROUGHPUT_MAX_BYTES",
    "THROUGHPUT_MAX_SECONDS",
    "THROUGHPUT_MIN_BYTES",
    "measure_throughput",
    "throughput_result",
    "throughput_skip_reason",
]

# Throughput is bounded both ways so a probe never turns into load nor runs into the next cycle;
# MB/s comes from whatever arrived when either bound is reached.
THROUGHPUT_MAX_BYTES: Final = 64 * 1024 * 1024
THROUGHPUT_MAX_SECONDS: Final = 10.0
# Below this, TCP slow start and request latency dominate and MB/s says little about the path.
THROUGHPUT_MIN_BYTES: Final = 1024 * 1024
_MEGABYTE: Final = 1_000_000
_READ_CHUNK: Final = 256 * 1024


@dataclass(frozen=True, slots=True)
class _Transfer:
    received: int
    seconds: float
    time_capped: bool
    http_status: int


async def _read_body(
    reader: asyncio.StreamReader, limit: int, stall_timeout: float, deadline: float
) -> tuple[int, bool]:
    """(bytes read, stopped by THROUGHPUT_MAX_SECONDS or `deadline`); a stall raises
    ProbeFailure."""
    loop = asyncio.get_running_loop()
    end = min(loop.time() + THROUGHPUT_MAX_SECONDS, deadline)
    received = 0
    stall_guard = False
    try:
        async with asyncio.timeout(None) as guard:
            while received < limit:
                now = loop.time()
                if now >= end:
                    return received, True
                stall_guard = now + stall_timeout < end
                guard.reschedule(min(now + stall_timeout, end))
                chunk = await reader.read(min(_READ_CHUNK, limit - received))
                if not chunk:
                    break
                received += len(chunk)
    except TimeoutError:
        if stall_guard:
            raise ProbeFailure(
                f"transfer stalled: no data for {stall_timeout:g} s after {received} bytes"
            ) from None
        return received, True
    return received, False


async def _transfer(
    target: Target, phase_timeout: float, deadline: float, progress: Progress
) -> _Transfer:
    stream: Stream | None = None
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout_at(min(loop.time() + phase_timeout, deadline)):
            stream = await connect(target, progress)
            progress.step = f"waiting for the HTTP response to GET {target.shown}"
            stream.writer.write(
                build_http_request(
                    "GET",
                    target.host_header,
                    target.request_target,
                    {
                        "Range": f"bytes=0-{THROUGHPUT_MAX_BYTES - 1}",
                        # a compressed body would overstate the path's bandwidth
                        "Accept-Encoding": "identity",
                    },
                )
            )
            await stream.writer.drain()
            head = await read_http_head(stream.reader, stream.address)
        if head.status not in (200, 206):
            hint = (
                "; the object must be readable without credentials (public, or a presigned path)"
                if head.status in (401, 403)
                else ""
            )
            raise ProbeFailure(f"{head.said('GET', target.shown)}{hint}")
        limit = THROUGHPUT_MAX_BYTES
        length = head.headers.get("content-length", "")
        if length.isdigit():
            limit = min(limit, int(length))
        progress.step = f"reading {target.shown}"
        started = time.perf_counter()
        # With Connection: close a chunked body ends at EOF; its framing bytes count, which is
        # noise next to the megabytes measured.
        received, time_capped = await _read_body(stream.reader, limit, phase_timeout, deadline)
        seconds = time.perf_counter() - started
    finally:
        if stream is not None:
            await close_writer(stream.writer)
    return _Transfer(received, seconds, time_capped, head.status)


def _throughput_skip_reason(
    endpoint: StorageEndpoint, *, measure: bool, reachable: bool
) -> str | None:
    if endpoint.min_throughput_m_bps is None:
        return "not measured: no minThroughputMBps set"
    if endpoint.protocol not in HTTP_PROTOCOLS:
        return (
            f"not measured: throughput is measured for s3 and http endpoints only, "
            f"not {endpoint.protocol.value}"
        )
    if endpoint.path is None:
        return "not measured: no path set (throughput reads the object at path)"
    if not measure:
        return "not measured in this cycle (throughput is read in this node's storage slots)"
    if not reachable:
        return "not measured: endpoint unreachable"
    return None


def throughput_skip_reason(endpoint: StorageEndpoint) -> str | None:
    """Why the spec leaves `storage.throughput` of `endpoint` unmeasured, if it does."""
    return _throughput_skip_reason(endpoint, measure=True, reachable=True)


async def throughput_result(
    endpoint: StorageEndpoint,
    target: Target,
    reach: Reach,
    *,
    measure: bool,
    phase_timeout: float,
) -> CheckResult:
    reason = _throughput_skip_reason(endpoint, measure=measure, reachable=reach.ok)
    if reason is not None:
        return endpoint_result(CheckId.STORAGE_THROUGHPUT, endpoint, Status.SKIP, reason)
    return await measure_throughput(endpoint, target, phase_timeout=phase_timeout)


async def measure_throughput(
    endpoint: StorageEndpoint,
    target: Target,
    *,
    phase_timeout: float,
    deadline: float = math.inf,
) -> CheckResult:
    """Read the object now, ending by `deadline` (event loop time) at the latest; the endpoint
    must measure throughput (`throughput_skip_reason` is None)."""
    check = CheckId.STORAGE_THROUGHPUT
    minimum = endpoint.min_throughput_m_bps
    assert minimum is not None
    expected: dict[str, JsonValue] = {"minThroughputMBps": minimum}
    progress = Progress("before connecting")
    try:
        transfer = await _transfer(target, phase_timeout, deadline, progress)
    except Exception as exc:
        message = network_failure(exc, progress, phase_timeout)
        if message is None:
            raise
        return endpoint_result(check, endpoint, Status.FAIL, message, expected=expected)
    if transfer.received == 0:
        return endpoint_result(
            check,
            endpoint,
            Status.FAIL,
            f"GET {target.shown} returned no data",
            expected=expected,
        )
    mbps = transfer.received / _MEGABYTE / max(transfer.seconds, 1e-9)
    observed: dict[str, JsonValue] = {
        "MBps": round(mbps, 3),
        "bytes": transfer.received,
        "seconds": round(transfer.seconds, 4),
        "httpStatus": transfer.http_status,
    }
    read = f"{mbps:.1f} MB/s reading {transfer.received} bytes of {target.shown}"
    if transfer.received < THROUGHPUT_MIN_BYTES and not transfer.time_capped:
        return endpoint_result(
            check,
            endpoint,
            Status.WARN,
            f"{read}: the object is too small for a meaningful rate "
            f"(use one of at least {THROUGHPUT_MIN_BYTES} bytes)",
            observed,
            expected,
        )
    if mbps < minimum:
        return endpoint_result(
            check,
            endpoint,
            Status.FAIL,
            f"{read}, below the minimum of {minimum:g} MB/s",
            observed,
            expected,
        )
    return endpoint_result(
        check, endpoint, Status.PASS, f"{read} (minimum {minimum:g} MB/s)", observed, expected
    )
