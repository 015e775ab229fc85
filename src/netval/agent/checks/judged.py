"""Which subjects a node is judged on (docs/checks.md, "Which interfaces are judged").

By default the netdevs bound to RDMA ports, plus interfaces named in the spec, less what
`checks.select` leaves out (checks/selection.py). Each port's transport decides which checks
apply to it: RoCE ports get RoCE checks, InfiniBand ports IB checks, iWARP ports neither RoCE
GID nor PFC/ECN checks unless asked, EFA ports (SRD) neither RoCE nor IB checks. InfiniBand
and EFA ports are judged through their RDMA device: an IPoIB netdev that is down or left out
is not judged, its port still is. A RoCE LAG device is judged on its bond for link and
MTU, and on the bond's slaves for PFC, ECN and pause/discard counters, where the NIC keeps
that data.
"""

from __future__ import annotations

from dataclasses import dataclass

from netval.agent.checks.selection import bound_netdevs, device_reason, netdev_reason, port_reason
from netval.model.snapshot import RdmaPort, Sample, Transport
from netval.model.spec import Checks


@dataclass(frozen=True, slots=True)
class Judged:
    ports: tuple[RdmaPort, ...]
    port_netdev: dict[str, str]  # port subject -> the netdev carrying its RoCE traffic
    rdma_netdevs: tuple[str, ...]
    link_netdevs: tuple[str, ...]
    mtu_netdevs: tuple[str, ...]  # Ethernet MTU (mtu.interface)
    qos_netdevs: tuple[str, ...]  # where PFC/ECN/pause/discard data lives
    # -- selection and transports (issue 11) --
    transports: dict[str, Transport]  # port subject -> what it carries
    ipoib_netdevs: tuple[str, ...] = ()  # IPoIB MTU (mtu.ipoib)
    # subject (device, device/port or netdev) -> why it is not judged
    excluded: dict[str, str] | None = None
    # netdev -> why PFC/ECN do not apply to it ("not applicable: InfiniBand port mlx5_0/1")
    qos_not_applicable: dict[str, str] | None = None
    qos_transports: frozenset[Transport] = frozenset({Transport.ROCE})

    def transport(self, port: RdmaPort) -> Transport:
        return self.transports.get(port.subject, Transport.UNKNOWN)

    def ports_of(self, *transports: Transport) -> tuple[RdmaPort, ...]:
        return tuple(p for p in self.ports if self.transport(p) in transports)

    def no_qos_reason(self, what: str) -> str:
        """The node-level skip of a PFC/ECN check with no netdev to judge, true to why."""
        # Ports whose transport has no host PFC/ECN say so even without a judged netdev
        # (EFA has none, an IB port's IPoIB netdev may be down or left out).
        if not self.qos_not_applicable and not any(self.ports_of(*_WHY_NO_QOS)):
            return f"no RDMA netdevs on this node: {what} is not judged"
        parts = []
        for transport, why in _WHY_NO_QOS.items():
            ports = [p.subject for p in self.ports_of(transport)]
            if ports:
                parts.append(f"{transport.value} port(s) {', '.join(ports)} ({why})")
        return "not applicable: " + "; ".join(parts)

    def qos_ports(self) -> tuple[RdmaPort, ...]:
        """RoCE ports, and iWARP ports when checks.select.qosOnIWARP is set."""
        return tuple(p for p in self.ports if self.transport(p) in self.qos_transports)

    def why_excluded(self, subject: str) -> str | None:
        return (self.excluded or {}).get(subject)


def _ordered(*groups: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name for group in groups for name in group))


