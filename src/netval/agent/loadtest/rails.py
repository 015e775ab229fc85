"""This node's rails: the fabric interfaces a load test loads at once, in a fixed order.

Rail i of one node faces rail i of its peer (rail-optimised fabrics: each NIC of a node on
its own leaf plane). The default rails are `checks.peers.interfaces` in the order given,
else the node's judged RDMA netdevs (sorted by name, which follows the NIC order on the
usual `ens<N>np0` / `ib<N>` naming), else `checks.peers.interface` (an Ethernet node: the
responder's interface is its one rail). A load test may name other interfaces; the agent
therefore announces, besides its rails, the other interfaces the validation names
(`checks.link.interfaces`, `checks.mtu.interfaces`), at most `MAX_RAILS` of each.

For each rail: its address (the first IPv4, else global IPv6), the RDMA port under it (the
port whose GIDs point at the netdev), and its port rate: the RDMA port's active rate, else
the netdev's speed. A virtual NIC reports a nominal speed it never reaches (veth: 10000):
the rate is a ceiling, never evidence of what was reached (docs/loadtest.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import JsonValue

from netval.agent.checks.judged import judged_subjects
from netval.model.loadtest import MAX_RAILS
from netval.model.snapshot import RdmaPort, Sample, Transport
from netval.model.spec import Checks, PfcChecks, Trust


@dataclass(frozen=True, slots=True)
class Rail:
    name: str
    address: str | None
    port: RdmaPort | None  # the RDMA port under it (None: Ethernet only)
    transport: Transport | None
    port_mbps: float | None

    @property
    def rdma(self) -> bool:
        return self.port is not None and self.transport in (Transport.ROCE, Transport.INFINIBAND)


def default_rail_names(sample: Sample | None, checks: Checks) -> list[str]:
    """`peers.interfaces`, else the RDMA netdevs, else the responder's interface (what the
    operator plans for a node that announced no rails)."""
    if checks.peers.interfaces:
        return list(checks.peers.interfaces)[:MAX_RAILS]
    rdma = sorted(judged_subjects(sample, checks).rdma_netdevs) if sample is not None else []
    if rdma:
        return rdma[:MAX_RAILS]
    return [checks.peers.interface] if checks.peers.interface else []


def other_names(checks: Checks, rails: Sequence[str]) -> list[str]:
    """The named interfaces that are not rails (a load test may choose them)."""
    taken = set(rails)
    return [n for n in checks.named_interfaces if n not in taken][:MAX_RAILS]


def describe(
    names: Sequence[str],
    sample: Sample | None,
    checks: Checks,
    resolve: Callable[[str], str | None],
) -> list[Rail]:
    """The rails called `names`, in that order."""
    by_netdev: dict[str, tuple[RdmaPort, Transport]] = {}
    if sample is not None:
        judged = judged_subjects(sample, checks)
        for device in sample.rdma.values():
            for each in device.ports.values():
                bound = judged.port_netdev.get(each.subject)
                if bound is None and each.netdevs:
                    bound = each.netdevs[0]
                if bound is not None and bound not in by_netdev:
                    by_netdev[bound] = (each, device.transport(each))
    out: list[Rail] = []
    for name in names[:MAX_RAILS]:
        port: RdmaPort | None = None
        transport: Transport | None = None
        if (found := by_netdev.get(name)) is not None:
            port, transport = found
        rate: float | None = None
        if port is not None and port.rate_gbps:
            rate = port.rate_gbps * 1000
        else:
            netdev = sample.netdevs.get(name) if sample is not None else None
            if netdev is not None and netdev.speed_mbps and netdev.speed_mbps > 0:
                rate = float(netdev.speed_mbps)
        out.append(Rail(name, resolve(name), port, transport, rate))
    return out


def service_level(rail: Rail, pfc: PfcChecks) -> int | None:
    """The SL perftest sets: the first lossless priority, on InfiniBand (SL is its class)
    and with `pfc.trust: pcp` (RoCE's priority then follows the SL); else None (RoCE with
    DSCP trust takes its priority from the DSCP)."""
    if not pfc.priorities:
        return None
    if rail.transport is Transport.INFINIBAND or pfc.trust is Trust.PCP:
        return pfc.priorities[0]
    return None


def announced(
    sample: Sample | None, checks: Checks, resolve: Callable[[str], str | None]
) -> dict[str, JsonValue]:
    """The rails part of this node's endpoint: `rails` (the default rails in order) and
    `interfaces` (other named interfaces a load test may choose), each entry
    [name, address, rdma]; entries without an address are left out (nothing can reach them)."""
    names = default_rail_names(sample, checks)
    out: dict[str, JsonValue] = {}
    for key, chosen in (("rails", names), ("interfaces", other_names(checks, names))):
        entries: list[JsonValue] = [
            [rail.name, rail.address, rail.rdma]
            for rail in describe(chosen, sample, checks, resolve)
            if rail.address is not None
        ]
        if entries:
            out[key] = entries
    return out
