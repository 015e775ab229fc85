"""rdma.gid_roce_v2 and rdma.gid_index: a routable RoCE v2 GID exists, and stays put.

RoCE v2 connections are addressed by GID. Only a GID that carries an IP address routes
across an L3 fabric: an IPv4-mapped one (::ffff:a.b.c.d) or a global/ULA IPv6 one. The
link-local GIDs (fe80::/64, from the MAC) are there as soon as the netdev exists, so "has a
RoCE v2 GID" passes on a node with no IP address at all. Jobs pick the GID by index
(NCCL_IB_GID_INDEX, or NCCL's own choice cached per process: NVIDIA/nccl#2157); after a link
flap or an address change the kernel may re-populate the table at other indices.
"""

from __future__ import annotations

import functools
import ipaddress

from netval.agent.checks.context import NO_DELTAS, CheckContext, result, skipped
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.model.snapshot import Gid, RdmaPort, Transport

ROCE_V2 = "RoCE v2"


def gid_address(gid: Gid) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address a GID carries, None if its text is not an IPv6 address."""
    return _address(gid.gid)


@functools.lru_cache(maxsize=4096)  # GID tables rarely change: each cycle parses the same text
def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        v6 = ipaddress.IPv6Address(text)
    except ValueError:
        return None
    return v6.ipv4_mapped or v6


def is_routable(gid: Gid) -> bool:
    addr = gid_address(gid)
    if addr is None:
        return False
    if addr.is_link_local or addr.is_multicast or addr.is_loopback or addr.is_unspecified:
        return False
    return not (isinstance(addr, ipaddress.IPv6Address) and addr.is_site_local)


def gid_text(gid: Gid) -> str:
    addr = gid_address(gid)
    return str(addr) if addr is not None else gid.gid


def routable_v2(port: RdmaPort) -> list[Gid]:
    return [g for g in port.gids if g.populated and g.type == ROCE_V2 and is_routable(g)]


def not_applicable(ctx: CheckContext, port: RdmaPort) -> str | None:
    transport = ctx.judged.transport(port)
    if transport is Transport.INFINIBAND:
        return "not applicable: InfiniBand port (IB GIDs are not RoCE GIDs)"
    if transport is Transport.IWARP:
        return "not applicable: iWARP port (iWARP addresses by IP, it has no RoCE GIDs)"
    if transport is Transport.EFA:
        return "not applicable: EFA port (SRD addresses peers by the device GID, no RoCE GIDs)"
    if transport is not Transport.ROCE:
        return f"not applicable: link layer {port.link_layer or 'unreadable'}, not RoCE"
    return None


def _no_devices(check: CheckId, ctx: CheckContext) -> list[CheckResult]:
    return [skipped(check, ctx.node, "no RDMA devices on this node (/sys/class/infiniband)")]


def check_gid_roce_v2(ctx: CheckContext) -> list[CheckResult]:
    if not ctx.judged.ports:
        return _no_devices(CheckId.RDMA_GID_ROCE_V2, ctx)
    out: list[CheckResult] = []
    expected = {"roceV2Gids": ">=1", "routable": True}
    for port in ctx.judged.ports:
        subject = port.subject
        why = not_applicable(ctx, port)
        if why is not None:
            out.append(skipped(CheckId.RDMA_GID_ROCE_V2, subject, why))
            continue
        if not ctx.checks.rdma.require_ro_ce_v2:
            out.append(
                skipped(CheckId.RDMA_GID_ROCE_V2, subject, "checks.rdma.requireRoCEv2 is false")
            )
            continue
        populated = [g for g in port.gids if g.populated]
        v2 = [g for g in populated if g.type == ROCE_V2]
        routable = [g for g in v2 if is_routable(g)]
        types = sorted({g.type or "unknown" for g in populated})
        observed = {
            "populatedGids": len(populated),
            "roceV2Gids": len(v2),
            "routableRoceV2Gids": len(routable),
            "types": list(types),
        }
        if routable:
            g = routable[0]
            status = Status.PASS
            message = (
                f"{len(v2)} RoCE v2 GID(s), routable: index {g.index} ({gid_text(g)}) on "
                f"{g.ndev or 'unknown netdev'}"
            )
        elif v2:
            ndevs = sorted({g.ndev for g in v2 if g.ndev}) or ["its netdev"]
            status = Status.FAIL
            message = (
                f"RoCE v2 GIDs are link-local only ({', '.join(gid_text(g) for g in v2[:2])}): "
                f"no IP address on the netdev {', '.join(ndevs)}; expected an IPv4-mapped or "
                "global/ULA IPv6 RoCE v2 GID (link-local GIDs do not route)"
            )
        elif not populated:
            status = Status.FAIL
            message = (
                "no populated GID (is the netdev gone, down, or in another network namespace?); "
                "expected a routable RoCE v2 GID"
            )
        else:
            status = Status.FAIL
            message = (
                f"no RoCE v2 GID: {len(populated)} populated GID(s) of type {', '.join(types)}; "
                "expected a RoCE v2 GID (RoCE v1 is not routable across L3 fabrics)"
            )
        out.append(result(CheckId.RDMA_GID_ROCE_V2, subject, status, message, observed, expected))
    return out


def check_gid_index(ctx: CheckContext) -> list[CheckResult]:
    if not ctx.judged.ports:
        return _no_devices(CheckId.RDMA_GID_INDEX, ctx)
    want = ctx.checks.rdma.ro_ce_v2_gid_index
    out: list[CheckResult] = []
    for port in ctx.judged.ports:
        why = not_applicable(ctx, port)
        if why is not None:
            out.append(skipped(CheckId.RDMA_GID_INDEX, port.subject, why))
            continue
        out.append(_judge_index(ctx, port, want))
    return out


def _judge_index(ctx: CheckContext, port: RdmaPort, want: int | None) -> CheckResult:
    check, subject = CheckId.RDMA_GID_INDEX, port.subject
    now = routable_v2(port)
    if not now:
        return skipped(check, subject, "no routable RoCE v2 GID (judged by rdma.gid_roce_v2)")
    expected: dict[str, object] = {"roceV2GidIndex": want} if want is not None else {}
    if want is not None and all(g.index != want for g in now):
        at = next((g for g in port.gids if g.index == want and g.populated), None)
        holds = f"{at.type or 'unknown type'} {gid_text(at)}" if at else "no GID"
        return result(
            check,
            subject,
            Status.FAIL,
            f"GID index {want} holds {holds}; the routable RoCE v2 GID is at index "
            f"{now[0].index} ({gid_text(now[0])}): jobs told NCCL_IB_GID_INDEX={want} cannot "
            "connect across the fabric",
            {"gidIndex": now[0].index, "gid": gid_text(now[0])},
            expected,
        )
    if not ctx.snapshot.has_deltas:
        if want is not None:
            return result(
                check,
                subject,
                Status.PASS,
                f"routable RoCE v2 GID at index {want}",
                {"gidIndex": want},
                expected,
            )
        return skipped(check, subject, NO_DELTAS)
    first_device = ctx.snapshot.first.rdma.get(port.device)
    first_port = first_device.ports.get(port.port) if first_device else None
    before = {g.gid: g.index for g in routable_v2(first_port)} if first_port else {}
    shown = {g.gid: gid_text(g) for g in routable_v2(first_port)} if first_port else {}
    moved = [(g, before[g.gid]) for g in now if g.gid in before and before[g.gid] != g.index]
    if moved:
        g, old = moved[0]
        return result(
            check,
            subject,
            Status.WARN,
            f"routable RoCE v2 GID {gid_text(g)} moved from index {old} to {g.index} in "
            f"{ctx.interval_text()} (link flap or address change): jobs that cached index "
            f"{old} (NCCL_IB_GID_INDEX, NCCL's GID cache) must be restarted",
            {"gidIndex": g.index, "previousGidIndex": old, "gid": gid_text(g)},
            {**expected, "unchanged": True},
        )
    g = now[0]
    if not moved and before and not any(x.gid in before for x in now):
        old_gid, old = min(before.items(), key=lambda kv: kv[1])
        if old != g.index:
            return result(
                check,
                subject,
                Status.WARN,
                f"the routable RoCE v2 GID changed from {shown[old_gid]} at index {old} to "
                f"{gid_text(g)} at index {g.index} in {ctx.interval_text()}: jobs that cached "
                f"index {old} must be restarted",
                {"gidIndex": g.index, "previousGidIndex": old, "gid": gid_text(g)},
                {**expected, "unchanged": True},
            )
    return result(
        check,
        subject,
        Status.PASS,
        f"routable RoCE v2 GID at index {g.index} ({gid_text(g)}), unchanged in "
        f"{ctx.interval_text()}",
        {"gidIndex": g.index, "gid": gid_text(g)},
        {**expected, "unchanged": True},
    )
