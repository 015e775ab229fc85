"""The east-west responder: a UDP echo and a TCP sink on `peers.port` of the fabric address.

Peers probe it (`netval.agent.peers.echo`): UDP echoes for latency, jitter and loss, DF-set
UDP probes of the fabric MTU for the path MTU, and a short TCP stream for throughput.

It binds to the address of `peers.interface` (by default the first RDMA netdev), never to a
wildcard address, so it is not offered on the management network. Everything is bounded:

- UDP: a reply is a fixed 32-byte header, never larger than the request (no amplification);
  a request must be a well-formed header of at most `max_datagram` bytes; per-source and
  global token buckets drop floods (counted); the source table is capped (LRU).
- TCP: at most `max_connections` concurrent streams and `max_connections_per_source` per
  source, per-source connection rate limit, a header deadline, an idle timeout, a hard
  per-stream duration and byte cap; data is read into one shared buffer and discarded.
  It serves the continuous throughput samples only: a `NetworkLoadTest` runs its own
  engines (iperf3, perftest), whose servers the node's plan starts for their window.

The wire format is in `netval.agent.peers.wire`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from netval.agent.peers.wire import (
    KIND_MTU,
    KIND_MTU_ACK,
    KIND_PING,
    KIND_PONG,
    SO_TIMESTAMPNS,
    TCP_HEADER,
    TCP_HELLO,
    TCP_MAGIC,
    TCP_RESULT,
    UDP_HEADER,
    UDP_MAGIC,
    family_of,
    kernel_timestamp_ns,
)

log = logging.getLogger(__name__)

_REPLY_KIND: Final = {KIND_PING: KIND_PONG, KIND_MTU: KIND_MTU_ACK}
_MAX_UDP: Final = 65535
_PICK_ATTEMPTS: Final = 8
_BATCH: Final = 64  # datagrams handled per wakeup before yielding to the loop


@dataclass(frozen=True, slots=True)
class ResponderLimits:
    max_datagram: int = 65507  # largest UDP payload over IPv4; jumbo probes fit
    per_source_pps: float = 1000.0
    per_source_burst: float = 500.0
    global_pps: float = 50_000.0
    global_burst: float = 10_000.0
    max_sources: int = 4096  # token buckets kept (least recently seen evicted)
    max_connections: int = 8
    max_connections_per_source: int = 2
    connections_per_source_per_minute: float = 30.0
    header_timeout: float = 2.0
    idle_timeout: float = 3.0
    max_stream_seconds: float = 10.0
    max_stream_bytes: int = 4 << 30


@dataclass(slots=True)
class ResponderStats:
    udp_replies: int = 0
    udp_rate_limited: int = 0
    udp_malformed: int = 0
    udp_send_failures: int = 0
    tcp_streams: int = 0
    tcp_refused: int = 0
    tcp_aborted: int = 0
    tcp_bytes: int = 0


class _Bucket:
    __slots__ = ("last", "tokens")

    def __init__(self, tokens: float, now: float) -> None:
        self.tokens = tokens
        self.last = now

    def take(self, rate: float, burst: float, now: float) -> bool:
        self.tokens = min(burst, self.tokens + (now - self.last) * rate)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class _RateLimiter:
    """Token buckets per source plus one global bucket; the source table is LRU-capped."""

    def __init__(
        self, rate: float, burst: float, global_rate: float, global_burst: float, max_sources: int
    ) -> None:
        self.rate, self.burst = rate, burst
        self.global_rate, self.global_burst = global_rate, global_burst
        self.max_sources = max_sources
        self._sources: OrderedDict[str, _Bucket] = OrderedDict()
        self._global = _Bucket(global_burst, time.monotonic())

    def allow(self, source: str, now: float) -> bool:
        bucket = self._sources.get(source)
        if bucket is None:
            if len(self._sources) >= self.max_sources:
                self._sources.popitem(last=False)
            bucket = self._sources[source] = _Bucket(self.burst, now)
        else:
            self._sources.move_to_end(source)
        if not bucket.take(self.rate, self.burst, now):
            return False
        return self._global.take(self.global_rate, self.global_burst, now)


class PeerResponder:
    """UDP echo + TCP sink bound to one fabric address; `start()` then `close()`."""

    def __init__(self, address: str, port: int, *, limits: ResponderLimits | None = None) -> None:
        if not address or address in ("0.0.0.0", "::"):  # noqa: S104 - refusing it
            raise ValueError("the responder binds to a specific fabric address, not a wildcard")
        self.address = address
        self.port = port
        self.limits = limits or ResponderLimits()
        self.stats = ResponderStats()
        self._udp: socket.socket | None = None
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._buffer = bytearray(_MAX_UDP + 1)
        self._limiter = _RateLimiter(
            self.limits.per_source_pps,
            self.limits.per_source_burst,
            self.limits.global_pps,
            self.limits.global_burst,
            self.limits.max_sources,
        )
        self._sink = _SinkState(self)

    @property
    def udp_port(self) -> int:
        if self._udp is None:
            raise RuntimeError("responder not started")
        return int(self._udp.getsockname()[1])

    @property
    def tcp_port(self) -> int:
        if self._server is None:
            raise RuntimeError("responder not started")
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        # Port 0 lets the kernel pick the UDP port, and the TCP sink must take the same number;
        # another socket may already hold it for TCP, so a picked port is tried a few times.
        attempts = _PICK_ATTEMPTS if self.port == 0 else 1
        for attempt in range(attempts):
            try:
                await self._start_once()
                return
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _start_once(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        family = family_of(self.address)
        udp = socket.socket(family, socket.SOCK_DGRAM)
        try:
            udp.setblocking(False)
            with contextlib.suppress(OSError):
                udp.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            with contextlib.suppress(OSError):
                udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            udp.bind((self.address, self.port))
        except OSError:
            udp.close()
            raise
        self._udp = udp
        loop.add_reader(udp.fileno(), self._on_udp)
        try:
            self._server = await loop.create_server(
                lambda: _SinkProtocol(self._sink),
                host=self.address,
                port=self.udp_port,  # same number as UDP
                family=family,
                reuse_address=True,
                backlog=self.limits.max_connections * 2,
            )
        except OSError:
            self._close_udp()
            raise
        log.info("peer responder on %s udp/%d tcp/%d", self.address, self.udp_port, self.tcp_port)

    async def close(self) -> None:
        self._close_udp()
        server, self._server = self._server, None
        if server is not None:
            server.close()
            self._sink.abort_all()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2.0)

    async def __aenter__(self) -> PeerResponder:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _close_udp(self) -> None:
        udp, self._udp = self._udp, None
        if udp is not None:
            if self._loop is not None:
                self._loop.remove_reader(udp.fileno())
            udp.close()

    # -- UDP ---------------------------------------------------------------------------------

    def _on_udp(self) -> None:
        udp = self._udp
        if udp is None:
            return
        view = memoryview(self._buffer)
        for _ in range(_BATCH):
            try:
                nbytes, ancdata, _flags, source = udp.recvmsg_into([view], 64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. a queued ICMP error for an earlier reply: ignore
                if exc.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH):
                    continue
                log.debug("peer responder recv: %s", exc)
                return
            self._answer(udp, nbytes, ancdata, source)

    def _answer(
        self,
        udp: socket.socket,
        nbytes: int,
        ancdata: list[tuple[int, int, bytes]],
        source: tuple[str, int] | tuple[str, int, int, int],
    ) -> None:
        if nbytes < UDP_HEADER.size or nbytes > self.limits.max_datagram:
            self.stats.udp_malformed += 1
            return
        magic, kind, _flags, _res, seq, token, _size, _ta = UDP_HEADER.unpack_from(self._buffer)
        reply_kind = _REPLY_KIND.get(kind)
        if magic != UDP_MAGIC or reply_kind is None:
            self.stats.udp_malformed += 1
            return
        if not self._limiter.allow(source[0], time.monotonic()):
            self.stats.udp_rate_limited += 1
            return
        received = kernel_timestamp_ns(ancdata)
        turnaround = max(0, time.time_ns() - received) if received is not None else 0
        reply = UDP_HEADER.pack(UDP_MAGIC, reply_kind, 0, 0, seq, token, nbytes, turnaround)
        try:
            udp.sendto(reply, source)
        except OSError:
            self.stats.udp_send_failures += 1
            return
        self.stats.udp_replies += 1


# -- TCP sink ---------------------------------------------------------------------------------


class _SinkState:
    """Shared by all sink connections: limits, counters, the discard buffer."""

    def __init__(self, responder: PeerResponder) -> None:
        self.responder = responder
        self.limits = responder.limits
        self.stats = responder.stats
        self.buffer = bytearray(1 << 18)
        self.active: set[_SinkProtocol] = set()
        self.per_source: dict[str, int] = {}
        self.rate = _RateLimiter(
            self.limits.connections_per_source_per_minute / 60.0,
            max(1.0, self.limits.connections_per_source_per_minute / 4),
            1e9,
            1e9,
            self.limits.max_sources,
        )

    def admit(self, proto: _SinkProtocol, source: str) -> bool:
        limits = self.limits
        if (
            len(self.active) >= limits.max_connections
            or self.per_source.get(source, 0) >= limits.max_connections_per_source
            or not self.rate.allow(source, time.monotonic())
        ):
            self.stats.tcp_refused += 1
            return False
        self.active.add(proto)
        self.per_source[source] = self.per_source.get(source, 0) + 1
        return True

    def release(self, proto: _SinkProtocol, source: str) -> None:
        if proto in self.active:
            self.active.discard(proto)
            left = self.per_source.get(source, 1) - 1
            if left > 0:
                self.per_source[source] = left
            else:
                self.per_source.pop(source, None)

    def abort_all(self) -> None:
        for proto in list(self.active):
            proto.abort("responder closing")


class _SinkProtocol(asyncio.BufferedProtocol):
    def __init__(self, state: _SinkState) -> None:
        self.state = state
        self.transport: asyncio.Transport | None = None
        self.source = ""
        self.header = bytearray()
        self.token = 0
        self.received = 0
        self.first_ns = 0
        self.last_ns = 0
        self.admitted = False
        self.done = False
        self._timer: asyncio.TimerHandle | None = None
        self._hard: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.source = str(peer[0]) if peer else "?"
        if not self.state.admit(self, self.source):
            self.done = True
            transport.abort()
            return
        self.admitted = True
        transport.write(TCP_HELLO)
        loop = asyncio.get_running_loop()
        limits = self.state.limits
        self._timer = loop.call_later(limits.header_timeout, self.abort, "no header")
        self._hard = loop.call_later(limits.max_stream_seconds, self.abort, "stream too long")

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self.state.buffer)

    def buffer_updated(self, nbytes: int) -> None:
        if self.done:
            return
        now = time.perf_counter_ns()
        data = memoryview(self.state.buffer)[:nbytes]
        if len(self.header) < TCP_HEADER.size:
            need = TCP_HEADER.size - len(self.header)
            self.header += data[:need]
            data = data[need:]
            if len(self.header) < TCP_HEADER.size:
                return
            magic, self.token, _res = TCP_HEADER.unpack(self.header)
            if magic != TCP_MAGIC:
                self.abort("bad header")
                return
            self.first_ns = now
        self.received += len(data)
        self.last_ns = now
        if self.received > self.state.limits.max_stream_bytes:
            self.abort("byte cap reached")
            return
        self._rearm()

    def _rearm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.state.limits.idle_timeout, self.abort, "idle")

    def eof_received(self) -> bool | None:
        if self.done or len(self.header) < TCP_HEADER.size:
            self.abort("eof before header")
            return None
        self.done = True
        self._cancel_timers()
        elapsed = max(0, time.perf_counter_ns() - self.first_ns)
        self.state.stats.tcp_streams += 1
        self.state.stats.tcp_bytes += self.received
        assert self.transport is not None
        self.transport.write(TCP_RESULT.pack(TCP_MAGIC, self.token, self.received, elapsed))
        self.transport.close()
        return None

    def abort(self, why: str) -> None:
        if self.transport is not None and not self.transport.is_closing():
            log.debug("peer sink: aborting stream from %s: %s", self.source, why)
            self.state.stats.tcp_aborted += 1
            self.transport.abort()
        self.done = True
        self._cancel_timers()

    def _cancel_timers(self) -> None:
        for handle in (self._timer, self._hard):
            if handle is not None:
                handle.cancel()
        self._timer = self._hard = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        if self.admitted:
            self.state.release(self, self.source)
