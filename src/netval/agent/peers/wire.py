"""The east-west wire format, shared by the responder and the probes that talk to it.

UDP request and reply alike (network byte order)::

    magic "NVP1" | kind u8 | flags u8 | reserved u16 | seq u32 | token u64 |
    size u32 (reply: bytes received) | turnaround_ns u64 (reply: rx->tx time in the responder)

TCP: the sink greets first with ``TCP_HELLO`` (the client streams nothing to a port that is
not a netval sink: an announced endpoint is untrusted); the client sends ``"NVT1" | token u64
| reserved u32`` then data, then half-closes; the sink answers ``"NVT1" | token u64 | bytes u64 (after the header) | elapsed_ns u64`` (first
byte to EOF, measured at the receiver) and closes. Any other magic is refused: load tests
bring their own engines (`netval.agent.loadtest`), never this sink.
"""

from __future__ import annotations

import socket
import struct
from typing import Final

UDP_MAGIC: Final = b"NVP1"
TCP_MAGIC: Final = b"NVT1"
KIND_PING: Final = 1
KIND_PONG: Final = 2
KIND_MTU: Final = 3
KIND_MTU_ACK: Final = 4
UDP_HEADER: Final = struct.Struct("!4sBBHIQIQ")  # 32 bytes
TCP_HEADER: Final = struct.Struct("!4sQI")  # 16 bytes
TCP_RESULT: Final = struct.Struct("!4sQQQ")  # 28 bytes
TCP_HELLO: Final = TCP_HEADER.pack(TCP_MAGIC, 0, 1)  # the sink's greeting, 16 bytes


# Linux socket options the stdlib does not name (uapi asm-generic/socket.h, linux/in.h).
SO_TIMESTAMPNS: Final = int(getattr(socket, "SO_TIMESTAMPNS", 35))
_TIMESPEC: Final = struct.Struct("@qq")


def kernel_timestamp_ns(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    """CLOCK_REALTIME receive time from an SCM_TIMESTAMPNS control message, if present."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            return int(sec) * 1_000_000_000 + int(nsec)
    return None


def family_of(address: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in address else socket.AF_INET
