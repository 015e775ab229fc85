"""pfc.priorities, pfc.trust, pfc.pause_storm, pfc.discards."""

from __future__ import annotations

from netval.agent.checks.context import CheckContext, result, skipped
from netval.agent.checks.counters import deltas, per_second
from netval.agent.checks.netdev_counters import missing_text, netdev_counter_inputs
from netval.agent.checks.rate_policy import PAUSE_STORM_WARNING_EVENTS
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.model.snapshot import Netdev


def _no_qos(check: CheckId, ctx: CheckContext) -> list[CheckResult]:
    return [skipped(check, ctx.node, ctx.judged.no_qos_reason("PFC"))]


def _dcb_missing(check: CheckId, name: str, netdev: Netdev | None) -> CheckResult:
    if netdev is None:
        return result(check, name, Status.ERROR, f"interface {name} not found on this node")
    driver = netdev.driver or "unknown"
    error = netdev.dcb_error
    if error in ("EOPNOTSUPP", "ENOTSUP"):
        reason = (
            f"DCB netlink returned {error} for {name} (driver {driver}): the netdev has no "
            "DCB operations (for mlx5_core/bnxt_en: a kernel built without their DCB "
            "support, or a VF/representor)"
        )
    elif error:
        reason = f"DCB netlink read of {name} failed: {error} (driver {driver})"
    else:
        reason = (
            f"DCB state of {name} not recorded (driver {driver}; no dcb/{name}.json and no "
            "reason: a format 1.0 snapshot or a read that was not attempted)"
        )
    return result(check, name, Status.SKIP, reason, {"dcbError": error, "driver": netdev.driver})


def check_priorities(ctx: CheckContext) -> list[CheckResult]:
    if not ctx.judged.qos_netdevs:
        return _no_qos(CheckId.PFC_PRIORITIES, ctx)
    want = ctx.checks.pfc.priorities
    out: list[CheckResult] = []
    for name in ctx.judged.qos_netdevs:
        netdev = ctx.snapshot.last.netdevs.get(name)
        if netdev is None or netdev.dcb is None:
            out.append(_dcb_missing(CheckId.PFC_PRIORITIES, name, netdev))
            continue
        have = sorted(netdev.dcb.pfc_enabled)
        observed = {"priorities": list(have)}
        expected = {"priorities": list(want)}
        if have == want:
            out.append(
                result(
                    CheckId.PFC_PRIORITIES,
                    name,
                    Status.PASS,
                    f"PFC enabled on {have}",
                    observed,
                    expected,
                )
            )
        else:
            missing = sorted(set(want) - set(have))
            extra = sorted(set(have) - set(want))
            parts = []
            if missing:
                parts.append(f"not enabled on {missing} (that traffic is lossy)")
            if extra:
                parts.append(f"also enabled on {extra} (pause can spread to other classes)")
            out.append(
                result(
                    CheckId.PFC_PRIORITIES,
                    name,
                    Status.FAIL,
                    f"PFC enabled on {have or 'no priority'}, expected exactly {want}: "
                    + "; ".join(parts),
                    observed,
                    expected,
                )
            )
    return out


def check_trust(ctx: CheckContext) -> list[CheckResult]:
    if not ctx.judged.qos_netdevs:
        return _no_qos(CheckId.PFC_TRUST, ctx)
    want = ctx.checks.pfc.trust.value
    out: list[CheckResult] = []
    for name in ctx.judged.qos_netdevs:
        netdev = ctx.snapshot.last.netdevs.get(name)
        if netdev is None or netdev.dcb is None:
            out.append(_dcb_missing(CheckId.PFC_TRUST, name, netdev))
            continue
        have = netdev.dcb.trust
        dscp_entries = sum(1 for a in netdev.dcb.app if a.selector == "dscp")
        observed = {"trust": have, "dscpMappings": dscp_entries}
        ok = have == want
        out.append(
            result(
                CheckId.PFC_TRUST,
                name,
                Status.PASS if ok else Status.FAIL,
                f"trust {have} ({dscp_entries} DSCP mapping(s) in the DCB app table)"
                + ("" if ok else f", expected trust {want}"),
                observed,
                {"trust": want},
            )
        )
    return out


