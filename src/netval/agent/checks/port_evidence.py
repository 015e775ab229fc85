"""Evidence on an RDMA port's own link in the same window: what turns requester-side retry
counters from a warning into a local failure (docs/checks.md, "Attribution").

Requester-side retries and timeouts rise on every node that talks to a peer that died, so
alone they accuse no one. What does point at this node is its own port misbehaving in the
same window: the link down or flapping, errors past FEC or PHY link drops, drops on the
lossless priority, a pause storm, IB link errors. Those are already judged by their own
checks; the evidence is exactly their `fail` results on this port's subjects, from the same
check functions run on the same snapshot. Nothing is judged a second, different way: a port
shows evidence precisely when that check fails it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

from netval.agent.checks import infiniband, link, pfc, port_counters, rdma
from netval.agent.checks.context import CheckContext
from netval.model.attribution import Evidence
from netval.model.ids import Status
from netval.model.results import CheckResult
from netval.model.snapshot import RdmaPort

_CheckFn = Callable[[CheckContext], list[CheckResult]]

# The checks whose failure on a port's subjects is evidence against that port, in the order
# the evidence is named.
EVIDENCE_CHECKS: Final[tuple[tuple[Evidence, _CheckFn], ...]] = (
    (Evidence.PORT_DOWN, rdma.check_port_state),
    (Evidence.LINK_DOWN, link.check_carrier),
    (Evidence.LINK_FLAPS, link.check_flaps),
    (Evidence.PHY_ERRORS, port_counters.check_phy_errors),
    (Evidence.IB_PORT_ERRORS, infiniband.check_port_errors),
    (Evidence.PFC_DISCARDS, pfc.check_discards),
    (Evidence.PAUSE_STORM, pfc.check_pause_storm),
)
_PRIORITY_SUFFIX: Final = re.compile(r"/prio[0-7]$")


def port_subjects(ctx: CheckContext, port: RdmaPort) -> frozenset[str]:
    """The subjects that are this port: the RDMA port, the netdev carrying its traffic and,
    for a bond (RoCE LAG), the NIC ports below it, which hold the PHY and PFC counters."""
    subjects = {port.subject}
    name = ctx.judged.port_netdev.get(port.subject)
    if name is not None:
        subjects.add(name)
        netdev = ctx.snapshot.last.netdevs.get(name)
        if netdev is not None:
            subjects.update(netdev.ports_below)
    return frozenset(subjects)


class PortEvidence:
    """The evidence checks' failing subjects, computed at most once per context and only
    when a requester-side counter asks (a clean cycle runs none of them twice)."""

    def __init__(self, ctx: CheckContext) -> None:
        self._ctx = ctx
        self._failing: dict[Evidence, frozenset[str]] | None = None

    def for_port(self, port: RdmaPort) -> list[Evidence]:
        mine = port_subjects(self._ctx, port)
        return [e for e, failed in self._failures().items() if failed & mine]

    def _failures(self) -> dict[Evidence, frozenset[str]]:
        if self._failing is None:
            self._failing = {e: _failed_subjects(check, self._ctx) for e, check in EVIDENCE_CHECKS}
        return self._failing


def _failed_subjects(check: _CheckFn, ctx: CheckContext) -> frozenset[str]:
    """The subjects `check` fails (a priority subject counts for its netdev)."""
    try:
        results = check(ctx)
    except Exception:  # that check's own run reports the error: it is no evidence here
        return frozenset()
    return frozenset(
        _PRIORITY_SUFFIX.sub("", r.subject) for r in results if r.status is Status.FAIL
    )
