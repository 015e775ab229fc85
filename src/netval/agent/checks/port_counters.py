"""pfc.global_pause (802.3x link-level pause) and link.phy_errors (PHY/FEC/FCS counters).

Both read a physical port's ethtool statistics (the bond's slaves on a RoCE LAG). Global
pause stops every traffic class at once: on a 400G link it can take a fifth of the time
with every drop counter at zero, so PFC's per-priority counters look clean while jobs
crawl. PHY errors after FEC (symbol errors, FCS errors) and PHY link-down events mean a
bad cable, optic or port; FEC-corrected bits are normal on a healthy PAM4 link and are only
reported, as a pre-FEC bit error ratio. Errors past FEC are judged as a post-FEC bit error
ratio against the IEEE 802.3 objective (rate_policy.BER_LIMITS): a 400G link within spec
still shows about one per 30 s.
"""

from __future__ import annotations

from netval.agent.checks.context import CheckContext, result, skipped
from netval.agent.checks.counters import deltas
from netval.agent.checks.netdev_counters import (
    NetdevCounters,
    missing_text,
    netdev_counter_inputs,
)
from netval.agent.checks.rate_policy import LINK_DOWN_COUNTERS, ber_allowance, default_ber_limit
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult


def _none(check: CheckId, ctx: CheckContext) -> list[CheckResult]:
    return [skipped(check, ctx.node, ctx.judged.no_qos_reason("port counters"))]


def check_global_pause(ctx: CheckContext) -> list[CheckResult]:
    check = CheckId.PFC_GLOBAL_PAUSE
    if not ctx.judged.qos_netdevs:
        return _none(check, ctx)
    elapsed_us = ctx.snapshot.elapsed_seconds * 1e6
    out: list[CheckResult] = []
    for name in ctx.judged.qos_netdevs:
        inputs = netdev_counter_inputs(ctx, check, name)
        if isinstance(inputs, CheckResult):
            out.append(inputs)
            continue
        driver = inputs.counters
        if not driver.global_pause:
            out.append(skipped(check, name, driver.lacks("802.3x pause counter")))
            continue
        frames = deltas(inputs.first, inputs.last, driver.global_pause)
        durations = deltas(inputs.first, inputs.last, driver.global_pause_duration)
        if not frames and not durations:
            # mlx5 lists rx/tx_global_pause only while global pause is configured: their
            # absence on a port with PFC is the healthy case, not a blind spot.
            netdev = ctx.snapshot.last.netdevs.get(name)
            if netdev is not None and netdev.dcb is not None and netdev.dcb.pfc_enabled:
                out.append(
                    result(
                        check,
                        name,
                        Status.PASS,
                        f"no 802.3x pause counters listed: {name} runs PFC on "
                        f"{sorted(netdev.dcb.pfc_enabled)}, not global pause",
                        {"pfcEnabled": sorted(netdev.dcb.pfc_enabled), **inputs.found.observed},
                        {"globalPauseFrames": 0},
                    )
                )
            else:
                out.append(
                    skipped(
                        check,
                        name,
                        missing_text(inputs.missing(driver.global_pause), driver)
                        + " and PFC state unknown (a driver may list them only while "
                        "link-level pause is configured)",
                    )
                )
            continue
        total_frames = sum(frames.values())
        observed: dict[str, object] = {**frames, **durations}
        pct = None
        if durations and elapsed_us > 0:
            pct = round(100.0 * max(durations.values()) / elapsed_us, 3)
            observed["pausePercent"] = pct
        expected = {"globalPauseFrames": 0}
        span = ctx.interval_text()
        if total_frames or any(durations.values()):
            share = f", paused {pct:g}% of the window" if pct is not None else ""
            out.append(
                result(
                    check,
                    name,
                    Status.FAIL,
                    ", ".join(f"{k} +{v}" for k, v in {**frames, **durations}.items() if v)
                    + f" in {span}{share}: 802.3x global pause stops every traffic class, "
                    "lossy ones included; expected none (disable link-level flow control: "
                    "ethtool -A <if> rx off tx off, and use PFC on the lossless priority)",
                    observed,
                    expected,
                )
            )
        else:
            out.append(
                result(check, name, Status.PASS, f"no 802.3x pause in {span}", observed, expected)
            )
    return out


