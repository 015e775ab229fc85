"""Per-NIC health from a node's report, and the memory that NIC recovery needs (pure).

A report's results name subjects; its `nics` section (`netval.model.nics`) says which NIC each
subject belongs to. Digested once per report (`digest`): which NICs fail (fail or error) and
which only warn, with their check ids, and whether a local failure is tied to no NIC (a
storage endpoint, an unlisted netdev, the node's collector, or any failure of a report
without the section): such a failure is the node's, and the node is judged as a whole.
`peer.*` results are about a path, never a NIC's (they make the node warn, as before).

Recovery is counted per NIC as for the node (`gating.recoveryReports`): `tally` counts the
node's reports and matching beats; a NIC's streak is the tally since it last failed, so a
NIC's device taint is lifted only after that many passing reports of it. `over_at[j]` is the
tally at which the node last had more than `j` failing NICs (a failure tied to no NIC counts
as more than any): with `maxFailedDevicesPerNode: k` a node excluded at node level recovers
after that many reports with at most `k` failing NICs. Memory: the NICs of a fleet's nodes are the
same, so their identities are one shared tuple and a passing node's `NicHealth` one shared
object; entries only for NICs that failed within the last MAX_RECOVERY reports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from netval.model.ids import CheckGroup, Status
from netval.model.nics import MAX_NICS, Nic, SubjectIndex
from netval.model.results import Report
from netval.model.sharing import Shared

if TYPE_CHECKING:
    from netval.operator.state.validation import NodeRecord

MAX_FAILED_DEVICES: Final = 16  # spec.gating.maxFailedDevicesPerNode's bound
MAX_RECOVERY: Final = 100  # spec.gating.recoveryReports' bound: older failures are forgotten
BEYOND: Final = MAX_NICS + 1  # the failing count of a failure tied to no NIC

NicChecks = tuple[tuple[str, tuple[str, ...]], ...]  # (NIC, its check ids), by NIC


@dataclass(frozen=True, slots=True)
class NicHealth:
    """A node's NICs as its last report judged them."""

    count: int  # NICs the report lists
    failing: NicChecks = ()  # NICs with a failing (or erroring) result
    warning: NicChecks = ()  # NICs whose worst result warns
    node_level: bool = False  # a local failure tied to no NIC
    identities: tuple[Nic, ...] = ()  # every NIC of the report (shared across nodes)

    @property
    def failing_count(self) -> int:
        return BEYOND if self.node_level else len(self.failing)

    def identity(self, nic: str) -> Nic | None:
        return next((n for n in self.identities if n.rdma_device == nic), None)


# A fleet's nodes have the same NICs (the same devices, PCI addresses, netdevs): one shared
# tuple of them, and one shared NicHealth for a passing node, instead of one per node.
MAX_SHARED: Final = 4096
_NICS: Final = Shared[tuple[Nic, ...]](MAX_SHARED)
_PASSING: Final = Shared[NicHealth](MAX_SHARED)


def _passing(nics: tuple[Nic, ...]) -> NicHealth:
    return _PASSING(NicHealth(len(nics), identities=nics))


def judge_nics(report: Report) -> NicHealth | None:
    """The report's NICs; None for a report without the `nics` section (an older agent)."""
    if report.nics is None:
        return None
    index = SubjectIndex(report.nics)
    bad: dict[str, set[str]] = {}
    warned: dict[str, set[str]] = {}
    node_level = False
    for r in report.results:
        if r.check.group is CheckGroup.PEER or not (r.status.is_bad or r.status is Status.WARN):
            continue
        nic = index.nic_of(r.subject)
        if nic is None:
            node_level = node_level or r.status.is_bad
            continue
        (bad if r.status.is_bad else warned).setdefault(nic, set()).add(r.check.value)
    identities = _NICS(tuple(report.nics))
    if not bad and not warned and not node_level:
        return _passing(identities)
    return NicHealth(
        count=len(identities),
        failing=_sorted(bad),
        warning=_sorted({nic: checks for nic, checks in warned.items() if nic not in bad}),
        node_level=node_level,
        identities=identities,
    )


def _sorted(by_nic: Mapping[str, set[str]]) -> NicChecks:
    return tuple((nic, tuple(sorted(checks))) for nic, checks in sorted(by_nic.items()))


def digest(rec: NodeRecord, report: Report, previous: NodeRecord | None) -> None:
    """Fill `rec`'s NIC fields from `report`, carrying the recovery memory of `previous`."""
    rec.nics = judge_nics(report)
    if previous is not None:
        rec.tally = previous.tally
        rec.over_at = previous.over_at
        rec.nic_failed = previous.nic_failed
    count(rec)


def count(rec: NodeRecord) -> None:
    """One more report (or a matching beat) of what `rec` holds: the tally moves, and what
    fails in it is failing at this tally."""
    rec.tally += 1
    tally = rec.tally
    health = rec.nics
    over = failing_count(rec)
    if over:
        old = rec.over_at or (0,) * (MAX_FAILED_DEVICES + 1)
        rec.over_at = tuple(tally if over > j else at for j, at in enumerate(old))
    memory = {
        nic: seen for nic, seen in (rec.nic_failed or {}).items() if tally - seen[0] <= MAX_RECOVERY
    }
    if health is not None:
        for nic, _ in health.failing:
            identity = health.identity(nic)
            if identity is not None:
                memory[nic] = (tally, identity)
    rec.nic_failed = memory or None


def failing_count(rec: NodeRecord) -> int:
    """How many NICs fail the node's last report: BEYOND when something tied to no NIC fails
    it (a result of no NIC, any failure of a report without `nics`, an operator verdict)."""
    if not rec.status.is_bad:
        return 0
    health = rec.nics
    if health is None or health.node_level or not health.failing:
        return BEYOND
    if any(status is not None and status.is_bad for status, _ in rec.folded.values()):
        return BEYOND
    return len(health.failing)


def node_failing(rec: NodeRecord) -> None:
    """An operator verdict (fleet.consistency, the east-west blame) fails the node: the
    node-level recovery starts over, as its `ok_streak` does."""
    rec.over_at = (rec.tally,) * (MAX_FAILED_DEVICES + 1)


def streak_within(rec: NodeRecord, budget: int) -> int:
    """Reports in a row with at most `budget` failing NICs (none tied to no NIC)."""
    if not rec.over_at:
        return rec.tally
    return rec.tally - rec.over_at[min(budget, MAX_FAILED_DEVICES)]


def nic_streaks(rec: NodeRecord) -> Iterable[tuple[str, int, Nic]]:
    """(NIC, reports since it last failed, its identity) of the NICs that failed within
    MAX_RECOVERY reports."""
    for nic, (at, identity) in sorted((rec.nic_failed or {}).items()):
        yield nic, rec.tally - at, identity


__all__ = [
    "BEYOND",
    "MAX_FAILED_DEVICES",
    "MAX_RECOVERY",
    "NicHealth",
    "count",
    "digest",
    "failing_count",
    "judge_nics",
    "nic_streaks",
    "node_failing",
    "streak_within",
]
