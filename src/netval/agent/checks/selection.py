"""Which RDMA devices, ports and netdevs are judged (docs/checks.md, "Choosing what is judged").

`spec.checks.select` includes or excludes devices, ports and netdevs by name glob or PCI
address, and says whether an administratively down port or netdev is a fault. Leaving out
a RoCE/iWARP port's netdevs leaves out the port; leaving out an IPoIB netdev does not leave
out its InfiniBand port, which is selected by `devices`/`ports`. Each port is
bound to its own netdev: the netdevs its GIDs name, else the netdev of its PCI device whose
`dev_port` is the port's (port - 1), never simply the first name under `device/net`.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

from netval.model.snapshot import Netdev, RdmaDevice, RdmaPort, Sample, Transport
from netval.model.spec import AdminDown, PatternFilter, Selection

# IB PortInfo PhysicalPortState 3: the port was disabled by management (ibportstate
# disable, opensm); a port without a cable polls (2) instead.
_IB_DISABLED = "3: Disabled"
_NETDEV_TRANSPORTS = (Transport.ROCE, Transport.IWARP, Transport.UNKNOWN)


def _first_match(patterns: Iterable[str], keys: Iterable[str | None]) -> str | None:
    present = [k for k in keys if k]
    for pattern in patterns:
        if any(fnmatchcase(key, pattern) for key in present):
            return pattern
    return None


def filter_reason(flt: PatternFilter, field: str, keys: Iterable[str | None]) -> str | None:
    """Why `keys` (a name, a PCI address) are left out by one filter, None if they are not."""
    keys = tuple(keys)
    hit = _first_match(flt.exclude, keys)
    if hit is not None:
        return f"excluded by checks.select.{field}.exclude {hit!r}"
    if flt.include and _first_match(flt.include, keys) is None:
        return f"not matched by checks.select.{field}.include"
    return None


def device_reason(select: Selection, device: RdmaDevice) -> str | None:
    return filter_reason(select.devices, "devices", (device.name, device.pci_address))


def netdev_reason(select: Selection, name: str, netdev: Netdev | None) -> str | None:
    reason = filter_reason(
        select.netdevs, "netdevs", (name, netdev.pci_address if netdev else None)
    )
    skip_down = select.admin_down is AdminDown.SKIP
    if reason is None and skip_down and netdev is not None and netdev.admin_up is False:
        reason = "administratively down, not a fault (checks.select.adminDown: skip)"
    return reason


def port_reason(
    select: Selection, device: RdmaDevice, port: RdmaPort, bound: tuple[str, ...], sample: Sample
) -> str | None:
    reason = device_reason(select, device)
    if reason is not None:
        return f"device {device.name} {reason}"
    reason = filter_reason(select.ports, "ports", (port.subject,))
    if reason is not None:
        return reason
    # A RoCE or iWARP port is its netdev; an IB port's IPoIB netdev is an upper layer over it
    # (down or left out on purpose on many fabrics), so it never takes the port with it.
    # (An unreadable link layer keeps the old rule: the netdev decides.)
    carried_by_netdev = device.transport(port) in _NETDEV_TRANSPORTS
    if (
        carried_by_netdev
        and bound
        and all(netdev_reason(select, n, sample.netdevs.get(n)) is not None for n in bound)
    ):
        why = netdev_reason(select, bound[0], sample.netdevs.get(bound[0]))
        return f"its netdev {bound[0]} is {why}"
    if (
        select.admin_down is AdminDown.SKIP
        and port.link_layer == "InfiniBand"
        and port.phys_state == _IB_DISABLED
    ):
        return "InfiniBand port disabled (phys_state 3: Disabled), not a fault (checks.select.adminDown: skip)"
    return None


def bound_netdevs(device: RdmaDevice, port: RdmaPort) -> tuple[str, ...]:
    """The netdevs carrying this port's traffic, most specific first.

    RoCE: the netdevs its populated GIDs name (gid_attrs/ndevs). InfiniBand (whose GIDs have
    no netdev) or a RoCE port without GIDs: the IPoIB/Ethernet netdev of the same PCI device
    whose dev_port is port - 1 (ipoib and mlx4_en set it so on dual-port HCAs). Snapshots
    without dev_port fall back to the device's first netdev, as before.
    """
    by_gid = port.netdevs
    if by_gid:
        return by_gid
    ports = device.pci_netdevs
    by_port = tuple(sorted(n for n, dp in ports.items() if dp == port.port - 1))
    if by_port:
        # The parent before its pkey children (ib0 before ib0.8001).
        return tuple(sorted(by_port, key=lambda n: (len(n), n)))
    if ports and any(dp is not None for dp in ports.values()):
        return ()  # dev_port known, none is this port's: binding another port's is wrong
    return (device.netdev_hint,) if device.netdev_hint else ()