def check_phy_errors(ctx: CheckContext) -> list[CheckResult]:
    check = CheckId.LINK_PHY_ERRORS
    if not ctx.judged.qos_netdevs:
        return _none(check, ctx)
    out: list[CheckResult] = []
    for name in ctx.judged.qos_netdevs:
        inputs = netdev_counter_inputs(ctx, check, name)
        if isinstance(inputs, CheckResult):
            out.append(inputs)
            continue
        driver = inputs.counters
        if not driver.phy_errors:
            out.append(skipped(check, name, driver.lacks("PHY error counter")))
            continue
        errors = deltas(inputs.first, inputs.last, driver.phy_errors)
        if not errors:
            out.append(
                skipped(check, name, missing_text(inputs.missing(driver.phy_errors), driver))
            )
            continue
        out.append(_judge_phy(ctx, inputs, errors))
    return out


def _judge_phy(ctx: CheckContext, inputs: NetdevCounters, errors: dict[str, int]) -> CheckResult:
    """Link-down events fail on any growth; errors past FEC are judged as a bit error ratio
    against the IEEE 802.3 objective for the port's speed (rate_policy.BER_LIMITS)."""
    check, name, driver = CheckId.LINK_PHY_ERRORS, inputs.name, inputs.counters
    corrected = deltas(inputs.first, inputs.last, driver.phy_corrected)
    observed: dict[str, object] = {**errors, **corrected}
    netdev = ctx.snapshot.last.netdevs.get(name)
    speed = netdev.speed_mbps if netdev is not None and netdev.speed_mbps else None
    bits = speed * 1e6 * ctx.snapshot.elapsed_seconds if speed else 0.0
    if corrected and bits > 0:
        observed["preFecBer"] = float(f"{sum(corrected.values()) / bits:.3e}")
    missing = inputs.missing(driver.phy_errors)
    if missing:
        observed["missing"] = missing
    span = ctx.interval_text()
    downs = {k: v for k, v in errors.items() if v and k in LINK_DOWN_COUNTERS}
    # Symbol errors past FEC and FCS errors count the same damaged frames: the larger one.
    post_fec = max((v for k, v in errors.items() if k not in LINK_DOWN_COUNTERS), default=0)
    limit = ctx.checks.link.max_post_fec_ber or (default_ber_limit(speed) if speed else None)
    expected: dict[str, object] = {
        **{k: 0 for k in errors if k in LINK_DOWN_COUNTERS},
        "maxPostFecBer": limit,
    }
    if bits > 0:
        observed["postFecBer"] = float(f"{post_fec / bits:.3e}")
    grown = ", ".join(f"{k} +{v}" for k, v in errors.items() if v)
    if downs:
        return result(
            check,
            name,
            Status.FAIL,
            f"{grown} in {span}: the PHY dropped the link (cable, optic or port); expected none",
            observed,
            expected,
        )
    if post_fec and (bits <= 0 or limit is None):
        return result(
            check,
            name,
            Status.WARN,
            f"{grown} in {span}: errors past FEC, but the link speed of {name} is unknown, "
            "so the bit error ratio cannot be judged",
            observed,
            expected,
        )
    ber_note = ""
    if bits > 0 and limit is not None:
        allowed = ber_allowance(bits, limit)
        observed["allowedPostFecErrors"] = allowed
        ber = post_fec / bits
        ber_note = f", post-FEC BER {ber:.2e} (limit {limit:g})"
        if post_fec > allowed:
            return result(
                check,
                name,
                Status.FAIL,
                f"{grown} in {span}{ber_note}: more errors past FEC than a link at the IEEE "
                f"802.3 limit shows ({allowed} at most in this window); a cable, optic or "
                "port is bad",
                observed,
                expected,
            )
    pre = observed.get("preFecBer")
    note = f", pre-FEC BER {pre}" if pre is not None else ""
    text = f"{grown} in {span}{ber_note} (within spec)" if post_fec else f"no PHY errors in {span}"
    return result(check, name, Status.PASS, text + note, observed, expected)