def check_pause_storm(ctx: CheckContext) -> list[CheckResult]:
    if not ctx.judged.qos_netdevs:
        return _no_qos(CheckId.PFC_PAUSE_STORM, ctx)
    spec = ctx.checks.pfc
    elapsed_us = ctx.snapshot.elapsed_seconds * 1e6
    out: list[CheckResult] = []
    for name in ctx.judged.qos_netdevs:
        inputs = netdev_counter_inputs(ctx, CheckId.PFC_PAUSE_STORM, name)
        if isinstance(inputs, CheckResult):
            out.append(inputs)
            continue
        driver, first, last = inputs.counters, inputs.first, inputs.last
        storms = deltas(first, last, driver.pause_storm_events)
        if storms:
            out.append(_judge_storm_events(ctx, name, storms))
        for prio in spec.priorities:
            subject = f"{name}/prio{prio}"
            if driver.rx_pause_duration is None or driver.tx_pause_duration is None:
                out.append(
                    result(
                        CheckId.PFC_PAUSE_STORM,
                        subject,
                        Status.SKIP,
                        driver.lacks("per-priority pause-duration counter")
                        + ": pause time is not measurable on this NIC"
                        + (
                            " (its pause-storm events are judged above)"
                            if driver.pause_storm_events
                            else " (drops are judged in pfc.discards)"
                            if driver.discards or driver.prio_discards
                            else ""
                        ),
                        inputs.found.observed,
                    )
                )
                continue
            names = (
                driver.per_prio(driver.rx_pause_duration, prio),
                driver.per_prio(driver.tx_pause_duration, prio),
            )
            got = deltas(first, last, names)
            netdev = ctx.snapshot.last.netdevs.get(name)
            if netdev is not None and netdev.dcb is not None and prio not in netdev.dcb.pfc_enabled:
                # mlx5 lists per-priority pause counters only for PFC-enabled priorities;
                # the missing PFC itself is pfc.priorities' finding.
                out.append(
                    skipped(
                        CheckId.PFC_PAUSE_STORM,
                        subject,
                        f"PFC is not enabled on priority {prio}: no pause to measure "
                        "(see pfc.priorities)",
                    )
                )
                continue
            if elapsed_us <= 0:
                out.append(skipped(CheckId.PFC_PAUSE_STORM, subject, "zero-length sampling window"))
                continue
            if len(got) < 2:
                out.append(
                    skipped(
                        CheckId.PFC_PAUSE_STORM,
                        subject,
                        missing_text(inputs.missing(names), driver),
                    )
                )
                continue
            rx_pct = 100.0 * got[names[0]] / elapsed_us
            tx_pct = 100.0 * got[names[1]] / elapsed_us
            worst_pct = max(rx_pct, tx_pct)
            observed = {"rxPausePercent": round(rx_pct, 3), "txPausePercent": round(tx_pct, 3)}
            expected = {
                "warnPausePercent": spec.warn_pause_percent,
                "maxPausePercent": spec.max_pause_percent,
            }
            text = (
                f"paused {rx_pct:.2f}% (rx, peer asked us) and {tx_pct:.2f}% (tx, we asked the peer) "
                f"of {ctx.interval_text()}"
            )
            if worst_pct > spec.max_pause_percent:
                status, message = (
                    Status.FAIL,
                    f"{text}; expected at most {spec.max_pause_percent:g}%",
                )
            elif worst_pct > spec.warn_pause_percent:
                status, message = Status.WARN, f"{text}; warning above {spec.warn_pause_percent:g}%"
            else:
                status, message = Status.PASS, text
            out.append(
                result(CheckId.PFC_PAUSE_STORM, subject, status, message, observed, expected)
            )
    return out


