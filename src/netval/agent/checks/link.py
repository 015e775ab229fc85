"""link.carrier and link.flaps."""

from __future__ import annotations

from netval.agent.checks.context import NO_DELTAS, CheckContext, result, skipped
from netval.agent.checks.counters import CARRIER_CHANGES_BITS, delta
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult

# operstate "unknown" is what drivers without operstate support (and lo) report while
# passing traffic; carrier is the authority there.
_UP_OPERSTATES = ("up", "unknown")


def check_carrier(ctx: CheckContext) -> list[CheckResult]:
    # Netdevs of RDMA ports that checks.select leaves out: said once, here.
    excluded = [
        skipped(CheckId.LINK_CARRIER, name, f"not judged: {why}")
        for name, why in sorted((ctx.judged.excluded or {}).items())
        if name in ctx.snapshot.last.netdevs and name not in ctx.judged.link_netdevs
    ]
    if not ctx.judged.link_netdevs:
        return excluded or [skipped(CheckId.LINK_CARRIER, ctx.node, _nothing_judged())]
    out: list[CheckResult] = excluded
    for name in ctx.judged.link_netdevs:
        netdev = ctx.snapshot.last.netdevs.get(name)
        expected = {"carrier": 1, "operstate": "up"}
        if netdev is None:
            out.append(
                result(
                    CheckId.LINK_CARRIER,
                    name,
                    Status.FAIL,
                    f"interface {name} not found on this node",
                    expected=expected,
                )
            )
            continue
        observed = {"carrier": netdev.carrier, "operstate": netdev.operstate}
        if netdev.carrier == 1 and netdev.operstate in _UP_OPERSTATES:
            status, message = Status.PASS, f"carrier up (operstate {netdev.operstate})"
        elif netdev.carrier is None:
            # sysfs refuses to read carrier (EINVAL) while the interface is admin down.
            status = Status.FAIL
            message = (
                f"carrier unreadable, interface is administratively down "
                f"(operstate {netdev.operstate}); expected carrier up"
            )
        elif netdev.carrier == 1:
            status = Status.FAIL
            message = f"carrier up but operstate {netdev.operstate}; expected operstate up"
        else:
            status = Status.FAIL
            message = f"no carrier (carrier {netdev.carrier}, operstate {netdev.operstate}); expected carrier up"
        out.append(result(CheckId.LINK_CARRIER, name, status, message, observed, expected))
    return out


def check_flaps(ctx: CheckContext) -> list[CheckResult]:
    if not ctx.judged.link_netdevs:
        return [skipped(CheckId.LINK_FLAPS, ctx.node, _nothing_judged())]
    limit = ctx.checks.link.max_carrier_changes
    out: list[CheckResult] = []
    for name in ctx.judged.link_netdevs:
        if not ctx.snapshot.has_deltas:
            out.append(skipped(CheckId.LINK_FLAPS, name, NO_DELTAS))
            continue
        first, last = ctx.netdev_pair(name)
        changes = delta(
            first.carrier_changes if first else None,
            last.carrier_changes if last else None,
            width=CARRIER_CHANGES_BITS,
        )
        if changes is None:
            reason = (
                f"interface {name} not found on this node"
                if last is None
                else f"carrier_changes of {name} not readable"
            )
            out.append(skipped(CheckId.LINK_FLAPS, name, reason))
            continue
        flaps = (changes + 1) // 2
        observed = {"carrierChanges": changes, "flaps": flaps}
        expected = {"maxCarrierChanges": limit}
        text = f"carrier changed {changes} times ({flaps} flaps) in {ctx.interval_text()}"
        if changes > limit:
            out.append(
                result(
                    CheckId.LINK_FLAPS,
                    name,
                    Status.FAIL,
                    f"{text}; expected at most {limit}",
                    observed,
                    expected,
                )
            )
        else:
            out.append(result(CheckId.LINK_FLAPS, name, Status.PASS, text, observed, expected))
    return out


def _nothing_judged() -> str:
    return "no RDMA netdevs on this node and no interfaces named in checks.link.interfaces"
