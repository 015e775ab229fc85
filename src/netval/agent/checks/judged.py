"""Which subjects a node is judged on (docs/checks.md, "Which interfaces are judged").

By default the netdevs bound to RDMA devices, plus interfaces named in the spec. A RoCE LAG
device is judged on its bond for link and MTU, and on the bond's slaves for PFC, ECN and
pause/discard counters, where the NIC keeps that data.
"""

from __future__ import annotations

from dataclasses import dataclass

from netval.model.snapshot import RdmaPort, Sample
from netval.model.spec import Checks


@dataclass(frozen=True, slots=True)
class Judged:
    ports: tuple[RdmaPort, ...]
    port_netdev: dict[str, str]  # port subject -> the netdev carrying its RoCE traffic
    rdma_netdevs: tuple[str, ...]
    link_netdevs: tuple[str, ...]
    mtu_netdevs: tuple[str, ...]
    qos_netdevs: tuple[str, ...]  # where PFC/ECN/pause/discard data lives


def _ordered(*groups: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name for group in groups for name in group))


def judged_subjects(sample: Sample, checks: Checks) -> Judged:
    ports: list[RdmaPort] = []
    port_netdev: dict[str, str] = {}
    rdma_netdevs: list[str] = []
    for device_name in sorted(sample.rdma):
        device = sample.rdma[device_name]
        for port_no in sorted(device.ports):
            port = device.ports[port_no]
            ports.append(port)
            bound = port.netdevs or ((device.netdev_hint,) if device.netdev_hint else ())
            if bound:
                port_netdev[port.subject] = bound[0]
            rdma_netdevs.extend(bound)
    rdma = _ordered(rdma_netdevs)
    qos: list[str] = []
    for name in rdma:
        netdev = sample.netdevs.get(name)
        qos.extend(netdev.bond_slaves if netdev and netdev.bond_slaves else (name,))
    return Judged(
        ports=tuple(ports),
        port_netdev=port_netdev,
        rdma_netdevs=rdma,
        link_netdevs=_ordered(rdma, checks.link.interfaces),
        mtu_netdevs=_ordered(rdma, checks.mtu.interfaces),
        qos_netdevs=_ordered(qos),
    )