def _judge_storm_events(ctx: CheckContext, name: str, storms: dict[str, int]) -> CheckResult:
    """The NIC's own pause-storm detector: its warning watermark warns, its error one fails."""
    errors = {k: v for k, v in storms.items() if v and k not in PAUSE_STORM_WARNING_EVENTS}
    warnings = {k: v for k, v in storms.items() if v and k in PAUSE_STORM_WARNING_EVENTS}
    span = ctx.interval_text()
    expected = {k: 0 for k in storms}
    if errors:
        status = Status.FAIL
        message = (
            "pause storm: "
            + ", ".join(f"{k} +{v}" for k, v in {**errors, **warnings}.items())
            + f" in {span} (the NIC kept pausing past its critical stall watermark and "
            "stopped honouring pause); expected none"
        )
    elif warnings:
        status = Status.WARN
        message = (
            "pause storm warning: "
            + ", ".join(f"{k} +{v}" for k, v in warnings.items())
            + f" in {span} (the NIC kept pausing past its warning stall watermark; the error "
            "watermark was not reached)"
        )
    else:
        status, message = Status.PASS, f"no pause-storm events in {span}"
    return result(CheckId.PFC_PAUSE_STORM, name, status, message, {**storms}, expected)


def check_discards(ctx: CheckContext) -> list[CheckResult]:
    if not ctx.judged.qos_netdevs:
        return _no_qos(CheckId.PFC_DISCARDS, ctx)
    out: list[CheckResult] = []
    for name in ctx.judged.qos_netdevs:
        if not ctx.checks.pfc.priorities:
            out.append(
                skipped(
                    CheckId.PFC_DISCARDS,
                    name,
                    "no lossless priority expected (pfc.priorities is empty): a lossy "
                    "fabric may drop",
                )
            )
            continue
        inputs = netdev_counter_inputs(ctx, CheckId.PFC_DISCARDS, name)
        if isinstance(inputs, CheckResult):
            out.append(inputs)
            continue
        driver, first, last = inputs.counters, inputs.first, inputs.last
        # Judge the lossless priorities' own drop counters: port-level drops also count lossy
        # classes (TCP may drop), so they are the fallback for NICs without per-priority
        # counters and otherwise only reported.
        prio_names = (
            tuple(driver.per_prio(driver.prio_discards, p) for p in ctx.checks.pfc.priorities)
            if driver.prio_discards
            else ()
        )
        port_level = deltas(first, last, driver.discards)
        per_priority = deltas(first, last, prio_names)
        got = per_priority or port_level
        if not got:
            names = [*prio_names, *driver.discards]
            out.append(
                skipped(
                    CheckId.PFC_DISCARDS,
                    name,
                    missing_text(names, driver) if names else driver.lacks("discard counter"),
                )
            )
            continue
        if ctx.snapshot.elapsed_seconds <= 0:
            out.append(skipped(CheckId.PFC_DISCARDS, name, "zero-length sampling window"))
            continue
        out.append(_judge_discards(ctx, name, got, port_level, per_priority=bool(per_priority)))
    return out


def _judge_discards(
    ctx: CheckContext,
    name: str,
    got: dict[str, int],
    port_level: dict[str, int],
    *,
    per_priority: bool,
) -> CheckResult:
    limit = ctx.checks.pfc.discards_limit
    elapsed = ctx.snapshot.elapsed_seconds
    total = sum(got.values())
    rate = per_second(total, elapsed)
    grown = ", ".join(f"{k} +{v}" for k, v in got.items() if v)
    observed: dict[str, object] = {
        **port_level,
        **got,
        "total": total,
        "perSecond": round(rate, 6),
        "elapsedSeconds": elapsed,
        "counterLevel": "priority" if per_priority else "port",
    }
    expected = {"maxDiscardsPerSecond": limit}
    span = ctx.interval_text()
    if rate <= limit:
        return result(
            CheckId.PFC_DISCARDS,
            name,
            Status.PASS,
            f"{total} discards in {span} ({rate:.3g}/s)"
            + ("" if per_priority else " (port-level counters, includes lossy classes)"),
            observed,
            expected,
        )
    if not per_priority:
        # Port-level drops count every class: one dropped TCP packet is not a lossless drop.
        return result(
            CheckId.PFC_DISCARDS,
            name,
            Status.WARN,
            f"{grown} in {span} ({rate:.3g}/s): port-level, includes lossy classes (this NIC "
            "has no per-priority drop counter, so these are not judged as lossless drops; "
            "the switch's per-priority counters tell)",
            observed,
            expected,
        )
    return result(
        CheckId.PFC_DISCARDS,
        name,
        Status.FAIL,
        f"{grown} in {span} ({rate:.3g}/s); expected at most {limit:g}/s "
        "(a lossless class must not drop)",
        observed,
        expected,
    )
