"""The node verdict: what every node is, for every validation, and why (pure).

One function, `decide`, turns every input into every decision: per validation and targeted
node the facts (`NodeFacts`: what its reports say and how fresh they are, with the
operator's own verdicts -- fleet.consistency, topology.agreement, the east-west blame --
already folded into the report's status, and the decision of the round before), and per
validation its gating settings (`GatingPolicy`). Out come, per validation and node, the
label value, whether admission excludes the node, whether it is tainted and why
(`NodeDecision`), the validation's breaker (`ValidationVerdict`), and per node the merged
`netval.io/fabric` label and the taint (`Decisions`). Labels, taints, the webhook's
affinity, Kueue, gate release, the status counts and conditions, Events and load-test
participants read this output and nothing else; docs/gating.md has the table.

1. `judge` (one node, one validation; first row that matches):

   | heard | last report | decision before | -> wants | why |
   |---|---|---|---|---|
   | fresh | fails (or errors) | any | unhealthy | Failing, RetriesBlamedOnNode |
   | fresh | passes or warns | excluded, ok streak < recoveryReports | unhealthy | Recovering |
   | silent, offline, never | fails, or decision before excluded/suspect | any | unhealthy | SilentAfterFailing |
   | fresh | warns of failing paths only, all explained by a suspect elsewhere | any | healthy | PathObserver |
   | fresh | warns | any | degraded | Warning, RetriesFromPeers |
   | fresh | passes (or skips) | any | healthy | Passing |
   | silent, offline, never | otherwise | any | unknown | Silent, Offline, NeverReported |

2. `decide_validation`, the breaker: of the nodes that want `unhealthy`, those the decision
   before excluded stay excluded; the others take the room left under the cap
   (`breaker_cap`) in name order; the rest are labelled `suspect`, not excluded, not
   tainted. When more nodes than the cap lose their verdict at once (healthy or degraded
   before, unknown now), they keep their last label (`StaleHeld`). Excluded = labelled
   `unhealthy`; tainted = excluded with `gating.taint`.
3. `merge`: a node's label is the worst (healthy < unknown < degraded < suspect < unhealthy)
   of the validations with `gating.nodeLabel` that target it; it is tainted when any
   validation taints it.

Deciding again on the same facts gives the same decisions (the decision before is an
input): the round may run any number of times.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, NamedTuple

from netval.model.ids import Status
from netval.model.keys import FabricHealth
from netval.model.spec import BreakerAction


class Heard(StrEnum):
    """How fresh a node's last report is (`netval.operator.state.validation.heard`)."""

    FRESH = "fresh"  # within 3 intervals (a matching beat counts), its agent not offline
    SILENT = "silent"  # older, or a beat contradicted it
    OFFLINE = "offline"  # its agent's last will (or a clean stop)
    NEVER = "never"  # no report held: awaiting the first, or never reported


class Why(StrEnum):
    """The reason of a decision (CamelCase, as condition reasons)."""

    FAILING = "Failing"
    BLAMED = "RetriesBlamedOnNode"  # requester retries, and the east-west paths point here
    RECOVERING = "Recovering"  # passing again, fewer than recoveryReports reports in a row
    SILENT_AFTER_FAILING = "SilentAfterFailing"
    SUSPECT = "BreakerSuspect"  # wants exclusion, the breaker's cap is full
    RETRIES_FROM_PEERS = "RetriesFromPeers"  # requester retries only: warn, not its fault
    # its only warnings are failing paths towards a suspect node or through a suspect link
    OBSERVER = "PathObserver"
    WARNING = "Warning"
    PASSING = "Passing"
    HELD = "StaleHeld"  # went stale with more than the cap at once: its last label holds
    SILENT = "Silent"
    OFFLINE = "Offline"
    NEVER_REPORTED = "NeverReported"


# "worst" for the label: no data ranks above healthy, a known warning above no data.
RANK: Final = {
    FabricHealth.HEALTHY: 0,
    FabricHealth.UNKNOWN: 1,
    FabricHealth.DEGRADED: 2,
    FabricHealth.SUSPECT: 3,
    FabricHealth.UNHEALTHY: 4,
}
# the reasons of a node admission counts as healthy: a fresh passing or warning report
ADMISSIBLE: Final = frozenset({Why.PASSING, Why.WARNING, Why.RETRIES_FROM_PEERS, Why.OBSERVER})
_UNKNOWN_WHY: Final = {Heard.SILENT: Why.SILENT, Heard.OFFLINE: Why.OFFLINE,
                       Heard.NEVER: Why.NEVER_REPORTED, Heard.FRESH: Why.SILENT}  # fmt: skip


