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

1. `judge` (one node, one validation; first row that matches). "Within k": device taints
   are on and possible (`NicFacts` given), `gating.maxFailedDevicesPerNode` k >= 1, and the
   report fails only on 1..k NICs, each with a DRA device to taint; "a NIC recovering": one
   that failed and has passed fewer than recoveryReports reports since (device taints only):

   | heard | last report | decision before | -> wants | why |
   |---|---|---|---|---|
   | fresh | fails (or errors), not within k | any | unhealthy | Failing, RetriesBlamedOnNode |
   | fresh | passes, warns or fails within k | excluded, ok streak < recoveryReports | unhealthy | Recovering; Failing (within k) |
   | fresh | fails within k | any | degraded + its NICs tainted | DevicesFailing |
   | fresh | passes or warns, a NIC recovering | any | degraded + that NIC tainted | DevicesRecovering |
   | silent, offline, never | fails not within k, or decision before excluded/suspect | any | unhealthy | SilentAfterFailing |
   | silent, offline, never | fails within k, or a NIC recovering | any | degraded + those NICs | SilentAfterDevicesFailing |
   | fresh | warns of failing paths only, all explained by a suspect elsewhere | any | healthy | PathObserver |
   | fresh | warns | any | degraded | Warning, RetriesFromPeers |
   | fresh | passes (or skips) | any | healthy | Passing |
   | silent, offline, never | otherwise | any | unknown | Silent, Offline, NeverReported |

   With k >= 1 the ok streak is of reports within k (`state.nic_health.streak_within`).

2. `decide_validation`, the device bound, then the breaker: NICs are tainted up to
   `gating.maxDeviceTaints` (nodes that had device taints keep theirs, the others in name
   order); a node whose failing NICs find no room takes the node path (wants `unhealthy`,
   `Failing`). Of the nodes that want `unhealthy`, those the decision before excluded stay
   excluded; the others take the room left under the cap
   (`breaker_cap`) in name order; the rest are labelled `suspect`, not excluded, not
   tainted. When more nodes than the cap lose their verdict at once (healthy or degraded
   before, unknown now), they keep their last label (`StaleHeld`). Excluded = labelled
   `unhealthy`; tainted = excluded with `gating.taint`.
3. `merge`: a node's label is the worst (healthy < unknown < degraded < suspect < unhealthy)
   of the validations with `gating.nodeLabel` that target it; it is tainted when any
   validation taints it; its `NetworkFabricReady` condition is the worst (True < Unknown <
   False) of the validations with `gating.nodeCondition`, naming that validation
   (`CONDITIONS`: the status and reason of each why).

Deciding again on the same facts gives the same decisions (the decision before is an
input): the round may run any number of times.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from netval.model.ids import Status
from netval.model.keys import FabricHealth
from netval.model.spec import BreakerAction
from netval.operator.gating.verdict_reasons import (
    ADMISSIBLE,
    CONDITION_RANK,
    CONDITIONS,
    DEVICE_WHYS,
    RANK,
    UNKNOWN_WHY,
    ConditionStatus,
    Heard,
    Why,
)


class NicFacts(NamedTuple):
    """A node's NICs as device gating sees them (`gating.facts`; None when device taints
    are off or impossible for the validation, or nothing failed lately)."""

    failing: tuple[str, ...]  # NICs failing in the last report
    node_level: bool  # the report fails on something tied to no NIC (an operator verdict too)
    recovering: tuple[tuple[str, int], ...] = ()  # (NIC, passing reports since it failed)
    untaintable: frozenset[str] = frozenset()  # NICs without a DRA device to taint


class NodeFacts(NamedTuple):
    """One targeted node as one validation knows it (a tuple: 10,000 are made a round)."""

    heard: Heard
    last: Status | None  # the effective status of its last report (None: none held)
    ok_streak: int  # reports (and beats) in a row without fail or error (within k: k >= 1)
    blamed: bool = False  # the east-west blame is what fails it
    retries: bool = False  # its last report warns of requester-side retries
    was_excluded: bool = False  # the decision before: labelled unhealthy
    was_label: FabricHealth | None = None  # the decision before: its label (None: none)
    nics: NicFacts | None = None
    was_devices: bool = False  # the decision before tainted some of its NICs
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
    node_condition: bool = True  # write the Node condition NetworkFabricReady
    max_failed_devices: int = 0  # maxFailedDevicesPerNode (0: any failing NIC is the node's)
    max_device_taints: int = 1000  # NICs this validation taints at most


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


