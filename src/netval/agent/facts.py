"""A node's fingerprint facts, derived from the sample the collectors already took (pure).

No read and no fork of its own: every value comes from the typed `Sample` the checks judge
(the kernel release, from uname(2), is the caller's). A key the node cannot read is absent,
never guessed; several devices or netdevs with different values give the distinct values,
sorted and joined (`netval.model.facts.VALUE_SEPARATOR`), so a node with one port at
200 Gb/s among 400 Gb/s ports reads "200;400" and stands out from its cohort.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Final

from netval.agent.checks.mtu import active_roce_mtu
from netval.model.facts import (
    MAX_FACT_VALUE,
    NONE_VALUE,
    VALUE_SEPARATOR,
    FactKey,
    Facts,
)
from netval.model.snapshot import Netdev, PciePlacement, RdmaDevice, Sample, Transport

# "400 Gb/sec (4X NDR)" -> width "4X", speed "NDR"; EFA and some drivers omit the parenthesis.
_RATE_DETAIL: Final = re.compile(r"\((\d+X)\s+([A-Z0-9]+)\)")
_PRINTABLE: Final = re.compile(r"[^\x20-\x7e]")
# "16.0 GT/s PCIe" (pci_speed_string since v5.3) and "16 GT/s" (older kernels): one value
_GTS: Final = re.compile(r"^(\d+(?:\.\d+)?)\s*GT/s")
_Add = Callable[[FactKey, object], None]


def node_facts(sample: Sample, *, kernel_release: str | None = None) -> Facts:
    """The node's facts from one sample: RDMA devices, their ports and their netdevs."""
    found: dict[FactKey, set[str]] = {}

    def add(key: FactKey, value: object) -> None:
        if value is None:
            return
        text = _PRINTABLE.sub("?", str(value)).strip()
        if text:
            found.setdefault(key, set()).add(text)

    add(FactKey.KERNEL_RELEASE, kernel_release)
    netdev_names: list[str] = []
    for name in sorted(sample.rdma):
        device = sample.rdma[name]
        _device_facts(device, add)
        netdev_names.extend(device.pci_netdevs)
        if device.netdev_hint:
            netdev_names.append(device.netdev_hint)
        for port in device.ports.values():
            netdev_names.extend(port.netdevs)
    for name in _with_ports_below(sample, netdev_names):
        netdev = sample.netdevs.get(name)
        if netdev is not None:
            _netdev_facts(netdev, add)
    return {key.value: _joined(values) for key, values in sorted(found.items())}


def _device_facts(device: RdmaDevice, add: _Add) -> None:
    add(FactKey.NIC_MODEL, device.pci_id)
    add(FactKey.NIC_SUBSYSTEM, device.pci_subsys_id)
    add(FactKey.BOARD_ID, device.board_id)
    add(FactKey.FW_VER, device.fw_ver)
    add(FactKey.RDMA_DRIVER, device.driver)
    add(FactKey.NODE_TYPE, device.node_type)
    add(FactKey.RDMA_PORTS, len(device.ports))
    _pcie_facts(device.pcie, add)
    for port in device.ports.values():
        add(FactKey.LINK_LAYER, port.link_layer)
        rate = port.rate_gbps
        add(FactKey.LINK_RATE_GBPS, f"{rate:g}" if rate is not None else None)
        detail = _RATE_DETAIL.search(port.rate or "")
        if detail is not None:
            add(FactKey.LINK_WIDTH, detail.group(1))
            add(FactKey.LINK_SPEED, detail.group(2))
        add(FactKey.DEFAULT_ROCE_TOS, port.default_roce_tos)
        if device.transport(port) is Transport.ROCE:
            v2 = any(g.populated and g.type == "RoCE v2" for g in port.gids)
            add(FactKey.ROCE_V2_GID, "yes" if v2 else "no")


