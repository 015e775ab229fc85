"""Netlink link events: notice a judged interface losing carrier or changing MTU at once.

Interval polling finds a dead link only at the next cycle; the kernel announces it on the
RTMGRP_LINK multicast group immediately. The kernel sends RTM_NEWLINK for many reasons
(flags, stats, promiscuity), so only a change of carrier, MTU or operstate against the last
known state of a watched interface counts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from pyroute2 import AsyncIPRoute
from pyroute2.netlink.rtnl import RTMGRP_LINK

from netval.model.snapshot import Netdev

log = logging.getLogger("netval.agent.links")
RETRY_SECONDS: Final = 5.0


@dataclass(frozen=True, slots=True)
class LinkState:
    carrier: int
    mtu: int | None
    operstate: str

    @classmethod
    def of_netdev(cls, netdev: Netdev) -> LinkState:
        # sysfs refuses carrier reads on an admin-down link; netlink says 0
        return cls(netdev.carrier or 0, netdev.mtu, (netdev.operstate or "unknown").lower())


class LinkWatcher:
    def __init__(self, on_change: Callable[[str, LinkState, LinkState | None], None]) -> None:
        self._on_change = on_change
        self.known: dict[str, LinkState] = {}
        self.events_seen = 0

    def remember(self, netdevs: dict[str, Netdev]) -> None:
        """Adopt the collector's view: which interfaces to watch and their current state."""
        self.known = {name: LinkState.of_netdev(n) for name, n in netdevs.items()}

    def handle(self, msg: Any) -> None:
        name = msg.get_attr("IFLA_IFNAME")
        if name not in self.known:
            return
        self.events_seen += 1
        before = self.known[name]
        if msg.get("event") == "RTM_DELLINK":
            now = LinkState(0, before.mtu, "notpresent")
        else:
            now = LinkState(
                int(msg.get_attr("IFLA_CARRIER") or 0),
                msg.get_attr("IFLA_MTU"),
                str(msg.get_attr("IFLA_OPERSTATE") or "unknown").lower(),
            )
        if now != before:
            self.known[name] = now
            self._on_change(name, now, before)

    async def run(self) -> None:
        """Listen until cancelled; netlink trouble is logged and retried, never fatal."""
        while True:
            try:
                async with AsyncIPRoute() as ipr:
                    await ipr.bind(groups=RTMGRP_LINK)
                    log.info("listening for link events")
                    while True:
                        async for msg in ipr.get():
                            self.handle(msg)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("link event listener failed (%s); retrying in %ss", exc, RETRY_SECONDS)
                await asyncio.sleep(RETRY_SECONDS)
