"""The report's `nics` section from the sample the collectors took (pure, no read of its own).

One entry per RDMA device: its PCI function (the device's own uevent, else its first
netdev's) and the netdevs that carry its ports' traffic, found as the checks bind them
(`checks.selection.bound_netdevs`: the GIDs' netdevs, else the same PCI device's netdev of
that port), with a bond's slaves. So the operator can tie `mlx5_3/1`, `ens3np0` and
`ens3np0/prio3` to one NIC and a DRA driver's device (`dra.net/pciAddress`). A name the
model would refuse (longer than the kernel allows) is left out rather than sent: one odd
netdev never costs the node its report.
"""

from __future__ import annotations

import re
from typing import Final

from netval.agent.checks.selection import bound_netdevs
from netval.model.nics import (
    MAX_NETDEVS_PER_NIC,
    MAX_NICS,
    NETDEV_PATTERN,
    PCI_PATTERN,
    RDMA_NAME_PATTERN,
    Nic,
)
from netval.model.snapshot import RdmaDevice, Sample

_RDMA: Final = re.compile(RDMA_NAME_PATTERN)
_NETDEV: Final = re.compile(NETDEV_PATTERN)
_PCI: Final = re.compile(PCI_PATTERN)


def node_nics(sample: Sample) -> list[Nic]:
    """The node's RDMA NICs, by device name (at most MAX_NICS)."""
    out: list[Nic] = []
    for name in sorted(sample.rdma):
        if not _RDMA.match(name):
            continue
        device = sample.rdma[name]
        netdevs = _netdevs(sample, device)
        out.append(Nic(rdma_device=name, pci_address=_pci(sample, device, netdevs),
                       netdevs=tuple(netdevs)))  # fmt: skip
        if len(out) == MAX_NICS:
            break
    return out


def _netdevs(sample: Sample, device: RdmaDevice) -> list[str]:
    names: dict[str, None] = {}
    for port_no in sorted(device.ports):
        for netdev in bound_netdevs(device, device.ports[port_no]):
            names[netdev] = None
            found = sample.netdevs.get(netdev)
            if found is not None:
                names.update(dict.fromkeys(found.ports_below))
    return [n for n in names if _NETDEV.match(n)][:MAX_NETDEVS_PER_NIC]


def _pci(sample: Sample, device: RdmaDevice, netdevs: list[str]) -> str | None:
    candidates = [device.pci_address]
    candidates += [n.pci_address for name in netdevs if (n := sample.netdevs.get(name))]
    return next((c.lower() for c in candidates if c and _PCI.match(c)), None)


__all__ = ["node_nics"]