class NodeFacts(NamedTuple):
    """One targeted node as one validation knows it (a tuple: 10,000 are made a round)."""

    heard: Heard
    last: Status | None  # the effective status of its last report (None: none held)
    ok_streak: int  # reports (and beats) in a row without fail or error
    blamed: bool = False  # the east-west blame is what fails it
    retries: bool = False  # its last report warns of requester-side retries
    was_excluded: bool = False  # the decision before: labelled unhealthy
    was_label: FabricHealth | None = None  # the decision before: its label (None: none)
    # it warns only of failing paths, all explained by a suspect node or link elsewhere
    observer: bool = False


@dataclass(frozen=True, slots=True)
class GatingPolicy:
    """One validation's `spec.gating`."""

    name: str
    node_label: bool = True
    taint: bool = False
    max_unhealthy_percent: float = 10.0
    recovery_reports: int = 3
    on_breaker_tripped: BreakerAction = BreakerAction.ADMIT


@dataclass(frozen=True, slots=True)
class NodeDecision:
    label: FabricHealth  # this validation's netval.io/fabric value for the node
    excluded: bool  # admission keeps workloads off it (label unhealthy)
    tainted: bool  # netval.io/fabric-unhealthy:NoSchedule (excluded, gating.taint)
    why: Why

    @property
    def admissible(self) -> bool:
        """Counted as a healthy node by admission: a fresh passing or warning report, no
        exclusion."""
        return self.why in ADMISSIBLE


def breaker_cap(targeted: int, max_unhealthy_percent: float) -> int:
    """Most of a validation's nodes that netval excludes (taint, `unhealthy` label): the
    share `max_unhealthy_percent` of the targeted nodes, but at least one node, so that a
    pool under 100/percent nodes can still exclude its one failing node."""
    if targeted <= 0:
        return 0
    return max(1, math.floor(targeted * max_unhealthy_percent / 100 + 1e-9))


def judge(facts: NodeFacts, recovery_reports: int) -> tuple[FabricHealth, Why]:
    """The table's row for one node: what it wants (`unhealthy`: exclusion) and why."""
    last = facts.last
    if facts.heard is Heard.FRESH and last is not None:
        if last is Status.FAIL or last is Status.ERROR:
            return FabricHealth.UNHEALTHY, Why.BLAMED if facts.blamed else Why.FAILING
        if facts.was_excluded and facts.ok_streak < recovery_reports:
            return FabricHealth.UNHEALTHY, Why.RECOVERING
        if last is Status.WARN:
            if facts.observer:
                return FabricHealth.HEALTHY, Why.OBSERVER
            return FabricHealth.DEGRADED, Why.RETRIES_FROM_PEERS if facts.retries else Why.WARNING
        return FabricHealth.HEALTHY, Why.PASSING
    if (
        facts.was_excluded
        or facts.was_label is FabricHealth.SUSPECT
        or last is Status.FAIL
        or last is Status.ERROR
    ):
        return FabricHealth.UNHEALTHY, Why.SILENT_AFTER_FAILING
    return FabricHealth.UNKNOWN, _UNKNOWN_WHY[facts.heard]


_DECISIONS: dict[tuple[FabricHealth, bool, bool, Why], NodeDecision] = {}


def _decision(label: FabricHealth, excluded: bool, tainted: bool, why: Why) -> NodeDecision:
    """One shared instance per distinct decision (a few dozen), not one per node."""
    key = (label, excluded, tainted, why)
    found = _DECISIONS.get(key)
    if found is None:
        found = _DECISIONS[key] = NodeDecision(label, excluded, tainted, why)
    return found


