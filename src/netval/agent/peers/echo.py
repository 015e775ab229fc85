"""Probes from this node to one peer's responder (`netval.agent.peers.responder`).

- `probe_peer`: N UDP echoes (round-trip latency p50/p99, jitter, loss) and the path MTU,
  as `peer.latency`, `peer.loss` and `peer.path_mtu` results.
- `measure_throughput`: a short TCP stream to the peer's sink, bounded in bytes and time,
  as a `peer.throughput` result.

Latency uses the kernel's receive timestamp (SO_TIMESTAMPNS) and subtracts the responder's
own turnaround (its receive-to-send time, carried in the reply), so event-loop delays on
either side do not count as network latency. The verdict uses p50 (a Python agent's p99 on a
busy node is dominated by scheduling); p99 and jitter are reported.

Path MTU without raw sockets or privileges: one UDP socket with IP_MTU_DISCOVER =
IP_PMTUDISC_DO (DF set, the kernel never fragments), IP_RECVERR (ICMP errors are queued on
the socket, fragmentation-needed with the next-hop MTU) and IP_MTU (the kernel's path MTU
for the connected destination). A probe of the configured MTU (IP packet size) that the
responder acknowledges proves the path. Otherwise the kernel may know better (an ICMP
fragmentation-needed arrived now or earlier, or the local route/interface is smaller): that
size is verified with a probe. If nothing tells (a silent black hole: a switch or a bridge
drops the jumbo frame and sends no ICMP, while small echoes work), the largest acknowledged
size is searched with parallel rounds of DF probes (8 sizes per round, well-known MTUs
first).

Every network failure becomes a result, never an exception out of these functions.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import math
import os
import secrets
import socket
import statistics
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from pydantic import JsonValue

from netval.agent.peers.responder import (
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
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.model.spec import PeerChecks

# linux/in.h, linux/in6.h, linux/errqueue.h
IP_MTU_DISCOVER: Final = 10
IP_PMTUDISC_DO: Final = 2
IP_RECVERR: Final = 11
IP_MTU: Final = 14
IPV6_MTU_DISCOVER: Final = 23
IPV6_PMTUDISC_DO: Final = 2
IPV6_MTU: Final = 24
IPV6_RECVERR: Final = 25
SO_EE_ORIGIN_LOCAL: Final = 1
SO_EE_ORIGIN_ICMP: Final = 2
SO_EE_ORIGIN_ICMP6: Final = 3
_EXTENDED_ERR: Final = struct.Struct("=IBBBBII")  # struct sock_extended_err
MSG_ERRQUEUE: Final = int(getattr(socket, "MSG_ERRQUEUE", 0x2000))

IPV4_UDP_OVERHEAD: Final = 28  # IPv4 header 20 + UDP 8
IPV6_UDP_OVERHEAD: Final = 48
WELL_KNOWN_MTUS: Final = (1280, 1500, 2048, 4096, 4200, 8192, 9000)
_CHUNK: Final = 1 << 18
MIN_THROUGHPUT_BYTES: Final = 64 * 1024


@dataclass(frozen=True, slots=True)
class PeerTarget:
    node: str
    address: str
    port: int
    domain: str | None = None


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    count: int = 50  # echoes per peer per cycle
    spacing: float = 0.005  # seconds between echoes
    echo_size: int = 64  # UDP payload bytes of an echo
    reply_timeout: float = 0.5  # seconds to wait for replies after the last echo
    mtu_tries: int = 2  # copies of each DF probe size
    mtu_rounds: int = 8  # search rounds (8 sizes each) for a silent black hole
    mtu_wait_min: float = 0.05
    mtu_wait_max: float = 0.3
    throughput_seconds: float = 1.0  # sending time of one throughput sample
    throughput_max_bytes: int = 1 << 30
    throughput_timeout: float = 3.0  # connect / per-operation / final answer bound

    def __post_init__(self) -> None:
        if self.count < 1 or self.spacing < 0 or self.reply_timeout <= 0:
            raise ValueError("count >= 1, spacing >= 0 and reply_timeout > 0 are required")
        if self.echo_size < UDP_HEADER.size or self.echo_size > 1024:
            raise ValueError(f"echo_size must be in {UDP_HEADER.size}..1024")
        if self.throughput_seconds <= 0 or self.throughput_max_bytes < MIN_THROUGHPUT_BYTES:
            raise ValueError("throughput_seconds > 0 and throughput_max_bytes >= 64 KiB required")


# -- the UDP session: one connected socket per peer per cycle ------------------------------


@dataclass(slots=True)
class _IcmpNote:
    mtu: int | None = None  # from a fragmentation-needed / packet-too-big error
    offender: str | None = None
    origin: str = ""  # "icmp" or "local"


@dataclass(slots=True)
class _Session:
    target: PeerTarget
    sock: socket.socket
    loop: asyncio.AbstractEventLoop
    token: int = field(default_factory=lambda: secrets.randbits(64))
    seq: int = 0
    sent: dict[int, int] = field(default_factory=dict)  # seq -> send time (ns, realtime)
    pongs: dict[int, int] = field(default_factory=dict)  # seq -> rtt ns
    acks: dict[int, int] = field(default_factory=dict)  # seq -> size the responder got
    errors: dict[str, int] = field(default_factory=dict)  # strerror -> count
    refused: bool = False
    emsgsize: bool = False
    icmp: _IcmpNote = field(default_factory=_IcmpNote)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def v6(self) -> bool:
        return self.sock.family == socket.AF_INET6

    @property
    def overhead(self) -> int:
        return IPV6_UDP_OVERHEAD if self.v6 else IPV4_UDP_OVERHEAD

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def send(self, kind: int, seq: int, payload_size: int) -> OSError | None:
        header = UDP_HEADER.pack(UDP_MAGIC, kind, 0, 0, seq, self.token, 0, 0)
        data = header + bytes(max(0, payload_size - len(header)))
        self.sent[seq] = time.time_ns()
        try:
            self.sock.send(data)
        except OSError as exc:
            self._note_error(exc)
            return exc
        return None

    def _note_error(self, exc: OSError) -> None:
        if exc.errno == errno.ECONNREFUSED:
            self.refused = True
        elif exc.errno == errno.EMSGSIZE:
            self.emsgsize = True
        reason = exc.strerror or str(exc)
        self.errors[reason] = self.errors.get(reason, 0) + 1

    def readable(self) -> None:
        for _ in range(256):
            try:
                data, ancdata, _flags, _addr = self.sock.recvmsg(UDP_HEADER.size, 64)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:  # a pending ICMP error (sk_err): note it and drain below
                self._note_error(exc)
                self._drain_errqueue()
                continue
            now = kernel_timestamp_ns(ancdata) or time.time_ns()
            self._reply(data, now)
        self._drain_errqueue()

    def _reply(self, data: bytes, received_ns: int) -> None:
        if len(data) < UDP_HEADER.size:
            return
        magic, kind, _f, _r, seq, token, size, turnaround = UDP_HEADER.unpack_from(data)
        if magic != UDP_MAGIC or token != self.token or seq not in self.sent:
            return
        if kind == KIND_PONG and seq not in self.pongs:
            rtt = received_ns - self.sent[seq] - turnaround
            self.pongs[seq] = max(rtt, 1)
        elif kind == KIND_MTU_ACK:
            self.acks[seq] = size
        self.arrived.set()

    def _drain_errqueue(self) -> None:
        for _ in range(64):
            try:
                _data, ancdata, _flags, _addr = self.sock.recvmsg(64, 512, MSG_ERRQUEUE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            for level, kind, payload in ancdata:
                ok = (level, kind) in (
                    (socket.IPPROTO_IP, IP_RECVERR),
                    (socket.IPPROTO_IPV6, IPV6_RECVERR),
                )
                if ok and len(payload) >= _EXTENDED_ERR.size:
                    self._extended_error(payload)

    def _extended_error(self, payload: bytes) -> None:
        ee_errno, origin, _type, _code, _pad, info, _data = _EXTENDED_ERR.unpack_from(payload)
        if ee_errno == errno.ECONNREFUSED:
            self.refused = True
        if ee_errno != errno.EMSGSIZE:
            return
        self.emsgsize = True
        if info > 0:
            self.icmp.mtu = int(info) if self.icmp.mtu is None else min(self.icmp.mtu, int(info))
        if origin in (SO_EE_ORIGIN_ICMP, SO_EE_ORIGIN_ICMP6):
            self.icmp.origin = "icmp"
            self.icmp.offender = _offender(payload[_EXTENDED_ERR.size :])
        elif not self.icmp.origin:
            self.icmp.origin = "local"

    def kernel_path_mtu(self) -> int | None:
        level, option = (socket.IPPROTO_IPV6, IPV6_MTU) if self.v6 else (socket.IPPROTO_IP, IP_MTU)
        try:
            return int(self.sock.getsockopt(level, option))
        except OSError:
            return None

    async def wait(self, done: Callable[[], bool], timeout: float) -> None:  # noqa: ASYNC109
        """Wait until `done()` or `timeout` seconds."""
        deadline = self.loop.time() + timeout
        while not done():
            left = deadline - self.loop.time()
            if left <= 0:
                return
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), left)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()


def _offender(sockaddr: bytes) -> str | None:
    if len(sockaddr) >= 8 and int.from_bytes(sockaddr[:2], "little") == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, sockaddr[4:8])
    if len(sockaddr) >= 24 and int.from_bytes(sockaddr[:2], "little") == socket.AF_INET6:
        return socket.inet_ntop(socket.AF_INET6, sockaddr[8:24])
    return None


def _open_session(target: PeerTarget, source: str | None) -> _Session:
    family = family_of(target.address)
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO)
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVERR, 1)
        else:
            sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
            sock.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        if source:
            sock.bind((source, 0))
        sock.connect((target.address, target.port))
    except OSError:
        sock.close()
        raise
    loop = asyncio.get_running_loop()
    session = _Session(target, sock, loop)
    loop.add_reader(sock.fileno(), session.readable)
    return session


# -- echoes ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Echoes:
    sent: int
    rtts_ms: list[float]  # in send order

    @property
    def received(self) -> int:
        return len(self.rtts_ms)

    @property
    def loss_percent(self) -> float:
        return 100.0 * (self.sent - self.received) / self.sent


async def _echoes(session: _Session, settings: ProbeSettings) -> _Echoes:
    seqs: list[int] = []
    for i in range(settings.count):
        seq = session.next_seq()
        seqs.append(seq)
        session.send(KIND_PING, seq, settings.echo_size)
        if i + 1 < settings.count:
            await asyncio.sleep(settings.spacing)
    await session.wait(lambda: all(s in session.pongs for s in seqs), settings.reply_timeout)
    rtts = [session.pongs[s] / 1e6 for s in seqs if s in session.pongs]
    return _Echoes(sent=len(seqs), rtts_ms=rtts)


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def jitter(values: Sequence[float]) -> float:
    """Mean absolute difference of consecutive round trips (RFC 3550 style, unsmoothed)."""
    if len(values) < 2:
        return 0.0
    return statistics.fmean(abs(b - a) for a, b in itertools.pairwise(values))


# -- path MTU ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _PathMtu:
    path_mtu: int | None  # largest IP packet size proven (or reported) to cross
    method: str  # echo | kernel | blackhole
    detail: str = ""


async def _probe_sizes(
    session: _Session, sizes: Sequence[int], settings: ProbeSettings, wait: float
) -> set[int]:
    """Send DF probes of these IP packet sizes; the sizes the responder acknowledged."""
    by_seq: dict[int, int] = {}
    for size in sizes:
        for _ in range(settings.mtu_tries):
            seq = session.next_seq()
            error = session.send(KIND_MTU, seq, size - session.overhead)
            if error is None:
                by_seq[seq] = size
            elif error.errno == errno.EMSGSIZE:
                break  # the kernel already knows it does not fit; no point repeating

    def all_sizes_answered() -> bool:
        got = {by_seq[s] for s in session.acks if s in by_seq}
        return got >= set(by_seq.values())

    if by_seq:
        await session.wait(all_sizes_answered, wait)
    return {by_seq[s] for s in session.acks if s in by_seq}


def _candidates(lo: int, hi: int, first: bool, k: int = 8) -> list[int]:
    """Up to k sizes strictly between lo and hi: well-known MTUs (first round) + even steps."""
    picks: list[int] = [m for m in WELL_KNOWN_MTUS if lo < m < hi] if first else []
    room = k - len(picks)
    span = hi - lo
    if room > 0 and span > 1:
        step = span / (room + 1)
        picks += [lo + round(step * (i + 1)) for i in range(room)]
    return sorted({p for p in picks if lo < p < hi})[: max(k, len(picks))]


async def _path_mtu(session: _Session, mtu: int, settings: ProbeSettings, wait: float) -> _PathMtu:
    smallest = session.overhead + UDP_HEADER.size
    if mtu <= smallest:
        return _PathMtu(mtu, "echo")
    if mtu in await _probe_sizes(session, [mtu], settings, wait):
        return _PathMtu(mtu, "echo")
    lo, hi = smallest, mtu
    kernel = session.icmp.mtu
    route = session.kernel_path_mtu()
    if route is not None and route < mtu:
        kernel = min(kernel, route) if kernel is not None else route
    if kernel is not None and smallest < kernel < mtu:
        if kernel in await _probe_sizes(session, [kernel], settings, wait):
            return _PathMtu(kernel, "kernel", _kernel_source(session))
        hi = kernel
    first = True
    for _ in range(settings.mtu_rounds):
        if hi - lo <= 1:
            break
        sizes = _candidates(lo, hi, first)
        first = False
        acked = await _probe_sizes(session, sizes, settings, wait)
        lo = max([lo, *acked])
        hi = min([hi, *(s for s in sizes if s > lo and s not in acked)])
    if session.icmp.mtu is not None and session.icmp.origin == "icmp":
        return _PathMtu(lo, "kernel", _kernel_source(session))
    return _PathMtu(lo, "blackhole")


def _kernel_source(session: _Session) -> str:
    if session.icmp.origin == "icmp":
        who = f" from {session.icmp.offender}" if session.icmp.offender else ""
        return f"ICMP fragmentation-needed{who}"
    return "the route to it (a path MTU learned earlier, or this node's interface MTU)"


# -- results ---------------------------------------------------------------------------------


def _result(
    check: CheckId,
    target: PeerTarget,
    status: Status,
    message: str,
    observed: dict[str, JsonValue] | None = None,
    expected: dict[str, JsonValue] | None = None,
) -> CheckResult:
    base: dict[str, JsonValue] = {"domain": target.domain, "address": target.address}
    return CheckResult(
        check=check,
        subject=target.node,
        status=status,
        message=message[:1024],
        observed={**base, **(observed or {})},
        expected=expected or {},
    )


def _where(target: PeerTarget) -> str:
    return f"{target.node} ({target.address}:{target.port})"


def _ms(value: float) -> float:
    return round(value, 4)


def _failure_results(
    target: PeerTarget, checks: PeerChecks, mtu: int, status: Status, why: str, sent: int
) -> list[CheckResult]:
    return [
        _result(
            CheckId.PEER_LATENCY,
            target,
            status,
            why,
            {"sent": sent, "received": 0},
            {"maxLatencyMs": checks.max_latency_ms},
        ),
        _result(
            CheckId.PEER_LOSS,
            target,
            status,
            why,
            {"lossPercent": 100.0, "sent": sent, "received": 0},
            {"maxLossPercent": checks.max_loss_percent},
        ),
        _result(
            CheckId.PEER_PATH_MTU,
            target,
            Status.SKIP,
            "not measured: the peer does not answer echoes",
            expected={"pathMTU": mtu},
        ),
    ]


def _unanswered(session: _Session, settings: ProbeSettings) -> tuple[Status, str]:
    where = _where(session.target)
    if session.refused:
        return (
            Status.ERROR,
            f"no echo from {where}: port unreachable (ICMP), the peer's netval responder is "
            "not running",
        )
    if session.errors:
        reasons = ", ".join(f"{k} x{v}" for k, v in sorted(session.errors.items()))
        return Status.FAIL, f"cannot reach {where}: {reasons}"
    return (
        Status.FAIL,
        f"unreachable: none of {settings.count} echoes to {where} answered within "
        f"{settings.reply_timeout:g} s",
    )


def _latency_result(target: PeerTarget, checks: PeerChecks, echoes: _Echoes) -> CheckResult:
    rtts = echoes.rtts_ms
    p50, p99 = statistics.median(rtts), percentile(rtts, 99)
    observed: dict[str, JsonValue] = {
        "p50Ms": _ms(p50),
        "p99Ms": _ms(p99),
        "jitterMs": _ms(jitter(rtts)),
        "minMs": _ms(min(rtts)),
        "maxMs": _ms(max(rtts)),
        "samples": len(rtts),
    }
    limit = checks.max_latency_ms
    too_slow = p50 > limit
    summary = (
        f"round trip to {target.node}: p50 {p50:.3f} ms, p99 {p99:.3f} ms, jitter "
        f"{jitter(rtts):.3f} ms over {len(rtts)} echoes"
    )
    return _result(
        CheckId.PEER_LATENCY,
        target,
        Status.FAIL if too_slow else Status.PASS,
        f"{summary}; p50 {'exceeds' if too_slow else 'within'} the maximum of {limit:g} ms",
        observed,
        {"maxLatencyMs": limit},
    )


def _loss_result(target: PeerTarget, checks: PeerChecks, echoes: _Echoes) -> CheckResult:
    loss = echoes.loss_percent
    limit = checks.max_loss_percent
    bad = loss > limit
    return _result(
        CheckId.PEER_LOSS,
        target,
        Status.FAIL if bad else Status.PASS,
        f"{echoes.sent - echoes.received} of {echoes.sent} echoes to {target.node} lost "
        f"({loss:.2f}%); {'above' if bad else 'within'} the maximum of {limit:g}%",
        {"lossPercent": round(loss, 3), "sent": echoes.sent, "received": echoes.received},
        {"maxLossPercent": limit},
    )


def _mtu_result(target: PeerTarget, mtu: int, found: _PathMtu) -> CheckResult:
    expected: dict[str, JsonValue] = {"pathMTU": mtu}
    observed: dict[str, JsonValue] = {"pathMTU": found.path_mtu, "method": found.method}
    if found.path_mtu is not None and found.path_mtu >= mtu:
        return _result(
            CheckId.PEER_PATH_MTU,
            target,
            Status.PASS,
            f"a {mtu}-byte DF packet reached {target.node} and was acknowledged",
            observed,
            expected,
        )
    size = found.path_mtu
    if found.method == "kernel":
        why = (
            f"path MTU to {target.node} is {size}, expected {mtu} "
            f"(reported by {found.detail}; a {size}-byte DF probe was acknowledged)"
        )
    else:
        why = (
            f"{mtu}-byte packets to {target.node} vanish without an ICMP "
            f"fragmentation-needed (an MTU black hole): the largest DF probe acknowledged "
            f"was {size} bytes, expected {mtu}"
        )
    return _result(CheckId.PEER_PATH_MTU, target, Status.FAIL, why, observed, expected)


async def probe_peer(
    target: PeerTarget,
    *,
    checks: PeerChecks,
    mtu: int,
    source: str | None = None,
    settings: ProbeSettings | None = None,
) -> list[CheckResult]:
    """`peer.latency`, `peer.loss`, `peer.path_mtu` for one peer, in that order.

    `mtu` is the configured fabric MTU (IP packet size); `source` the local fabric address
    to send from. Never raises for network problems.
    """
    settings = settings or ProbeSettings()
    try:
        session = _open_session(target, source)
    except OSError as exc:
        why = f"cannot open a socket to {_where(target)}: {exc.strerror or exc}"
        return _failure_results(target, checks, mtu, Status.FAIL, why, 0)
    try:
        echoes = await _echoes(session, settings)
        if echoes.received == 0:
            status, why = _unanswered(session, settings)
            return _failure_results(target, checks, mtu, status, why, echoes.sent)
        wait = min(
            settings.mtu_wait_max,
            max(settings.mtu_wait_min, 10 * percentile(echoes.rtts_ms, 99) / 1e3),
        )
        found = await _path_mtu(session, mtu, settings, wait)
        return [
            _latency_result(target, checks, echoes),
            _loss_result(target, checks, echoes),
            _mtu_result(target, mtu, found),
        ]
    finally:
        session.close()


# -- throughput ------------------------------------------------------------------------------


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
        return _result(
            CheckId.PEER_THROUGHPUT,
            target,
            Status.FAIL,
            f"could not measure throughput to {_where(target)}: {why or type(exc).__name__}",
            expected=expected,
        )
    if sample.bytes < MIN_THROUGHPUT_BYTES:
        return _result(
            CheckId.PEER_THROUGHPUT,
            target,
            Status.FAIL,
            f"could not measure throughput to {_where(target)}: only {sample.bytes} bytes arrived",
            {"bytes": sample.bytes},
            expected,
        )
    return _result(
        CheckId.PEER_THROUGHPUT,
        target,
        Status.PASS,
        f"{sample.mbps:.1f} Mbit/s to {target.node} ({sample.bytes} bytes in "
        f"{sample.seconds:.3f} s, one TCP stream; judged as a cross/intra-domain ratio by "
        "the operator)",
        {"mbps": round(sample.mbps, 3), "bytes": sample.bytes, "seconds": round(sample.seconds, 4)},
        expected,
    )
