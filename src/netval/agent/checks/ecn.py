"""ecn.np_enabled, ecn.rp_enabled (per priority) and ecn.cnp_flow (per RDMA port)."""

from __future__ import annotations

from netval.agent.checks.context import (
    CheckContext,
    missing_counters_text,
    port_counter_inputs,
    port_driver,
    result,
    skipped,
)
from netval.agent.checks.counters import delta, hw_counter_width
from netval.agent.checks.driver_discovery import netdev_driver
from netval.agent.checks.drivers import DriverCounters, pick
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.model.snapshot import RdmaPort
from netval.model.spec import EcnMode

_ROLE = {
    CheckId.ECN_NP_ENABLED: ("roce_np", "notification point (sends CNPs for marked packets)"),
    CheckId.ECN_RP_ENABLED: ("roce_rp", "reaction point (slows down on CNPs)"),
}


_MODE_NONE = (
    "not applicable: checks.ecn.mode is none (the fabric runs without ECN-based congestion control)"
)


def _check_enabled(ctx: CheckContext, check: CheckId) -> list[CheckResult]:
    if not ctx.judged.qos_netdevs:
        return [skipped(check, ctx.node, ctx.judged.no_qos_reason("ECN"))]
    if ctx.checks.ecn.mode is EcnMode.NONE:
        return [skipped(check, name, _MODE_NONE) for name in ctx.judged.qos_netdevs]
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
        found = netdev_driver(ctx.snapshot.last, name)
        if found.counters is not None and found.counters.no_qos_reason:
            out.append(skipped(check, name, f"not applicable: {found.counters.no_qos_reason}"))
            continue
        if not enables:
            out.append(
                skipped(
                    check,
                    name,
                    f"no ECN controls in sysfs for {name} (ecn/{directory}/enable is the "
                    f"MLNX_OFED/DOCA mlx5_core interface; driver {netdev.driver or 'unknown'} "
                    "sets ECN elsewhere, e.g. in firmware): its effect is judged by "
                    "ecn.cnp_flow",
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


_NO_CONGESTION = (
    " (the port exposes no congestion counters at all: a VF or representor has none, judge the PF)"
)


def _congestion_deltas(
    driver: DriverCounters, first_hw: dict[str, int] | None, port: RdmaPort
) -> tuple[dict[str, int], dict[str, str], list[str]]:
    """(deltas by signal, the counter name read per signal, missing counters). A signal
    the driver has no counter for is not required; "CNP ignored" is optional (bnxt_re and
    ionic have none) unless the port exposes it."""
    got: dict[str, int] = {}
    chosen: dict[str, str] = {}
    missing: list[str] = []
    for key, names in driver.congestion_signals.items():
        name = pick(port.hw_counters, names)
        if name is None:
            if names and key != "cnpIgnored":
                missing.append("/".join(names))
            continue
        chosen[key] = name
        d = delta(
            first_hw.get(name) if first_hw else None,
            port.hw_counters[name],
            width=hw_counter_width(driver.name, name),
        )
        if d is None:
            missing.append(name)
        else:
            got[key] = d
    return got, chosen, missing


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
        found = port_driver(ctx, port)
        if driver.no_qos_reason:
            out.append(
                result(
                    CheckId.ECN_CNP_FLOW,
                    subject,
                    Status.SKIP,
                    f"not applicable: {driver.no_qos_reason}",
                    found.observed,
                )
            )
            continue
        got, chosen, missing = _congestion_deltas(driver, first_hw, port)
        if missing:
            out.append(
                result(
                    CheckId.ECN_CNP_FLOW,
                    subject,
                    Status.SKIP,
                    f"{driver.name} congestion counter(s) "
                    f"{missing_counters_text(port, missing, 'hw_counters')} not readable"
                    + ("" if chosen else _NO_CONGESTION),
                    found.observed,
                )
            )
            continue
        marked = got.get("ecnMarked", 0)
        sent = got.get("cnpSent", 0)
        handled = got.get("cnpHandled", 0)
        ignored = got.get("cnpIgnored")
        observed: dict[str, object] = {
            "ecnMarked": marked,
            "cnpSent": sent,
            "cnpHandled": handled,
            "cnpIgnored": ignored,
            "counters": list(chosen.values()),
            **found.observed,
        }
        expected: dict[str, object] = {
            "mode": spec.mode.value,
            "maxCnpIgnoredPerInterval": spec.max_cnp_ignored_per_interval,
            "minMarksForCnp": spec.min_marks_for_cnp,
        }
        span = ctx.interval_text()
        counts = f"{marked} marked, {sent} CNPs sent, {handled} handled" + (
            f", {ignored} ignored" if ignored is not None else ""
        )
        if spec.mode is EcnMode.NONE:
            status = Status.PASS
            message = f"{counts} in {span} (checks.ecn.mode none: CNP flow is reported, not judged)"
        elif ignored is not None and ignored > spec.max_cnp_ignored_per_interval:
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
            message = f"{counts} in {span}"
        out.append(result(CheckId.ECN_CNP_FLOW, subject, status, message, observed, expected))
    return out
