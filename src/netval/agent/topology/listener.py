"""LLDP frames received by the agent itself: one AF_PACKET socket for ETH_P_LLDP.

One `SOCK_DGRAM` packet socket on all interfaces (the kernel strips the Ethernet header and
names the receiving netdev); `PACKET_ORIGDEV` names the bond slave a frame arrived on, not
the bond, since LLDP is per physical port. Each watched netdev joins the LLDP multicast group
(`PACKET_ADD_MEMBERSHIP`) so a NIC that filters multicast still passes the frames up.

Opening it needs CAP_NET_RAW; without it the listener says so and discovery falls back to a
local lldpd (docs/topology.md, "Privileges"). The table is bounded: neighbours of watched
netdevs only, a few per netdev, each kept for the TTL its frame announced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
from collections.abc import Callable, Iterable
from typing import Final

from netval.agent.topology.lldp_frames import ETH_P_LLDP, LLDP_MULTICAST, parse_lldpdu
from netval.model.topology import (
    MAX_NEIGHBOURS_PER_INTERFACE,
    MAX_TOPOLOGY_INTERFACES,
    LldpNeighbour,
)

log = logging.getLogger("netval.agent.topology")

SOL_PACKET: Final = 263
PACKET_ADD_MEMBERSHIP: Final = 1
PACKET_MR_MULTICAST: Final = 0
PACKET_ORIGDEV: Final = 9
PACKET_OUTGOING: Final = 4
# Frames read per wake-up: a flood of LLDP frames costs a bounded slice of the loop.
MAX_FRAMES_PER_WAKE: Final = 64
MAX_FRAME: Final = 1500


class LldpListener:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._sock: socket.socket | None = None
        self._watched: set[str] = set()
        self._joined: dict[str, int] = {}  # netdev -> the ifindex it joined with
        # netdev -> (chassis id, port id) -> (neighbour, expires at)
        self._seen: dict[str, dict[tuple[str, str], tuple[LldpNeighbour, float]]] = {}
        self.started_at: float | None = None
        self.frames = 0
        self.invalid = 0
        self.error: str | None = None

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> bool:
        """Open the socket and read it on `loop`; False (with `error` set) when it cannot."""
        try:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_LLDP))
        except PermissionError:
            self.error = "no CAP_NET_RAW: cannot open an AF_PACKET socket for LLDP frames"
            return False
        except OSError as exc:
            self.error = f"cannot open an AF_PACKET socket for LLDP frames: {exc.strerror}"
            return False
        sock.setsockopt(SOL_PACKET, PACKET_ORIGDEV, 1)
        sock.setblocking(False)
        self._sock = sock
        self.started_at = self._clock()
        (loop or asyncio.get_running_loop()).add_reader(sock.fileno(), self._drain)
        self._join(self._watched)
        return True

    @property
    def listening(self) -> bool:
        return self._sock is not None

    def listening_for(self) -> float:
        return 0.0 if self.started_at is None else self._clock() - self.started_at

    def watch(self, netdevs: Iterable[str]) -> None:
        """Keep neighbours of these netdevs (and join the LLDP group on each)."""
        wanted = set(list(dict.fromkeys(netdevs))[:MAX_TOPOLOGY_INTERFACES])
        for gone in set(self._seen) - wanted:
            del self._seen[gone]
        self._watched = wanted
        self._join(wanted)

    def _join(self, netdevs: Iterable[str]) -> None:
        if self._sock is None:
            return
        for name in netdevs:
            try:
                # a netdev re-created under the same name (recabled, driver reload) is a new
                # ifindex with no membership
                index = socket.if_nametoindex(name)
                if self._joined.get(name) == index:
                    continue
                mreq = struct.pack("iHH8s", index, PACKET_MR_MULTICAST, 6, LLDP_MULTICAST)
                self._sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
                self._joined[name] = index
            except OSError as exc:
                # A netdev that is gone or renamed: its neighbour reads "none seen".
                log.debug("cannot join the LLDP group on %s: %s", name, exc)

    def neighbours(self, netdev: str) -> list[LldpNeighbour]:
        """The unexpired neighbours of `netdev`, the newest first."""
        now = self._clock()
        table = self._seen.get(netdev, {})
        for key in [k for k, (_, expires) in table.items() if expires <= now]:
            del table[key]
        newest = sorted(table.values(), key=lambda item: item[1], reverse=True)
        return [n for n, _ in newest]

    def _drain(self) -> None:
        assert self._sock is not None
        for _ in range(MAX_FRAMES_PER_WAKE):
            try:
                payload, address = self._sock.recvfrom(MAX_FRAME)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("LLDP socket read failed: %s", exc)
                return
            self.on_frame(str(address[0]), payload, pkttype=int(address[2]))

    def on_frame(self, netdev: str, payload: bytes, *, pkttype: int = 0) -> None:
        """One received LLDPDU (frames this host sends are seen too, and ignored)."""
        if pkttype == PACKET_OUTGOING or netdev not in self._watched:
            return
        self.frames += 1
        neighbour = parse_lldpdu(payload)
        if neighbour is None:
            self.invalid += 1
            return
        table = self._seen.setdefault(netdev, {})
        key = (neighbour.chassis_id, neighbour.port_id)
        if neighbour.ttl_seconds == 0:  # a shutdown LLDPDU: forget it now
            table.pop(key, None)
            return
        table.pop(key, None)
        table[key] = (neighbour, self._clock() + neighbour.ttl_seconds)
        while len(table) > MAX_NEIGHBOURS_PER_INTERFACE:
            del table[min(table, key=lambda k: table[k][1])]

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(RuntimeError):  # no loop running: nothing to remove
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None


__all__ = ["LldpListener"]