def _netdev_facts(netdev: Netdev, add: _Add) -> None:
    # the RDMA device's own PCI function: its uevent names the model when the device's
    # does not (format 1.0 snapshots record only the netdevs' uevents)
    add(FactKey.NIC_MODEL, netdev.pci_id)
    add(FactKey.NIC_SUBSYSTEM, netdev.pci_subsys_id)
    add(FactKey.NETDEV_DRIVER, netdev.driver)
    add(FactKey.NETDEV_SPEED_MBPS, netdev.speed_mbps)
    add(FactKey.MTU, netdev.mtu)
    add(FactKey.IPOIB_MODE, netdev.ipoib_mode)
    _pcie_facts(netdev.pcie, add)
    if netdev.mtu is not None and not netdev.is_ipoib:
        add(FactKey.ROCE_MTU_ACTIVE, active_roce_mtu(netdev.mtu))
    if netdev.ecn_np:
        add(FactKey.ECN_NP_ENABLED, _priorities(p for p, on in netdev.ecn_np.items() if on))
    if netdev.ecn_rp:
        add(FactKey.ECN_RP_ENABLED, _priorities(p for p, on in netdev.ecn_rp.items() if on))
    dcb = netdev.dcb
    if dcb is not None:
        add(FactKey.PFC_ENABLED, _priorities(dcb.pfc_enabled))
        add(FactKey.TRUST, dcb.trust)
        dscp = sorted((a.protocol, a.priority) for a in dcb.app if a.selector == "dscp")
        if dscp:
            add(FactKey.DSCP_MAP, _dscp_map(dscp))


def _pcie_facts(pcie: PciePlacement | None, add: _Add) -> None:
    """The RDMA device and its netdev usually share one PCI function: same values, once."""
    if pcie is None:
        return
    speed = _GTS.match(pcie.link_speed or "")
    # "Unknown" (no link status, e.g. a virtual function) is unread, not a value
    add(FactKey.PCIE_LINK_SPEED, f"{float(speed.group(1)):.1f} GT/s" if speed else None)
    add(FactKey.PCIE_LINK_WIDTH, f"x{pcie.link_width}" if pcie.link_width else None)
    add(FactKey.NUMA_NODE, pcie.numa_node)
    add(FactKey.DRIVER_VERSION, pcie.driver_version)


def _with_ports_below(sample: Sample, names: Iterable[str]) -> list[str]:
    """The netdevs named and the ones under them (a bond's slaves carry the DCB state)."""
    out = dict.fromkeys(names)
    for name in list(out):
        netdev = sample.netdevs.get(name)
        if netdev is not None:
            out.update(dict.fromkeys(netdev.ports_below))
    return sorted(out)


def _priorities(values: Iterable[int]) -> str:
    ordered = sorted(set(values))
    return ",".join(str(p) for p in ordered) if ordered else NONE_VALUE


def _dscp_map(pairs: list[tuple[int, int]]) -> str:
    """DSCP -> priority as runs per priority ("0-23:0,24-31:3,..."), short enough to bound."""
    by_priority: dict[int, list[int]] = {}
    for dscp, priority in pairs:
        by_priority.setdefault(priority, []).append(dscp)
    parts: list[str] = []
    for priority, codes in sorted(by_priority.items()):
        for start, end in _runs(codes):
            parts.append(f"{start}:{priority}" if start == end else f"{start}-{end}:{priority}")
    parts.sort(key=lambda part: int(part.split(":")[0].split("-")[0]))
    return ",".join(parts)


def _runs(values: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for value in sorted(set(values)):
        if runs and runs[-1][1] == value - 1:
            runs[-1] = (runs[-1][0], value)
        else:
            runs.append((value, value))
    return runs


def _joined(values: set[str]) -> str:
    text = VALUE_SEPARATOR.join(sorted(values))
    if len(text) <= MAX_FACT_VALUE:
        return text
    return text[: MAX_FACT_VALUE - 1] + "~"  # bounded; a cut value still compares as itself
