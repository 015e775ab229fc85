"""The report's `topology` section: each judged fabric netdev's LLDP neighbour, or why none.

Sources, in order: frames the agent receives itself (`LldpListener`, needs CAP_NET_RAW),
then the node's lldpd (`lldpcli`) for netdevs the frames said nothing about. A netdev with
neither says why, with the usual cause named: NIC firmware that runs its own LLDP agent
consumes the frames before the host sees them (docs/topology.md, "None seen").
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Final

from netval.agent.checks.judged import judged_subjects
from netval.agent.topology.listener import LldpListener
from netval.agent.topology.lldpd import DEFAULT_SOCKET, lldpd_unavailable, query_lldpd
from netval.model.snapshot import Sample
from netval.model.spec import Checks
from netval.model.topology import (
    MAX_TOPOLOGY_INTERFACES,
    InterfaceTopology,
    LldpNeighbour,
    TopologyReport,
)

log = logging.getLogger("netval.agent.topology")

LLDPD_SOCKET_ENV: Final = "NETVAL_LLDPD_SOCKET"
# IEEE 802.1AB's default msgTxInterval: a listener younger than this may simply be early.
LLDP_TX_INTERVAL: Final = 30.0

# The knob that hands LLDP frames back to the host, by the netdev's driver.
_FIRMWARE_AGENT: Final = {
    "ice": "Intel E810 firmware LLDP agent: ethtool --set-priv-flags {ifname} fw-lldp-agent off",
    "i40e": "Intel 700-series firmware LLDP agent: "
    "ethtool --set-priv-flags {ifname} disable-fw-lldp on",
    "mlx5_core": "NVIDIA ConnectX firmware LLDP/DCBX (mlxconfig LLDP_NB_* settings; "
    "docs/topology.md)",
}
_GENERIC_CAUSE: Final = (
    "the switch port may not send LLDP, or NIC firmware takes the frames first "
    "(Intel E810: ethtool --set-priv-flags {ifname} fw-lldp-agent off; ConnectX: firmware "
    "LLDP/DCBX, see docs/topology.md)"
)


def fabric_netdevs(sample: Sample, checks: Checks) -> tuple[str, ...]:
    """The judged netdevs, a bond as its ports (LLDP runs per physical port)."""
    judged = judged_subjects(sample, checks)
    out: list[str] = []
    for name in judged.link_netdevs:
        netdev = sample.netdevs.get(name)
        out.extend(netdev.ports_below if netdev is not None and netdev.ports_below else (name,))
    return tuple(dict.fromkeys(out))[:MAX_TOPOLOGY_INTERFACES]


def none_reason(
    ifname: str, *, listened: float | None, lldpd: str | None, driver: str | None
) -> str:
    """Why `ifname` shows no neighbour: how long frames were awaited (None: not at all) and
    what lldpd said (None: it answered), with the firmware knob for its driver."""
    if listened is None:
        how = "no LLDP frames are read on this node"
    elif listened < LLDP_TX_INTERVAL:
        how = (
            f"no LLDP frame yet after {listened:.0f}s of listening "
            f"(switches send one every {LLDP_TX_INTERVAL:.0f}s by default)"
        )
    else:
        how = f"no LLDP frame in {listened:.0f}s of listening"
    if lldpd is not None:
        how += f"; lldpd: {lldpd}"
    cause = _FIRMWARE_AGENT.get(driver or "")
    cause = f"if the switch sends LLDP, check the {cause}" if cause else _GENERIC_CAUSE
    return f"{how}: {cause.format(ifname=ifname)}"


def topology_section(
    netdevs: Sequence[str],
    frames: Mapping[str, list[LldpNeighbour]],
    lldpd: Mapping[str, list[LldpNeighbour]],
    *,
    listened: float | None,
    lldpd_error: str | None,
    drivers: Mapping[str, str | None],
    unavailable: str | None = None,
) -> TopologyReport:
    """Pure: the section from what each source saw."""
    interfaces = []
    for name in netdevs[:MAX_TOPOLOGY_INTERFACES]:
        seen = frames.get(name) or lldpd.get(name) or []
        reason = None
        if not seen:
            reason = none_reason(
                name, listened=listened, lldpd=lldpd_error, driver=drivers.get(name)
            )
        interfaces.append(InterfaceTopology(interface=name, neighbours=seen, none_reason=reason))
    return TopologyReport(interfaces=interfaces, unavailable=unavailable)


class TopologyDiscovery:
    """Owns the listener across cycles; `section` is called once per probe cycle."""

    def __init__(self, lldpd_socket: str | None = None) -> None:
        self.lldpd_socket = lldpd_socket or os.environ.get(LLDPD_SOCKET_ENV, DEFAULT_SOCKET)
        self.listener = LldpListener()
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            if not self.listener.start():
                log.warning("LLDP: %s; trying lldpd at %s", self.listener.error, self.lldpd_socket)

    async def section(self, sample: Sample, checks: Checks) -> TopologyReport:
        self.start()
        netdevs = fabric_netdevs(sample, checks)
        self.listener.watch(netdevs)
        frames = {n: self.listener.neighbours(n) for n in netdevs}
        lldpd: dict[str, list[LldpNeighbour]] = {}
        lldpd_error = lldpd_unavailable(self.lldpd_socket)
        if lldpd_error is None and not all(frames.values()):
            try:
                lldpd = await query_lldpd(self.lldpd_socket)
            except (OSError, TimeoutError) as exc:
                lldpd_error = f"lldpcli failed: {exc}"
        listening = self.listener.listening
        unavailable = None
        if not listening and lldpd_error is not None:
            unavailable = f"{self.listener.error}; {lldpd_error}"
        elif lldpd_error is not None and listening:
            lldpd_error = None  # frames are the source; lldpd's absence is no news
        drivers = {n: (d.driver if (d := sample.netdevs.get(n)) else None) for n in netdevs}
        return topology_section(
            netdevs,
            frames,
            lldpd,
            listened=self.listener.listening_for() if listening else None,
            lldpd_error=lldpd_error,
            drivers=drivers,
            unavailable=unavailable,
        )

    def close(self) -> None:
        self.listener.close()


__all__ = ["TopologyDiscovery", "fabric_netdevs", "none_reason", "topology_section"]