_WHY_NO_QOS = {
    Transport.INFINIBAND: "IB has credit-based flow control and no Ethernet PHY, PFC or ECN; "
    "its link errors are ib.port_errors",
    Transport.IWARP: "iWARP runs over TCP; checks.select.qosOnIWARP judges it",
    Transport.EFA: "EFA uses SRD: no PFC/ECN on the host, congestion control runs in the "
    "device; its errors are rdma.errors",
    Transport.UNSPECIFIED: "link layer neither Ethernet nor InfiniBand: no RoCE PFC/ECN",
}
_NOT_APPLICABLE = {
    Transport.INFINIBAND: "not applicable: InfiniBand port {port} (no PFC/ECN on IB; credit-based flow control)",
    Transport.IWARP: "not applicable: iWARP port {port} (set checks.select.qosOnIWARP to judge PFC/ECN)",
    Transport.EFA: "not applicable: EFA port {port} (EFA uses SRD: no PFC/ECN on the host)",
    Transport.UNSPECIFIED: "not applicable: port {port} with link layer neither Ethernet nor "
    "InfiniBand (no RoCE PFC/ECN)",
}


def judged_subjects(sample: Sample, checks: Checks) -> Judged:
    select = checks.select
    ports: list[RdmaPort] = []
    port_netdev: dict[str, str] = {}
    transports: dict[str, Transport] = {}
    excluded: dict[str, str] = {}
    rdma_netdevs: list[str] = []
    qos_candidates: list[str] = []
    ipoib: list[str] = []
    not_applicable: dict[str, str] = {}
    for device_name in sorted(sample.rdma):
        device = sample.rdma[device_name]
        why = device_reason(select, device)
        if why is not None:
            excluded[device_name] = why
        for port_no in sorted(device.ports):
            port = device.ports[port_no]
            bound = bound_netdevs(device, port)
            why_port = port_reason(select, device, port, bound, sample)
            if why_port is not None:
                excluded[port.subject] = why_port
                for name in bound:
                    own = netdev_reason(select, name, sample.netdevs.get(name))
                    excluded.setdefault(name, own or f"its port {port.subject} {why_port}")
                continue
            kept: list[str] = []
            for name in bound:
                why_netdev = netdev_reason(select, name, sample.netdevs.get(name))
                if why_netdev is None:
                    kept.append(name)
                else:
                    excluded.setdefault(name, why_netdev)
            bound = tuple(kept)
            transport = device.transport(port)
            transports[port.subject] = transport
            ports.append(port)
            if bound:
                port_netdev[port.subject] = bound[0]
            rdma_netdevs.extend(bound)
            for name in bound:
                netdev = sample.netdevs.get(name)
                if transport is Transport.INFINIBAND or (netdev is not None and netdev.is_ipoib):
                    ipoib.append(name)
                if transport is Transport.ROCE or (
                    transport is Transport.IWARP and select.qos_on_iwarp
                ):
                    qos_candidates.append(name)
                elif transport in _NOT_APPLICABLE:
                    not_applicable[name] = _NOT_APPLICABLE[transport].format(port=port.subject)
    rdma = _ordered(rdma_netdevs)
    qos: list[str] = []
    for name in _ordered(qos_candidates):
        netdev = sample.netdevs.get(name)
        qos.extend(netdev.ports_below if netdev and netdev.ports_below else (name,))
    for name in list(excluded):
        if name in rdma:  # another judged port carries it: judge it for that port
            del excluded[name]
    ipoib_set = set(ipoib)
    mtu = [n for n in _ordered(rdma, checks.mtu.interfaces) if n not in ipoib_set]
    named_ipoib = [
        n for n in checks.mtu.interfaces if (nd := sample.netdevs.get(n)) and nd.is_ipoib
    ]
    mtu = [n for n in mtu if n not in named_ipoib]
    return Judged(
        ports=tuple(ports),
        port_netdev=port_netdev,
        rdma_netdevs=rdma,
        link_netdevs=_ordered(rdma, checks.link.interfaces),
        mtu_netdevs=tuple(mtu),
        qos_netdevs=_ordered(qos),
        transports=transports,
        ipoib_netdevs=_ordered(ipoib, named_ipoib),
        excluded=excluded,
        qos_not_applicable={k: v for k, v in not_applicable.items() if k not in set(qos)},
        qos_transports=frozenset(
            {Transport.ROCE, Transport.IWARP} if select.qos_on_iwarp else {Transport.ROCE}
        ),
    )