def within(facts: NodeFacts, budget: int) -> bool:
    """The last report fails only on 1..`budget` NICs, each with a device to taint."""
    nics = facts.nics
    return (
        budget >= 1
        and nics is not None
        and not nics.node_level
        and 1 <= len(nics.failing) <= budget
        and not nics.untaintable.intersection(nics.failing)
    )


def recovering(facts: NodeFacts, recovery_reports: int) -> tuple[str, ...]:
    """NICs passing again fewer than `recovery_reports` times, with a device to taint."""
    nics = facts.nics
    if nics is None:
        return ()
    return tuple(nic for nic, streak in nics.recovering
                 if streak < recovery_reports and nic not in nics.untaintable)  # fmt: skip


def judge(facts: NodeFacts, recovery_reports: int, budget: int = 0) -> tuple[FabricHealth, Why]:
    """The table's row for one node: what it wants (`unhealthy`: exclusion) and why.
    `budget`: maxFailedDevicesPerNode, for a validation whose device taints are on."""
    last = facts.last
    bad = last is Status.FAIL or last is Status.ERROR
    devices = budget >= 1 and facts.nics is not None
    if facts.heard is Heard.FRESH and last is not None:
        if bad and not (devices and within(facts, budget)):
            return FabricHealth.UNHEALTHY, Why.BLAMED if facts.blamed else Why.FAILING
        if facts.was_excluded and facts.ok_streak < recovery_reports:
            # within k but excluded before: out until recoveryReports reports within k
            return FabricHealth.UNHEALTHY, Why.FAILING if bad else Why.RECOVERING
        if bad:
            return FabricHealth.DEGRADED, Why.DEVICES_FAILING
        if devices and recovering(facts, recovery_reports):
            return FabricHealth.DEGRADED, Why.DEVICES_RECOVERING
        if last is Status.WARN:
            if facts.observer:
                return FabricHealth.HEALTHY, Why.OBSERVER
            return FabricHealth.DEGRADED, Why.RETRIES_FROM_PEERS if facts.retries else Why.WARNING
        return FabricHealth.HEALTHY, Why.PASSING
    if (
        facts.was_excluded
        or facts.was_label is FabricHealth.SUSPECT
        or (bad and not (devices and within(facts, budget)))
    ):
        return FabricHealth.UNHEALTHY, Why.SILENT_AFTER_FAILING
    if devices and (bad or recovering(facts, recovery_reports)):
        return FabricHealth.DEGRADED, Why.SILENT_AFTER_DEVICES
    return FabricHealth.UNKNOWN, UNKNOWN_WHY[facts.heard]


def device_wish(facts: NodeFacts, why: Why, recovery_reports: int) -> tuple[str, ...]:
    """The NICs a device-level decision taints: the failing ones (of a failing report) and
    those still recovering, sorted."""
    nics = facts.nics
    if why not in DEVICE_WHYS or nics is None:
        return ()
    failing = nics.failing if facts.last is Status.FAIL or facts.last is Status.ERROR else ()
    return tuple(sorted({*failing, *recovering(facts, recovery_reports)}))


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
    # node -> its NICs to taint (DeviceTaintRules), only nodes with some
    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # nodes whose failing NICs found no room under maxDeviceTaints: the node path (sorted)
    beyond_devices: tuple[str, ...] = ()

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

    @property
    def tainted_devices(self) -> int:
        return sum(len(nics) for nics in self.devices.values())

    def summary(self) -> tuple[object, ...]:
        """What the status and its conditions read of it (a change dirties the status)."""
        return (self.cap, self.wanting, len(self.excluded), self.admissible, self.suspect,
                self.held, self.tainted_devices, len(self.devices),
                self.beyond_devices)  # fmt: skip