@dataclass(frozen=True, slots=True)
class ValidationVerdict:
    """One validation's decisions and its breaker."""

    policy: GatingPolicy
    nodes: Mapping[str, NodeDecision]  # every targeted node
    cap: int
    wanting: int  # nodes that want exclusion, before the cap
    suspect: tuple[str, ...]  # wanting, beyond the cap: labelled suspect (sorted)
    held: tuple[str, ...]  # gone stale with more than the cap: last label held (sorted)
    excluded: frozenset[str] = field(default_factory=frozenset)
    admissible: int = 0

    @property
    def name(self) -> str:
        return self.policy.name

    @property
    def tripped(self) -> bool:
        """More nodes want exclusion than the cap allows."""
        return self.wanting > self.cap

    @property
    def holds_admission(self) -> bool:
        """The breaker tripped and `gating.onBreakerTripped` is `hold`."""
        return self.tripped and self.policy.on_breaker_tripped is BreakerAction.HOLD

    @property
    def tainted(self) -> frozenset[str]:
        return self.excluded if self.policy.taint else frozenset()

    def summary(self) -> tuple[int, int, int, int, tuple[str, ...], tuple[str, ...]]:
        """What the status and its conditions read of it (a change dirties the status)."""
        return (self.cap, self.wanting, len(self.excluded), self.admissible, self.suspect,
                self.held)  # fmt: skip


def decide_validation(policy: GatingPolicy, facts: Mapping[str, NodeFacts]) -> ValidationVerdict:
    """Steps 1 and 2 of the module docstring for one validation's targeted nodes."""
    cap = breaker_cap(len(facts), policy.max_unhealthy_percent)
    recovery = policy.recovery_reports
    decisions: dict[str, NodeDecision] = {}
    keep: list[tuple[str, Why]] = []
    new: list[tuple[str, Why]] = []
    going_stale: list[str] = []
    admissible = 0
    shared = _DECISIONS
    unhealthy, unknown = FabricHealth.UNHEALTHY, FabricHealth.UNKNOWN
    for node, f in facts.items():
        health, why = judge(f, recovery)
        if health is unhealthy:
            (keep if f.was_excluded else new).append((node, why))
            continue
        if health is unknown and (f.was_label is FabricHealth.HEALTHY
                                  or f.was_label is FabricHealth.DEGRADED):  # fmt: skip
            going_stale.append(node)
        key = (health, False, False, why)
        decision = shared.get(key)
        decisions[node] = decision if decision is not None else _decision(*key)
        if why in ADMISSIBLE:
            admissible += 1
    new.sort()
    room = max(0, cap - len(keep))
    taint = policy.taint
    for node, why in keep + new[:room]:
        decisions[node] = _decision(unhealthy, True, taint, why)
    suspect = tuple(node for node, _ in new[room:])
    for node in suspect:
        decisions[node] = _decision(FabricHealth.SUSPECT, False, False, Why.SUSPECT)
    held = tuple(sorted(going_stale)) if len(going_stale) > cap else ()
    for node in held:
        was = facts[node].was_label
        assert was is not None  # going stale: it had a label
        decisions[node] = _decision(was, False, False, Why.HELD)
    return ValidationVerdict(
        policy=policy,
        nodes=decisions,
        cap=cap,
        wanting=len(keep) + len(new),
        suspect=suspect,
        held=held,
        excluded=frozenset(node for node, _ in keep + new[:room]),
        admissible=admissible,
    )


@dataclass(frozen=True, slots=True)
class Decisions:
    verdicts: Mapping[str, ValidationVerdict]  # by validation
    labels: Mapping[str, FabricHealth]  # node -> netval.io/fabric (nodes a labeller targets)
    tainted: frozenset[str]


def merge(verdicts: Iterable[ValidationVerdict]) -> Decisions:
    """Step 3: the label and taint of each node across validations."""
    by_name: dict[str, ValidationVerdict] = {}
    labels: dict[str, FabricHealth] = {}
    tainted: set[str] = set()
    for verdict in verdicts:
        by_name[verdict.name] = verdict
        tainted |= verdict.tainted
        if not verdict.policy.node_label:
            continue
        for node, decision in verdict.nodes.items():
            have = labels.get(node)
            if have is None or RANK[decision.label] > RANK[have]:
                labels[node] = decision.label
    return Decisions(by_name, labels, frozenset(tainted))


def decide(inputs: Iterable[tuple[GatingPolicy, Mapping[str, NodeFacts]]]) -> Decisions:
    """Every node of every validation, from all their facts: the one entry point."""
    return merge(decide_validation(policy, facts) for policy, facts in inputs)


__all__ = [
    "RANK",
    "Decisions",
    "GatingPolicy",
    "Heard",
    "NodeDecision",
    "NodeFacts",
    "ValidationVerdict",
    "Why",
    "breaker_cap",
    "decide",
    "decide_validation",
    "judge",
    "merge",
]
