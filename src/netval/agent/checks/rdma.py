"""rdma.devices, rdma.port_state, rdma.link_layer, rdma.rate (GIDs: gid.py, counters:
rdma_errors.py)."""

from __future__ import annotations

from netval.agent.checks.context import CheckContext, result, skipped
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.model.snapshot import RdmaPort, Transport
from netval.model.spec import LinkLayer

_ACTIVE = "ACTIVE"
_LINK_UP = "LinkUp"
_IB = "/sys/class/infiniband"
# Transports whose link_layer file alone does not say what the port is.
_NAMED_TRANSPORTS = (Transport.IWARP, Transport.EFA, Transport.UNSPECIFIED)


def _no_devices(check: CheckId, ctx: CheckContext) -> list[CheckResult]:
    return [skipped(check, ctx.node, "no RDMA devices on this node (/sys/class/infiniband)")]


def _is_active(port: RdmaPort) -> bool:
    return bool(port.state and port.state.endswith(_ACTIVE))


# (link layer, board_id, PCI id): the ports expected to run at one rate.
_RateGroup = tuple[str, str | None, str | None]


def _rate_group(ctx: CheckContext, port: RdmaPort) -> _RateGroup:
    """Ports of one card model on one link layer. A VPI card's InfiniBand port and its
    Ethernet port share a board_id but not a rate; a virtual function shares the board_id
    of its physical function but has its own PCI device id (ConnectX-7 PF 15B3:1021, VF
    15B3:101E) and is limited to what the PF gives it."""
    device = ctx.snapshot.last.rdma.get(port.device)
    transport = ctx.judged.transport(port).value
    if device is None:
        return (transport, None, None)
    return (transport, device.board_id, device.pci_id)


def check_devices(ctx: CheckContext) -> list[CheckResult]:
    present = ctx.snapshot.last.rdma
    wanted = ctx.checks.rdma.devices
    if not present and not wanted:
        return _no_devices(CheckId.RDMA_DEVICES, ctx)
    out: list[CheckResult] = []
    for name in wanted:
        if name not in present:
            out.append(
                result(
                    CheckId.RDMA_DEVICES,
                    name,
                    Status.FAIL,
                    f"RDMA device {name} not found; present: {', '.join(sorted(present)) or 'none'}",
                    {"present": sorted(present)},
                    {"devices": list(wanted)},
                )
            )
    for name in sorted(present):
        device = present[name]
        why = ctx.judged.why_excluded(name)
        if why is not None:
            out.append(skipped(CheckId.RDMA_DEVICES, name, f"not judged: {why}"))
            continue
        if not device.ports:
            out.append(
                result(
                    CheckId.RDMA_DEVICES,
                    name,
                    Status.ERROR,
                    f"no port readable under {_IB}/{name}/ports/",
                    {"ports": 0, "fwVer": device.fw_ver, "boardId": device.board_id},
                    {"ports": ">=1"},
                )
            )
            continue
        out.append(
            result(
                CheckId.RDMA_DEVICES,
                name,
                Status.PASS,
                f"present ({len(device.ports)} port(s), firmware {device.fw_ver or 'unknown'})",
                {"ports": len(device.ports), "fwVer": device.fw_ver, "boardId": device.board_id},
                {"devices": list(wanted)} if wanted else {},
            )
        )
    return out


def _excluded_ports(ctx: CheckContext, check: CheckId) -> list[CheckResult]:
    out: list[CheckResult] = []
    for name in sorted(ctx.snapshot.last.rdma):
        for port in ctx.snapshot.last.rdma[name].ports.values():
            why = ctx.judged.why_excluded(port.subject)
            if why is not None:
                out.append(skipped(check, port.subject, f"not judged: {why}"))
    return out


def check_port_state(ctx: CheckContext) -> list[CheckResult]:
    excluded = _excluded_ports(ctx, CheckId.RDMA_PORT_STATE)
    if not ctx.judged.ports:
        return excluded or _no_devices(CheckId.RDMA_PORT_STATE, ctx)
    out: list[CheckResult] = []
    expected = {"state": "4: ACTIVE", "physState": "5: LinkUp"}
    for port in ctx.judged.ports:
        observed = {"state": port.state, "physState": port.phys_state}
        unread = [f for f, v in (("state", port.state), ("phys_state", port.phys_state)) if not v]
        if unread:
            files = ", ".join(f"{_IB}/{port.device}/ports/{port.port}/{f}" for f in unread)
            out.append(
                result(
                    CheckId.RDMA_PORT_STATE,
                    port.subject,
                    Status.ERROR,
                    f"not readable: {files}",
                    observed,
                    expected,
                )
            )
            continue
        phys_ok = bool(port.phys_state and port.phys_state.endswith(_LINK_UP))
        if _is_active(port) and phys_ok:
            out.append(
                result(
                    CheckId.RDMA_PORT_STATE,
                    port.subject,
                    Status.PASS,
                    f"{port.state}, {port.phys_state}",
                    observed,
                    expected,
                )
            )
        else:
            out.append(
                result(
                    CheckId.RDMA_PORT_STATE,
                    port.subject,
                    Status.FAIL,
                    f"port state {port.state or 'unreadable'}, physical state "
                    f"{port.phys_state or 'unreadable'}; expected 4: ACTIVE, 5: LinkUp",
                    observed,
                    expected,
                )
            )
    return out + excluded


