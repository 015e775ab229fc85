"""The report's `topology` section: each judged fabric netdev's LLDP neighbour, or why none.

Sources, in order: frames the agent receives itself (`LldpListener`, needs CAP_NET_RAW),
then the node's lldpd (`lldpcli`) for netdevs the frames said nothing about. A netdev with
neither says why, with the usual cause named: NIC firmware that runs its own LLDP agent
consumes the frames before the host sees them (docs/topology.md, "None seen").
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from netval.agent.checks.judged import judged_subjects
from netval.agent.topology.l3path import read_next_hops, trace
from netval.agent.topology.listener import LldpListener
from netval.agent.topology.lldpd import DEFAULT_SOCKET, lldpd_unavailable, query_lldpd
from netval.model.snapshot import Sample
from netval.model.spec import Checks, TopologySpec
from netval.model.topology import (
    MAX_PATHS,
    MAX_TOPOLOGY_INTERFACES,
    InterfaceTopology,
    L3Path,
    LldpNeighbour,
    TopologyReport,
)

log = logging.getLogger("netval.agent.topology")

LLDPD_SOCKET_ENV: Final = "NETVAL_LLDPD_SOCKET"
# Peers traced per round (a round runs on its own task and takes at most 8 hops x 0.5 s per
# peer when nothing answers); over rounds every peer is traced in turn.
PEERS_PER_ROUND: Final = 2
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
    next_hops: Mapping[str, str] | None = None,
    paths: Sequence[L3Path] = (),
    lldp: bool = True,
) -> TopologyReport:
    """Pure: the section from what each source saw (`lldp` False: LLDP is not read)."""
    interfaces = []
    for name in netdevs[:MAX_TOPOLOGY_INTERFACES]:
        seen = frames.get(name) or lldpd.get(name) or []
        reason = None
        if not lldp:
            reason = "LLDP is not read: spec.topology.lldp is off"
        elif not seen:
            reason = none_reason(
                name, listened=listened, lldpd=lldpd_error, driver=drivers.get(name)
            )
        interfaces.append(
            InterfaceTopology(
                interface=name,
                neighbours=seen,
                none_reason=reason,
                next_hop=(next_hops or {}).get(name),
            )
        )
    return TopologyReport(
        interfaces=interfaces, unavailable=unavailable, paths=list(paths)[:MAX_PATHS]
    )


class TopologyDiscovery:
    """Owns the listener and the path tracer across cycles; `section` is called once per
    probe cycle and never waits for a trace (traces run on their own task, the section
    carries the latest finished ones)."""

    def __init__(
        self,
        lldpd_socket: str | None = None,
        peer_addresses: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        self.lldpd_socket = lldpd_socket or os.environ.get(LLDPD_SOCKET_ENV, DEFAULT_SOCKET)
        self.listener = LldpListener()
        self._started = False
        self.peer_addresses = peer_addresses
        self._paths: dict[str, L3Path] = {}
        self._tracing: asyncio.Task[None] | None = None
        self._turn = 0

    def start(self) -> None:
        if not self._started:
            self._started = True
            if not self.listener.start():
                log.warning("LLDP: %s; trying lldpd at %s", self.listener.error, self.lldpd_socket)

    async def section(
        self, sample: Sample, checks: Checks, topology: TopologySpec | None = None
    ) -> TopologyReport:
        topology = topology or TopologySpec(lldp=True)
        netdevs = fabric_netdevs(sample, checks)
        hops = read_next_hops()
        if topology.paths:
            self._trace_some()
        paths = list(self._paths.values()) if topology.paths else []
        if not topology.lldp:
            return topology_section(
                netdevs, {}, {}, listened=None, lldpd_error=None, drivers={},
                next_hops=hops, paths=paths, lldp=False,
            )  # fmt: skip
        self.start()
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
            next_hops=hops,
            paths=paths,
        )

    def _trace_some(self) -> None:
        """Start tracing the next few peers, unless a round is still running."""
        if self.peer_addresses is None or (self._tracing and not self._tracing.done()):
            return
        peers = sorted(self.peer_addresses().items())
        for gone in set(self._paths) - {n for n, _ in peers}:
            del self._paths[gone]
        if not peers:
            return
        start = self._turn % len(peers)
        chosen = (peers[start:] + peers[:start])[:PEERS_PER_ROUND]
        self._turn += PEERS_PER_ROUND
        self._tracing = asyncio.create_task(self._trace(chosen), name="netval-topology-paths")

    async def _trace(self, peers: list[tuple[str, str]]) -> None:
        for node, address in peers:
            try:
                found = await asyncio.to_thread(trace, address)
            except OSError as exc:
                log.debug("tracing %s (%s) failed: %s", node, address, exc)
                continue
            self._paths.pop(node, None)
            self._paths[node] = L3Path(
                peer=node, destination=address, hops=list(found.hops), reached=found.reached
            )
            while len(self._paths) > MAX_PATHS:
                del self._paths[next(iter(self._paths))]

    def close(self) -> None:
        self.listener.close()
        if self._tracing is not None:
            self._tracing.cancel()


__all__ = ["TopologyDiscovery", "fabric_netdevs", "none_reason", "topology_section"]
