"""ib.port_errors: the IB PortCounters error counters of InfiniBand ports, as deltas.

`/sys/class/infiniband/<dev>/ports/<n>/counters/<name>` are the PMA PortCounters
(drivers/infiniband/core/sysfs.c, Documentation/ABI/stable/sysfs-class-infiniband). They are
the main health signal of every IB fabric and the only one on HCAs without hw_counters.
Unlike hw_counters they do not wrap: the IB spec (PortCounters attribute) makes them
saturate at their width's maximum until the subnet manager or `perfquery -x` clears them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from netval.agent.checks.context import NO_DELTAS, CheckContext, result, skipped
from netval.agent.checks.counters import IB_PORT_COUNTER_BITS
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.model.snapshot import RdmaPort, Transport
from netval.model.spec import IbCounterLimits


@dataclass(frozen=True, slots=True)
class IbCounter:
    name: str  # the file name under counters/
    limit_field: str  # IbCounterLimits field
    meaning: str

    @property
    def bits(self) -> int:
        """PortCounters width: the one width table (counters.py)."""
        return IB_PORT_COUNTER_BITS[self.name]

    @property
    def saturated(self) -> int:
        return (1 << self.bits) - 1


ERROR_COUNTERS: Final = (
    IbCounter("symbol_error", "symbol_error", "minor link errors on a lane"),
    IbCounter("link_error_recovery", "link_error_recovery", "link retrained"),
    IbCounter("link_downed", "link_downed", "link went down"),
    IbCounter("port_rcv_errors", "port_rcv_errors", "malformed packets received"),
    IbCounter("port_xmit_discards", "port_xmit_discards", "packets dropped on send"),
    IbCounter(
        "excessive_buffer_overrun_errors",
        "excessive_buffer_overrun_errors",
        "receive buffer overruns (flow control broken)",
    ),
    IbCounter(
        "local_link_integrity_errors",
        "local_link_integrity_errors",
        "physical errors over the local link integrity threshold",
    ),
    IbCounter("VL15_dropped", "vl15_dropped", "subnet management packets dropped"),
)


def port_counter_names() -> tuple[str, ...]:
    """The counters/ files collectors read (only these: reading one costs a PMA MAD)."""
    return tuple(c.name for c in ERROR_COUNTERS)


def _limit(limits: IbCounterLimits, counter: IbCounter) -> int:
    value: int = getattr(limits, counter.limit_field)
    return value


_COUNTERS_DIR = "/sys/class/infiniband/{dev}/ports/{port}/counters"

_NOT_IB = {
    Transport.ROCE: "not applicable: RoCE port (its link errors are Ethernet counters)",
    Transport.IWARP: "not applicable: iWARP port",
    Transport.UNKNOWN: "not applicable: link layer unreadable, not known to be InfiniBand",
    Transport.EFA: "not applicable: EFA port (SRD, no IB PortCounters; its error counters "
    "are judged by rdma.errors)",
    Transport.UNSPECIFIED: "not applicable: link layer neither Ethernet nor InfiniBand",
}


def check_port_errors(ctx: CheckContext) -> list[CheckResult]:
    if not ctx.judged.ports:
        return [
            skipped(
                CheckId.IB_PORT_ERRORS,
                ctx.node,
                "no RDMA devices on this node (/sys/class/infiniband)",
            )
        ]
    out: list[CheckResult] = []
    for port in ctx.judged.ports:
        transport = ctx.judged.transport(port)
        if transport is not Transport.INFINIBAND:
            out.append(skipped(CheckId.IB_PORT_ERRORS, port.subject, _NOT_IB[transport]))
            continue
        out.append(_judge(ctx, port))
    return out


def _judge(ctx: CheckContext, port: RdmaPort) -> CheckResult:
    check, subject = CheckId.IB_PORT_ERRORS, port.subject
    where = _COUNTERS_DIR.format(dev=port.device, port=port.port)
    if not ctx.snapshot.has_deltas:
        return skipped(check, subject, NO_DELTAS)
    no_pma = [k for k in port.unavailable if k.startswith("counters/")]
    if no_pma and not port.counters:
        return skipped(
            check,
            subject,
            f"{where}/* read 'N/A (no PMA)': the device has no performance management agent",
        )
    first_device = ctx.snapshot.first.rdma.get(port.device)
    first_port = first_device.ports.get(port.port) if first_device else None
    before = first_port.counters if first_port else {}
    limits = ctx.checks.infiniband.max_counter_deltas
    grown: dict[str, int] = {}
    saturated: list[str] = []
    unreadable: list[str] = []
    for counter in ERROR_COUNTERS:
        first, last = before.get(counter.name), port.counters.get(counter.name)
        if first is None or last is None:
            unreadable.append(counter.name)
            continue
        if last == counter.saturated and first == counter.saturated:
            saturated.append(counter.name)
            continue
        # Cleared in between (perfquery -x, the SM's sweep): all we know is its new value.
        grown[counter.name] = last - first if last >= first else last
    if not grown and not saturated:
        return skipped(
            check,
            subject,
            f"not readable (absent or 'N/A (no PMA)'): {where}/{{{','.join(unreadable)}}}",
        )
    over = {
        c.name: grown[c.name]
        for c in ERROR_COUNTERS
        if c.name in grown and grown[c.name] > _limit(limits, c)
    }
    nonzero = {k: v for k, v in grown.items() if v}
    expected = {
        "maxCounterDeltas": {c.name: _limit(limits, c) for c in ERROR_COUNTERS if c.name in grown}
    }
    observed: dict[str, object] = {**grown}
    if saturated:
        observed["saturated"] = saturated
    span = ctx.interval_text()
    notes = []
    if saturated:
        notes.append(
            f"{', '.join(saturated)} saturated at their maximum, new errors are invisible "
            "until cleared (perfquery -x)"
        )
    if unreadable:
        notes.append(f"not readable: {', '.join(unreadable)}")
    tail = ("; " + "; ".join(notes)) if notes else ""
    if over:
        detail = ", ".join(f"{k} +{v} (max {_limit(limits, _by_name(k))})" for k, v in over.items())
        return result(check, subject, Status.FAIL, f"{detail} in {span}{tail}", observed, expected)
    if nonzero or saturated:
        detail = ", ".join(f"{k} +{v}" for k, v in nonzero.items()) or "no growth"
        return result(
            check,
            subject,
            Status.WARN,
            f"{detail} in {span} (within limits){tail}",
            observed,
            expected,
        )
    return result(
        check, subject, Status.PASS, f"no IB port errors in {span}{tail}", observed, expected
    )


def _by_name(name: str) -> IbCounter:
    return next(c for c in ERROR_COUNTERS if c.name == name)
