"""rdma.devices, rdma.port_state, rdma.link_layer, rdma.rate, rdma.errors (GIDs: gid.py)."""

from __future__ import annotations

from netval.agent.checks.context import (
    CheckContext,
    port_counter_inputs,
    result,
    skipped,
)
from netval.agent.checks.counters import hw_deltas, per_second
from netval.agent.checks.rate_policy import CounterFamily, Verdict, family_of
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


def _board(ctx: CheckContext, port: RdmaPort) -> str | None:
    device = ctx.snapshot.last.rdma.get(port.device)
    return device.board_id if device else None


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
    # Without a stated minimum, the ports of one card model on a node are expected to run at
    # one rate: a port that negotiated down (a bad cable or optic) runs below its siblings.
    # Comparing per model (board_id) keeps a 200G storage NIC beside 400G compute NICs from
    # looking degraded.
    fastest: dict[str | None, float] = {}
    for p in ctx.judged.ports:
        p_rate = p.rate_gbps
        if _is_active(p) and p_rate is not None:
            board = _board(ctx, p)
            fastest[board] = max(p_rate, fastest.get(board, p_rate))
    out: list[CheckResult] = []
    for port in ctx.judged.ports:
        minimum, basis = rdma_minimum, "checks.rdma.minRateGbps"
        if ib_minimum is not None and ctx.judged.transport(port) is Transport.INFINIBAND:
            minimum, basis = ib_minimum, "checks.infiniband.minRateGbps"
        if minimum is None:
            basis = "the fastest port of the same card model on this node"
        reference = minimum if minimum is not None else fastest.get(_board(ctx, port))
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
        observed = {"rateGbps": rate, "rate": port.rate}
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


def check_errors(ctx: CheckContext) -> list[CheckResult]:
    if not ctx.judged.ports:
        return _no_devices(CheckId.RDMA_ERRORS, ctx)
    out: list[CheckResult] = []
    for port in ctx.judged.ports:
        inputs = port_counter_inputs(
            ctx,
            CheckId.RDMA_ERRORS,
            port,
            f"unknown RDMA driver for {port.device}: its error counter names are not mapped",
        )
        if isinstance(inputs, CheckResult):
            out.append(inputs)
            continue
        driver, first_hw = inputs
        grown = hw_deltas(driver.name, first_hw, port.hw_counters, driver.rdma_errors)
        if not grown:
            out.append(
                skipped(
                    CheckId.RDMA_ERRORS,
                    port.subject,
                    f"none of the {driver.name} error counters "
                    f"({', '.join(driver.rdma_errors)}) is in hw_counters",
                )
            )
            continue
        if ctx.snapshot.elapsed_seconds <= 0:
            out.append(skipped(CheckId.RDMA_ERRORS, port.subject, "zero-length sampling window"))
            continue
        out.append(judge_error_rates(ctx, port.subject, grown))
    return out


def judge_error_rates(ctx: CheckContext, subject: str, grown: dict[str, int]) -> CheckResult:
    """rdma.errors of one port: each counter's rate against its family's policy
    (rate_policy.py); a family over its limit is named once with its meaning."""
    spec = ctx.checks.rdma
    elapsed = ctx.snapshot.elapsed_seconds
    span = ctx.interval_text()
    over: dict[CounterFamily, list[str]] = {}
    reported: list[str] = []
    rates: dict[str, float] = {}
    for name, count in grown.items():
        rate = per_second(count, elapsed)
        rates[name] = round(rate, 6)
        if not count:
            continue
        family = family_of(name)
        limit = family.limit(spec)
        text = f"{name} +{count} ({rate:.3g}/s)"
        if family.verdict is not Verdict.INFO and limit is not None and rate > limit:
            over.setdefault(family, []).append(text)
        else:
            reported.append(text)
    observed: dict[str, object] = {**grown, "perSecond": rates, "elapsedSeconds": elapsed}
    expected = {
        "maxRetryErrorsPerSecond": spec.retry_errors_limit,
        "warnReceiverErrorsPerSecond": spec.warn_receiver_errors_per_second,
        "warnCompletionErrorsPerSecond": spec.warn_completion_errors_per_second,
    }
    findings = [
        f"{', '.join(texts)} in {span}, over {family.key} limit {family.limit(spec):g}/s "
        f"({family.meaning})"
        for family, texts in sorted(over.items(), key=lambda kv: kv[0].verdict is Verdict.WARN)
    ]
    tail = f"; reported only: {', '.join(reported)}" if reported else ""
    if any(f.verdict is Verdict.FAIL for f in over):
        status = Status.FAIL
    elif over:
        status = Status.WARN
    else:
        status = Status.PASS
    if findings:
        message = "; ".join(findings) + tail
    elif reported:
        message = f"no RDMA counter family over its limit in {span}; {', '.join(reported)}"
    else:
        message = f"no RDMA transport errors in {span}"
    return result(CheckId.RDMA_ERRORS, subject, status, message, observed, expected)
