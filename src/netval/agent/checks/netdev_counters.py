"""Inputs of the netdev counter checks (ethtool -S deltas), or the skip that says why not."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from netval.agent.checks.context import NO_DELTAS, CheckContext, result, skipped
from netval.agent.checks.driver_discovery import FoundDriver, netdev_driver
from netval.agent.checks.drivers import DriverCounters
from netval.model.ids import CheckGroup, CheckId, Status
from netval.model.results import CheckResult


@dataclass(frozen=True, slots=True)
class NetdevCounters:
    name: str
    counters: DriverCounters
    found: FoundDriver
    first: dict[str, int]
    last: dict[str, int]

    def missing(self, names: Iterable[str]) -> list[str]:
        return [n for n in names if n not in self.first or n not in self.last]


def _is_vport(stats: dict[str, int]) -> bool:
    """A switchdev representor or VF: vport_* statistics and no port (_phy) ones."""
    # (the _phy test first: a port netdev has many, so the usual answer comes at once)
    return not any(k.endswith("_phy") for k in stats) and any(k.startswith("vport_") for k in stats)


def netdev_counter_inputs(
    ctx: CheckContext, check: CheckId, name: str
) -> NetdevCounters | CheckResult:
    if not ctx.snapshot.has_deltas:
        return skipped(check, name, NO_DELTAS)
    first, last = ctx.netdev_pair(name)
    if last is None:
        return result(check, name, Status.ERROR, f"interface {name} not found on this node")
    found = netdev_driver(ctx.snapshot.last, name)
    if found.counters is None:
        return result(check, name, Status.SKIP, found.unknown_reason(name), found.observed)
    if found.counters.no_qos_reason and check.group is CheckGroup.PFC:
        return result(check, name, Status.SKIP, f"not applicable: {found.counters.no_qos_reason}")
    if first is None or first.ethtool is None or last.ethtool is None:
        return skipped(
            check,
            name,
            f"ethtool statistics of {name} not readable (ETHTOOL_GSTATS gave none; a recorded "
            f"snapshot has no ethtool/{name}.json)",
        )
    if _is_vport(last.ethtool):
        return result(
            check,
            name,
            Status.SKIP,
            f"{name} is a switchdev representor or virtual function: its statistics are "
            "vport_* counters only; pause, drop and PHY counters are judged on the uplink "
            "(PF) netdev",
            found.observed,
        )
    return NetdevCounters(name, found.counters, found, first.ethtool, last.ethtool)


def missing_text(names: Iterable[str], driver: DriverCounters) -> str:
    return f"{driver.name} counter(s) {', '.join(names)} not in ethtool -S"