def check_link_layer(ctx: CheckContext) -> list[CheckResult]:
    if not ctx.judged.ports:
        return _no_devices(CheckId.RDMA_LINK_LAYER, ctx)
    wanted = [w.value for w in ctx.checks.rdma.expected_link_layers]
    want_text = " or ".join(wanted)
    expected: dict[str, object] = (
        {"linkLayer": wanted[0]} if len(wanted) == 1 else {"linkLayers": wanted}
    )
    out: list[CheckResult] = []
    for port in ctx.judged.ports:
        if not port.link_layer:
            out.append(
                result(
                    CheckId.RDMA_LINK_LAYER,
                    port.subject,
                    Status.ERROR,
                    f"not readable: {_IB}/{port.device}/ports/{port.port}/link_layer",
                    {"linkLayer": None},
                    expected,
                )
            )
            continue
        transport = ctx.judged.transport(port)
        # EFA ports read "Unknown" (IB_LINK_LAYER_UNSPECIFIED); the spec names them EFA.
        ok = port.link_layer in wanted or (
            transport is Transport.EFA and LinkLayer.EFA.value in wanted
        )
        shown = f" ({transport.value})" if transport in _NAMED_TRANSPORTS else ""
        hint = " (checks.rdma.linkLayer: EFA)" if transport is Transport.EFA else ""
        out.append(
            result(
                CheckId.RDMA_LINK_LAYER,
                port.subject,
                Status.PASS if ok else Status.FAIL,
                f"link layer {port.link_layer or 'unreadable'}{shown}"
                + ("" if ok else f", expected {want_text}{hint}"),
                {"linkLayer": port.link_layer, "transport": transport.value},
                expected,
            )
        )
    return out


def check_rate(ctx: CheckContext) -> list[CheckResult]:
    if not ctx.judged.ports:
        return _no_devices(CheckId.RDMA_RATE, ctx)
    rdma_minimum = ctx.checks.rdma.min_rate_gbps
    ib_minimum = ctx.checks.infiniband.min_rate_gbps
    # Without a stated minimum, the ports of one card model on one link layer are expected to
    # run at one rate: a port that negotiated down (a bad cable or optic) runs below its
    # siblings. Comparing per group (_rate_group) keeps a 200G storage NIC beside 400G
    # compute NICs, or an Ethernet VF beside InfiniBand ports, from looking degraded.
    fastest: dict[_RateGroup, float] = {}
    for p in ctx.judged.ports:
        p_rate = p.rate_gbps
        if _is_active(p) and p_rate is not None:
            group = _rate_group(ctx, p)
            fastest[group] = max(p_rate, fastest.get(group, p_rate))
    out: list[CheckResult] = []
    for port in ctx.judged.ports:
        minimum, basis = rdma_minimum, "checks.rdma.minRateGbps"
        if ib_minimum is not None and ctx.judged.transport(port) is Transport.INFINIBAND:
            minimum, basis = ib_minimum, "checks.infiniband.minRateGbps"
        if minimum is None:
            basis = "the fastest port of the same card and link layer on this node"
        group = _rate_group(ctx, port)
        reference = minimum if minimum is not None else fastest.get(group)
        rate = port.rate_gbps
        if not _is_active(port):
            out.append(
                skipped(
                    CheckId.RDMA_RATE,
                    port.subject,
                    f"port not active ({port.state}); rate not judged",
                )
            )
            continue
        if rate is None or reference is None:
            out.append(
                result(
                    CheckId.RDMA_RATE,
                    port.subject,
                    Status.ERROR,
                    f"rate not readable ({port.rate!r}): "
                    f"{_IB}/{port.device}/ports/{port.port}/rate",
                )
            )
            continue
        observed: dict[str, object] = {"rateGbps": rate, "rate": port.rate}
        if minimum is None:
            observed["rateGroup"] = {"linkLayer": group[0], "boardId": group[1], "pciId": group[2]}
        expected = {"minRateGbps": reference}
        if rate < reference:
            out.append(
                result(
                    CheckId.RDMA_RATE,
                    port.subject,
                    Status.FAIL,
                    f"rate {port.rate}, expected at least {reference:g} Gb/s ({basis})",
                    observed,
                    expected,
                )
            )
        else:
            out.append(
                result(
                    CheckId.RDMA_RATE,
                    port.subject,
                    Status.PASS,
                    f"rate {port.rate}",
                    observed,
                    expected,
                )
            )
    return out
