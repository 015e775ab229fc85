"""`peer.throughput`: a short TCP stream to the peer's sink, bounded in bytes and time.

The sink counts what arrived and for how long (first byte to EOF); the result passes with the
measurement, and the operator judges the cross/intra-domain ratio.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Final

from pydantic import JsonValue

from netval.agent.peers.target import (
    MIN_THROUGHPUT_BYTES,
    PeerTarget,
    ProbeSettings,
    describe,
    peer_result,
)
from netval.agent.peers.wire import TCP_HEADER, TCP_HELLO, TCP_MAGIC, TCP_RESULT, family_of
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.model.spec import PeerChecks

_CHUNK: Final = 1 << 18


@dataclass(frozen=True, slots=True)
class ThroughputSample:
    bytes: int  # received by the sink (after its header)
    seconds: float  # at the sink: first byte to end of stream

    @property
    def mbps(self) -> float:
        return self.bytes * 8 / max(self.seconds, 1e-9) / 1e6


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        part = sock.recv(size - len(data))
        if not part:
            raise ConnectionError("the sink closed the connection early")
        data += part
    return data


def _stream(target: PeerTarget, source: str | None, settings: ProbeSettings) -> ThroughputSample:
    """Blocking (run in a thread): send for `throughput_seconds` or `throughput_max_bytes`,
    half-close, read the sink's count."""
    token = secrets.randbits(64)
    family = family_of(target.address)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(settings.throughput_timeout)
        if source:
            sock.bind((source, 0))
        sock.connect((target.address, target.port))
        hello = _recv_exactly(sock, len(TCP_HELLO))
        if hello != TCP_HELLO:
            raise ConnectionError("the port does not answer as a netval peer sink")
        sock.sendall(TCP_HEADER.pack(TCP_MAGIC, token, 0))
        chunk = memoryview(os.urandom(_CHUNK))
        end = time.monotonic() + settings.throughput_seconds
        sent = 0
        while sent < settings.throughput_max_bytes and time.monotonic() < end:
            sent += sock.send(chunk[: min(_CHUNK, settings.throughput_max_bytes - sent)])
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(settings.throughput_timeout + settings.throughput_seconds)
        answer = _recv_exactly(sock, TCP_RESULT.size)
    magic, got_token, received, elapsed_ns = TCP_RESULT.unpack(answer)
    if magic != TCP_MAGIC or got_token != token:
        raise ConnectionError("the sink's answer is not for this stream")
    return ThroughputSample(bytes=int(received), seconds=elapsed_ns / 1e9)


async def measure_throughput(
    target: PeerTarget,
    *,
    checks: PeerChecks,
    source: str | None = None,
    settings: ProbeSettings | None = None,
) -> CheckResult:
    """`peer.throughput`: pass with the measurement (the operator judges the cross/intra
    ratio against minThroughputRatio), fail when it could not be measured."""
    settings = settings or ProbeSettings()
    expected: dict[str, JsonValue] = {"minThroughputRatio": checks.min_throughput_ratio}
    try:
        sample = await asyncio.to_thread(_stream, target, source, settings)
    except (OSError, ConnectionError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if isinstance(exc, TimeoutError):
            why = f"timed out after {settings.throughput_timeout:g} s"
        return peer_result(
            CheckId.PEER_THROUGHPUT,
            target,
            Status.FAIL,
            f"could not measure throughput to {describe(target)}: {why or type(exc).__name__}",
            expected=expected,
        )
    if sample.bytes < MIN_THROUGHPUT_BYTES:
        return peer_result(
            CheckId.PEER_THROUGHPUT,
            target,
            Status.FAIL,
            f"could not measure throughput to {describe(target)}: only {sample.bytes} bytes arrived",
            {"bytes": sample.bytes},
            expected,
        )
    return peer_result(
        CheckId.PEER_THROUGHPUT,
        target,
        Status.PASS,
        f"{sample.mbps:.1f} Mbit/s to {target.node} ({sample.bytes} bytes in "
        f"{sample.seconds:.3f} s, one TCP stream; judged as a cross/intra-domain ratio by "
        "the operator)",
        {"mbps": round(sample.mbps, 3), "bytes": sample.bytes, "seconds": round(sample.seconds, 4)},
        expected,
    )