def decide_validation(policy: GatingPolicy, facts: Mapping[str, NodeFacts]) -> ValidationVerdict:
    """Steps 1 and 2 of the module docstring for one validation's targeted nodes."""
    cap = breaker_cap(len(facts), policy.max_unhealthy_percent)
    recovery = policy.recovery_reports
    budget = policy.max_failed_devices
    decisions: dict[str, NodeDecision] = {}
    keep: list[tuple[str, Why]] = []
    new: list[tuple[str, Why]] = []
    going_stale: list[str] = []
    device_nodes: list[tuple[bool, str, Why, tuple[str, ...]]] = []
    admissible = 0
    shared = _DECISIONS
    unhealthy, unknown = FabricHealth.UNHEALTHY, FabricHealth.UNKNOWN
    for node, f in facts.items():
        health, why = judge(f, recovery, budget)
        if health is unhealthy:
            (keep if f.was_excluded else new).append((node, why))
            continue
        if why in DEVICE_WHYS:
            device_nodes.append((not f.was_devices, node, why, device_wish(f, why, recovery)))
            continue
        if health is unknown and (f.was_label is FabricHealth.HEALTHY
                                  or f.was_label is FabricHealth.DEGRADED):  # fmt: skip
            going_stale.append(node)
        key = (health, False, False, why)
        decision = shared.get(key)
        decisions[node] = decision if decision is not None else _decision(*key)
        if why in ADMISSIBLE:
            admissible += 1
    devices: dict[str, tuple[str, ...]] = {}
    beyond: list[str] = []
    room = policy.max_device_taints
    for _, node, why, nics in sorted(device_nodes):  # those tainted before first
        if len(nics) <= room:
            room -= len(nics)
            if nics:
                devices[node] = nics
            decisions[node] = _decision(FabricHealth.DEGRADED, False, False, why)
            admissible += why in ADMISSIBLE
        elif why is Why.DEVICES_RECOVERING:  # passing: no room to hold its NICs, no fault
            decisions[node] = _decision(FabricHealth.DEGRADED, False, False, why)
            admissible += 1
        else:
            beyond.append(node)
            silent = why is Why.SILENT_AFTER_DEVICES
            new.append((node, Why.SILENT_AFTER_FAILING if silent else Why.FAILING))
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
        devices=devices,
        beyond_devices=tuple(sorted(beyond)),
    )


class ConditionWish(NamedTuple):
    """A node's NetworkFabricReady: its status and reason, and the validation it is of."""

    status: ConditionStatus
    reason: str
    validation: str
    why: Why


@dataclass(frozen=True, slots=True)
class Decisions:
    verdicts: Mapping[str, ValidationVerdict]  # by validation
    labels: Mapping[str, FabricHealth]  # node -> netval.io/fabric (nodes a labeller targets)
    tainted: frozenset[str]
    # node -> its NetworkFabricReady (nodes a validation with gating.nodeCondition targets)
    conditions: Mapping[str, ConditionWish] = field(default_factory=dict)


def merge(verdicts: Iterable[ValidationVerdict]) -> Decisions:
    """Step 3: the label, taint and condition of each node across validations."""
    by_name: dict[str, ValidationVerdict] = {}
    labels: dict[str, FabricHealth] = {}
    tainted: set[str] = set()
    conditions: dict[str, ConditionWish] = {}
    rank = CONDITION_RANK
    for verdict in sorted(verdicts, key=lambda v: v.name):
        by_name[verdict.name] = verdict
        tainted |= verdict.tainted
        if verdict.policy.node_condition:
            mine: dict[Why, ConditionWish] = {}  # one wish per reason, shared by its nodes
            first = not conditions  # the first validation sets, the others compare
            for node, decision in verdict.nodes.items():
                why = decision.why
                wish = mine.get(why)
                if wish is None:
                    status, reason = CONDITIONS[why]
                    wish = mine[why] = ConditionWish(status, reason, verdict.name, why)
                if first:
                    conditions[node] = wish
                    continue
                held = conditions.get(node)
                if held is None or rank[wish.status] > rank[held.status]:
                    conditions[node] = wish
        if not verdict.policy.node_label:
            continue
        for node, decision in verdict.nodes.items():
            have = labels.get(node)
            if have is None or RANK[decision.label] > RANK[have]:
                labels[node] = decision.label
    return Decisions(by_name, labels, frozenset(tainted), conditions)


def decide(inputs: Iterable[tuple[GatingPolicy, Mapping[str, NodeFacts]]]) -> Decisions:
    """Every node of every validation, from all their facts: the one entry point."""
    return merge(decide_validation(policy, facts) for policy, facts in inputs)


__all__ = [
    "CONDITIONS",
    "DEVICE_WHYS",
    "RANK",
    "ConditionStatus",
    "ConditionWish",
    "Decisions",
    "GatingPolicy",
    "Heard",
    "NicFacts",
    "NodeDecision",
    "NodeFacts",
    "ValidationVerdict",
    "Why",
    "breaker_cap",
    "decide",
    "decide_validation",
    "device_wish",
    "judge",
    "merge",
    "recovering",
    "within",
]
