"""What every check function receives: the snapshot, the expectations, the judged subjects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from pydantic import JsonValue

from netval.agent.checks.driver_discovery import FoundDriver, rdma_device_driver
from netval.agent.checks.drivers import DriverCounters
from netval.agent.checks.judged import Judged
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.model.snapshot import Netdev, NodeSnapshot, RdmaPort
from netval.model.spec import Checks


@dataclass(frozen=True, slots=True)
class CheckContext:
    snapshot: NodeSnapshot
    checks: Checks
    judged: Judged

    @property
    def node(self) -> str:
        return self.snapshot.node

    def netdev_pair(self, name: str) -> tuple[Netdev | None, Netdev | None]:
        return self.snapshot.first.netdevs.get(name), self.snapshot.last.netdevs.get(name)

    def interval_text(self) -> str:
        return f"{self.snapshot.elapsed_seconds:g}s"


def result(
    check: CheckId,
    subject: str,
    status: Status,
    message: str,
    observed: Mapping[str, object] | None = None,
    expected: Mapping[str, object] | None = None,
) -> CheckResult:
    # Values are ints, floats, strings, bools, None or lists of them; pydantic validates
    # them as JSON values on construction.
    return CheckResult(
        check=check,
        subject=subject,
        status=status,
        message=message,
        observed=cast(dict[str, JsonValue], dict(observed or {})),
        expected=cast(dict[str, JsonValue], dict(expected or {})),
    )


def skipped(check: CheckId, subject: str, reason: str) -> CheckResult:
    return result(check, subject, Status.SKIP, reason)


NO_DELTAS = "needs two samples to judge counter deltas"


def port_counter_inputs(
    ctx: CheckContext, check: CheckId, port: RdmaPort, unknown_driver: str
) -> tuple[DriverCounters, dict[str, int] | None] | CheckResult:
    """For a counter check on an RDMA port: its driver's counter names and the port's
    hw_counters in the first sample, or the skip that says why the port is not judged.
    `unknown_driver` prefixes the skip when no driver map applies."""
    if not ctx.snapshot.has_deltas:
        return skipped(check, port.subject, NO_DELTAS)
    found = port_driver(ctx, port)
    if found.counters is None:
        return result(
            check,
            port.subject,
            Status.SKIP,
            f"{unknown_driver}: {found.unknown_reason(port.device)}",
            found.observed,
        )
    first_device = ctx.snapshot.first.rdma.get(port.device)
    first_port = first_device.ports.get(port.port) if first_device else None
    return found.counters, first_port.hw_counters if first_port else None


def port_driver(ctx: CheckContext, port: RdmaPort) -> FoundDriver:
    return rdma_device_driver(
        ctx.snapshot.last, port.device, ctx.judged.port_netdev.get(port.subject)
    )


def missing_counters_text(port: RdmaPort, names: Sequence[str], directory: str) -> str:
    """Which counters are missing, naming files the kernel answered with a non-number."""
    parts = []
    for name in names:
        odd = port.unavailable.get(f"{directory}/{name}")
        parts.append(f"{directory}/{name} reads {odd!r}" if odd else name)
    return ", ".join(parts)
