"""One planned TCP flow to a peer's sink: from the plan's absolute start, warm-up excluded
from the measured bytes, capped per flow by a token bucket on send. Blocking: it runs in a
thread (`asyncio.to_thread`), one per flow, and checks its `halt` event at least every
`POLL_SECONDS`, so an abort or the plan's deadline stops it within a fraction of a second.

Bytes are the ones the receiver acknowledged (TCP_INFO tcpi_bytes_acked, Linux >= 4.1),
read at the end of the warm-up and at the end: what the socket buffer still holds is not
counted (at 40 Mbit/s a 4 MiB send buffer is 0.8 s of data). The flow ends with a reset
(SO_LINGER 0), so nothing buffered keeps the link busy after its window.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Final

from netval.agent.peers.wire import LOAD_MAGIC, TCP_HEADER, TCP_HELLO, family_of

CHUNK: Final = 1 << 17
POLL_SECONDS: Final = 0.2
CONNECT_SECONDS: Final = 2.0
_TCP_INFO_LEN: Final = 232
_BYTES_ACKED: Final = struct.Struct("=Q")
_BYTES_ACKED_AT: Final = 120  # struct tcp_info: tcpi_bytes_acked (include/uapi/linux/tcp.h)
_LINGER_RESET: Final = struct.pack("ii", 1, 0)


class TokenBucket:
    """`rate` bytes per second with `burst` bytes of credit; `wait(n)` says how long to
    sleep before `n` bytes may go."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate, self.burst = rate, burst
        self.tokens, self.last = burst, now

    def wait(self, n: int, now: float) -> float:
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        return 0.0 if self.tokens >= n else (n - self.tokens) / self.rate

    def spend(self, n: int) -> None:
        self.tokens -= n


def bucket_for(cap_mbps: float, now: float) -> TokenBucket | None:
    """The pacing of a flow capped at `cap_mbps` (0: none). The burst is 10 ms of the rate
    (at least one chunk): the cap holds over any window longer than that."""
    if cap_mbps <= 0:
        return None
    rate = cap_mbps * 1e6 / 8
    return TokenBucket(rate, max(float(CHUNK), rate * 0.01), now)


@dataclass(frozen=True, slots=True)
class FlowOutcome:
    bytes: int
    start: float  # epoch seconds (agent clock): the measured part
    end: float
    error: str | None = None
    sent: int = 0  # handed to the kernel, warm-up included


def _acked(sock: socket.socket, fallback: int) -> int:
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except OSError:
        return fallback
    if len(info) < _BYTES_ACKED_AT + _BYTES_ACKED.size:
        return fallback  # an old kernel: what was handed over, buffer included
    return int(_BYTES_ACKED.unpack_from(info, _BYTES_ACKED_AT)[0])


def _recv_hello(sock: socket.socket, halt: threading.Event) -> None:
    data = b""
    while len(data) < len(TCP_HELLO):
        if halt.is_set():
            raise InterruptedError("stopped")
        try:
            part = sock.recv(len(TCP_HELLO) - len(data))
        except TimeoutError:
            continue
        if not part:
            raise ConnectionError("the sink closed the connection")
        data += part
    if data != TCP_HELLO:
        raise ConnectionError("the port does not answer as a netval peer sink")


def send_flow(
    address: str,
    port: int,
    *,
    source: str | None,
    token: int,
    start: float,
    measure_start: float,
    end: float,
    cap_mbps: float,
    halt: threading.Event,
) -> FlowOutcome:
    """Send from `start` to `end` (epoch seconds); count acknowledged bytes from
    `measure_start`. Never raises: a failure is the outcome's `error`."""
    now = time.time
    if halt.wait(max(0.0, start - now())):
        return FlowOutcome(0, measure_start, end, "stopped before it started")
    acked0: int | None = None
    measured_from = measure_start
    sent = 0
    sock = socket.socket(family_of(address), socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_SECONDS)
        if source:
            sock.bind((source, 0))
        sock.connect((address, port))
        sock.settimeout(POLL_SECONDS)
        _recv_hello(sock, halt)
        sock.sendall(TCP_HEADER.pack(LOAD_MAGIC, token, 0))
        chunk = memoryview(os.urandom(CHUNK))
        bucket = bucket_for(cap_mbps, time.monotonic())
        while not halt.is_set():
            t = now()
            if acked0 is None and t >= measure_start:
                acked0, measured_from = _acked(sock, sent), t
            if t >= end:
                break
            if bucket is not None:
                pause = bucket.wait(CHUNK, time.monotonic())
                if pause > 0:
                    halt.wait(min(pause, POLL_SECONDS, max(end - t, 0.0)))
                    continue
            try:
                n = sock.send(chunk)
            except TimeoutError:
                continue
            sent += n
            if bucket is not None:
                bucket.spend(n)
        finished = now()
        if acked0 is None:
            return FlowOutcome(0, measure_start, end, "stopped before the measured part", sent)
        acked = _acked(sock, sent) - acked0
        error = "stopped early" if halt.is_set() and finished < end else None
        if finished <= measured_from:
            return FlowOutcome(0, measure_start, end, error or "no measured time", sent)
        return FlowOutcome(max(acked, 0), measured_from, finished, error, sent)
    except OSError as exc:  # ConnectionError, InterruptedError and TimeoutError too
        why = (exc.strerror or str(exc) or type(exc).__name__)[:200]
        finished = now()
        if acked0 is not None and finished > measured_from:
            # what was measured before the connection broke still says something
            acked = max(_acked(sock, acked0) - acked0, 0)
            return FlowOutcome(acked, measured_from, finished, why, sent)
        return FlowOutcome(0, measure_start, end, why, sent)
    finally:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        sock.close()
