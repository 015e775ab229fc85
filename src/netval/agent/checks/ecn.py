"""ecn.np_enabled, ecn.rp_enabled (per priority) and ecn.cnp_flow (per RDMA port)."""

from __future__ import annotations

from netval.agent.checks.context import (
    CheckContext,
    port_counter_inputs,
    result,
    skipped,
)
from netval.agent.checks.counters import deltas
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult

_ROLE = {
    CheckId.ECN_NP_ENABLED: ("roce_np", "notification point (sends CNPs for marked packets)"),
    CheckId.ECN_RP_ENABLED: ("roce_rp", "reaction point (slows down on CNPs)"),
}


def _check_enabled(ctx: CheckContext, check: CheckId) -> list[CheckResult]:
    if not ctx.judged.qos_netdevs:
        return [skipped(check, ctx.node, ctx.judged.no_qos_reason("ECN"))]
    directory, role = _ROLE[check]
    want = ctx.checks.ecn_priorities
    out: list[CheckResult] = []
    for name in ctx.judged.qos_netdevs:
        netdev = ctx.snapshot.last.netdevs.get(name)
        if netdev is None:
            out.append(
                result(check, name, Status.ERROR, f"interface {name} not found on this node")
            )
            continue
        enables = netdev.ecn_np if check is CheckId.ECN_NP_ENABLED else netdev.ecn_rp
        if not enables:
            out.append(
                skipped(
                    check,
                    name,
                    f"no ECN controls in sysfs for {name} (ecn/{directory}/enable; driver "
                    f"{netdev.driver or 'unknown'})",
                )
            )
            continue
        enabled_on = sorted(p for p, on in enables.items() if on)
        for prio in want:
            subject = f"{name}/prio{prio}"
            value = enables.get(prio)
            observed = {"enabled": value, "enabledPriorities": list(enabled_on)}
            expected = {"enabled": True, "priorities": list(want)}
            if value is None:
                out.append(skipped(check, subject, f"ecn/{directory}/enable/{prio} not readable"))
            elif value:
                out.append(
                    result(check, subject, Status.PASS, f"ECN {role} enabled", observed, expected)
                )
            else:
                out.append(
                    result(
                        check,
                        subject,
                        Status.FAIL,
                        f"ECN {role} disabled on priority {prio} (enabled on "
                        f"{enabled_on or 'no priority'}); expected enabled on {want}, "
                        "the priorities PFC protects",
                        observed,
                        expected,
                    )
                )
    return out


def check_np_enabled(ctx: CheckContext) -> list[CheckResult]:
    return _check_enabled(ctx, CheckId.ECN_NP_ENABLED)


def check_rp_enabled(ctx: CheckContext) -> list[CheckResult]:
    return _check_enabled(ctx, CheckId.ECN_RP_ENABLED)


def check_cnp_flow(ctx: CheckContext) -> list[CheckResult]:
    ports = ctx.judged.qos_ports()
    if not ports:
        return [skipped(CheckId.ECN_CNP_FLOW, ctx.node, ctx.judged.no_qos_reason("ECN"))]
    spec = ctx.checks.ecn
    out: list[CheckResult] = []
    for port in ports:
        subject = port.subject
        inputs = port_counter_inputs(
            ctx, CheckId.ECN_CNP_FLOW, port, f"unknown RDMA driver for {port.device}"
        )
        if isinstance(inputs, CheckResult):
            out.append(inputs)
            continue
        driver, first_hw = inputs
        names = (
            driver.np_ecn_marked,
            driver.np_cnp_sent,
            driver.rp_cnp_handled,
            driver.rp_cnp_ignored,
        )
        got = deltas(first_hw, port.hw_counters, names)
        if len(got) < len(names):
            missing = [n for n in names if n not in got]
            out.append(
                skipped(
                    CheckId.ECN_CNP_FLOW, subject, f"congestion counters {missing} not readable"
                )
            )
            continue
        marked, sent, handled, ignored = (got[n] for n in names)
        observed = {
            "ecnMarked": marked,
            "cnpSent": sent,
            "cnpHandled": handled,
            "cnpIgnored": ignored,
        }
        expected = {
            "maxCnpIgnoredPerInterval": spec.max_cnp_ignored_per_interval,
            "minMarksForCnp": spec.min_marks_for_cnp,
        }
        span = ctx.interval_text()
        if ignored > spec.max_cnp_ignored_per_interval:
            status = Status.FAIL
            message = (
                f"{ignored} CNPs ignored in {span} ({handled} handled): senders are not slowing "
                "down on congestion (ECN reaction point disabled?); expected at most "
                f"{spec.max_cnp_ignored_per_interval}"
            )
        elif marked >= spec.min_marks_for_cnp and sent == 0:
            status = Status.FAIL
            message = (
                f"{marked} ECN-marked RoCE packets received in {span} but no CNP sent "
                "(ECN notification point disabled?); expected CNPs for marked packets"
            )
        else:
            status = Status.PASS
            message = (
                f"{marked} marked, {sent} CNPs sent, {handled} handled, {ignored} ignored in {span}"
            )
        out.append(result(CheckId.ECN_CNP_FLOW, subject, status, message, observed, expected))
    return out
