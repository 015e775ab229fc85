"""The L3 path of a fabric netdev, for routed (L3 to the ToR) fabrics where LLDP may be off:
the netdev's next-hop router from the routing table, and the router hops toward a peer from
TTL-limited UDP probes whose ICMP errors are read through `IP_RECVERR`, as `tracepath`
does: unprivileged, no raw socket.

Each probe goes to a high UDP port of the destination with TTL 1, 2, ...; a router that drops
it for its TTL answers ICMP time-exceeded (its address is the hop), and the destination answers
port-unreachable (reached). The kernel queues both on the socket's error queue
(`MSG_ERRQUEUE`) with the offender's address after the `sock_extended_err`.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

IP_RECVERR: Final = 11
SO_EE_ORIGIN_ICMP: Final = 2
ICMP_DEST_UNREACH: Final = 3
ICMP_TIME_EXCEEDED: Final = 11
RTF_UP: Final = 0x1
RTF_GATEWAY: Final = 0x2
BASE_PORT: Final = 33434  # traceroute's: nothing listens there
MAX_HOPS: Final = 8  # a GPU fabric is leaf-spine(-superspine): 3 routers, 5 with margin
_EXTENDED_ERR: Final = struct.Struct("=IBBBBII")  # struct sock_extended_err


def next_hops(route_table: str) -> dict[str, str]:
    """netdev -> its IPv4 next-hop router, from /proc/net/route text: the default route's
    gateway if the netdev has one, else its first gateway route. Pure, total."""
    default: dict[str, str] = {}
    other: dict[str, str] = {}
    for line in route_table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            destination, gateway, flags = (int(fields[i], 16) for i in (1, 2, 3))
            mask = int(fields[7], 16)
        except ValueError:
            continue
        if flags & (RTF_UP | RTF_GATEWAY) != (RTF_UP | RTF_GATEWAY) or not gateway:
            continue
        address = socket.inet_ntoa(struct.pack("<I", gateway & 0xFFFFFFFF))
        table = default if destination == 0 and mask == 0 else other
        table.setdefault(fields[0][:15], address)
    return {**other, **default}


def read_next_hops(path: str = "/proc/net/route") -> dict[str, str]:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return next_hops(f.read(1 << 20))
    except OSError:
        return {}


@dataclass(frozen=True, slots=True)
class Trace:
    destination: str
    hops: tuple[str | None, ...]  # one per TTL; None: no answer within the timeout
    reached: bool


def parse_error(ancillary: Iterable[tuple[int, int, bytes]]) -> tuple[str, int, int] | None:
    """(offender address, ICMP type, ICMP code) of an IP_RECVERR control message."""
    for level, kind, data in ancillary:
        if level != socket.IPPROTO_IP or kind != IP_RECVERR or len(data) < _EXTENDED_ERR.size:
            continue
        _errno, origin, icmp_type, code, _pad, _info, _data = _EXTENDED_ERR.unpack_from(data)
        if origin != SO_EE_ORIGIN_ICMP:
            continue
        offender = data[_EXTENDED_ERR.size : _EXTENDED_ERR.size + 16]
        if len(offender) < 8 or int.from_bytes(offender[:2], "little") != socket.AF_INET:
            continue
        return socket.inet_ntoa(offender[4:8]), icmp_type, code
    return None


def trace(
    destination: str,
    *,
    source: str | None = None,
    max_hops: int = MAX_HOPS,
    wait: float = 0.5,
) -> Trace:
    """Blocking (run it in a thread): one probe per TTL until the destination answers."""
    hops: list[str | None] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
        if source is not None:
            sock.bind((source, 0))
        poller = select.poll()
        poller.register(sock, select.POLLERR)
        for ttl in range(1, max_hops + 1):
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
            with contextlib.suppress(OSError):  # an earlier error surfaces on send: read below
                sock.sendto(b"netval-topology", (destination, BASE_PORT + ttl))
            answer = None
            if poller.poll(int(wait * 1000)):
                try:
                    _, ancillary, _, _ = sock.recvmsg(512, 512, socket.MSG_ERRQUEUE)
                    answer = parse_error(ancillary)
                except (BlockingIOError, InterruptedError):
                    answer = None
            if answer is None:
                hops.append(None)
                continue
            address, icmp_type, _code = answer
            if icmp_type == ICMP_DEST_UNREACH and address == destination:
                return Trace(destination, tuple(hops), True)
            hops.append(address)
            if icmp_type != ICMP_TIME_EXCEEDED:
                break  # unreachable from a router: no further hop will answer
    return Trace(destination, tuple(hops), False)


__all__ = ["Trace", "next_hops", "parse_error", "read_next_hops", "trace"]
