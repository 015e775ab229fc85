"""mtu.interface, mtu.roce and mtu.ipoib."""

from __future__ import annotations

from netval.agent.checks.context import CheckContext, result, skipped
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.model.snapshot import Transport
from netval.model.spec import ROCE_MTUS

# The kernel's iboe_get_mtu() subtracts the largest RoCE headers (GRH 40, UDP 8, BTH 12,
# XRC ETH 4, AtomicETH 28, ICRC 4 = 96) from the netdev MTU before it picks the IB MTU.
ROCE_OVERHEAD = 96


def active_roce_mtu(netdev_mtu: int) -> int | None:
    """The largest IB MTU the driver can activate for a netdev MTU, None if none fits."""
    fitting = [m for m in ROCE_MTUS if m <= netdev_mtu - ROCE_OVERHEAD]
    return fitting[-1] if fitting else None


_not_roce = {
    Transport.INFINIBAND: "not applicable: InfiniBand port, the subnet manager sets the IB MTU "
    "(IPoIB: mtu.ipoib)",
    Transport.IWARP: "not applicable: iWARP port (iWARP runs over TCP: mtu.interface)",
    Transport.UNKNOWN: "not applicable: link layer unreadable, not known to be RoCE",
    Transport.EFA: "not applicable: EFA port (SRD: the device sets its MTU, there is no RoCE MTU)",
    Transport.UNSPECIFIED: "not applicable: link layer neither Ethernet nor InfiniBand, not RoCE",
}

# IPoIB adds a 4-byte header to each IB packet: datagram mode fits in one IB MTU (4096 ->
# 4092, 2048 -> 2044); connected mode runs over RC and the driver's maximum is 65520.
IPOIB_DATAGRAM_MTU = 4092
IPOIB_CONNECTED_MTU = 65520


def check_ipoib_mtu(ctx: CheckContext) -> list[CheckResult]:
    if not ctx.judged.ipoib_netdevs:
        # IPoIB netdevs left out (down on purpose, excluded): say so, not "none here".
        left_out = [
            skipped(CheckId.MTU_IPOIB, name, f"not judged: {why}")
            for name, why in sorted((ctx.judged.excluded or {}).items())
            if (netdev := ctx.snapshot.last.netdevs.get(name)) is not None and netdev.is_ipoib
        ]
        return left_out or [skipped(CheckId.MTU_IPOIB, ctx.node, "no IPoIB netdevs on this node")]
    set_mtu = ctx.checks.mtu.ipoib_mtu
    out: list[CheckResult] = []
    for name in ctx.judged.ipoib_netdevs:
        netdev = ctx.snapshot.last.netdevs.get(name)
        if netdev is None:
            out.append(
                result(
                    CheckId.MTU_IPOIB,
                    name,
                    Status.FAIL,
                    f"IPoIB interface {name} not found on this node",
                    expected={"mtu": set_mtu},
                )
            )
            continue
        mode = netdev.ipoib_mode
        if set_mtu is not None:
            want, basis = set_mtu, "checks.mtu.ipoibMTU"
        elif mode == "connected":
            want, basis = IPOIB_CONNECTED_MTU, "connected mode"
        else:
            want = IPOIB_DATAGRAM_MTU
            basis = "datagram mode" if mode else f"datagram mode ({name}/mode unreadable)"
        expected = {"mtu": want, "mode": mode}
        if netdev.mtu is None:
            out.append(
                result(
                    CheckId.MTU_IPOIB,
                    name,
                    Status.ERROR,
                    f"not readable: /sys/class/net/{name}/mtu",
                    expected=expected,
                )
            )
            continue
        ok = netdev.mtu == want
        out.append(
            result(
                CheckId.MTU_IPOIB,
                name,
                Status.PASS if ok else Status.FAIL,
                f"IPoIB MTU {netdev.mtu} ({mode or 'mode unknown'})"
                + ("" if ok else f", expected {want} ({basis})"),
                {"mtu": netdev.mtu, "mode": mode},
                expected,
            )
        )
    return out


def check_interface_mtu(ctx: CheckContext) -> list[CheckResult]:
    if not ctx.judged.mtu_netdevs:
        reason = (
            "not applicable: only IPoIB netdevs on this node (judged by mtu.ipoib)"
            if ctx.judged.ipoib_netdevs
            else "no RDMA netdevs on this node and no interfaces named in checks.mtu.interfaces"
        )
        return [skipped(CheckId.MTU_INTERFACE, ctx.node, reason)]
    want = ctx.checks.mtu.interface_mtu
    out: list[CheckResult] = []
    for name in ctx.judged.mtu_netdevs:
        netdev = ctx.snapshot.last.netdevs.get(name)
        expected = {"mtu": want}
        if netdev is None:
            out.append(
                result(
                    CheckId.MTU_INTERFACE,
                    name,
                    Status.FAIL,
                    f"interface {name} not found on this node",
                    expected=expected,
                )
            )
        elif netdev.mtu is None:
            out.append(
                result(
                    CheckId.MTU_INTERFACE,
                    name,
                    Status.ERROR,
                    f"MTU of {name} not readable",
                    expected=expected,
                )
            )
        elif netdev.mtu != want:
            out.append(
                result(
                    CheckId.MTU_INTERFACE,
                    name,
                    Status.FAIL,
                    f"MTU {netdev.mtu}, expected {want}",
                    {"mtu": netdev.mtu},
                    expected,
                )
            )
        else:
            out.append(
                result(
                    CheckId.MTU_INTERFACE,
                    name,
                    Status.PASS,
                    f"MTU {netdev.mtu}",
                    {"mtu": netdev.mtu},
                    expected,
                )
            )
    return out


def check_roce_mtu(ctx: CheckContext) -> list[CheckResult]:
    if not ctx.judged.ports:
        return [skipped(CheckId.MTU_ROCE, ctx.node, "no RDMA devices on this node")]
    want = ctx.checks.mtu.roce_mtu
    out: list[CheckResult] = []
    for port in ctx.judged.ports:
        subject = port.subject
        transport = ctx.judged.transport(port)
        if transport is not Transport.ROCE:
            out.append(skipped(CheckId.MTU_ROCE, subject, _not_roce[transport]))
            continue
        name = ctx.judged.port_netdev.get(subject)
        netdev = ctx.snapshot.last.netdevs.get(name) if name else None
        if netdev is None or netdev.mtu is None:
            out.append(
                result(
                    CheckId.MTU_ROCE,
                    subject,
                    Status.ERROR,
                    f"no readable netdev MTU for {subject} (netdev {name or 'unknown'})",
                    expected={"roceMTU": want},
                )
            )
            continue
        active = active_roce_mtu(netdev.mtu)
        observed = {"roceMTU": active, "interfaceMTU": netdev.mtu, "netdev": name}
        if active is None or active < want:
            message = (
                f"active RoCE MTU {active or 'none'} (netdev {name} MTU {netdev.mtu}), "
                f"expected {want} (needs netdev MTU >= {want + ROCE_OVERHEAD})"
            )
            out.append(
                result(CheckId.MTU_ROCE, subject, Status.FAIL, message, observed, {"roceMTU": want})
            )
        else:
            out.append(
                result(
                    CheckId.MTU_ROCE,
                    subject,
                    Status.PASS,
                    f"active RoCE MTU {active} (netdev {name} MTU {netdev.mtu})",
                    observed,
                    {"roceMTU": want},
                )
            )
    return out
