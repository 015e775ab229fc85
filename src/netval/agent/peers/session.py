"""The UDP session of the echo and path-MTU probes: one connected socket per peer per cycle.

DF is set (IP_MTU_DISCOVER = IP_PMTUDISC_DO, the kernel never fragments), ICMP errors are
queued on the socket (IP_RECVERR: fragmentation-needed with the next-hop MTU) and IP_MTU tells
the kernel's path MTU for the connected destination; replies carry the kernel's receive
timestamp (SO_TIMESTAMPNS). No raw sockets, no privileges.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import secrets
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from netval.agent.peers.target import PeerTarget
from netval.agent.peers.wire import (
    KIND_MTU_ACK,
    KIND_PONG,
    SO_TIMESTAMPNS,
    UDP_HEADER,
    UDP_MAGIC,
    family_of,
    kernel_timestamp_ns,
)

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


@dataclass(slots=True)
class IcmpNote:
    mtu: int | None = None  # from a fragmentation-needed / packet-too-big error
    offender: str | None = None
    origin: str = ""  # "icmp" or "local"


@dataclass(slots=True)
class UdpSession:
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
    icmp: IcmpNote = field(default_factory=IcmpNote)
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


def open_session(target: PeerTarget, source: str | None) -> UdpSession:
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
    session = UdpSession(target, sock, loop)
    loop.add_reader(sock.fileno(), session.readable)
    return session
