"""Node gating decisions (pure): the fabric label, the taint, the circuit breaker, recovery.

`netval.io/fabric` is the worst health across the validations with `gating.nodeLabel` that
target the node; the taint `netval.io/fabric-unhealthy` is enforcement. Both obey one
breaker: a validation never has more than `maxUnhealthyPercent` of its targeted nodes (at
least one node) tainted or labelled `unhealthy`, because a mass failure is more likely a
probe or config fault than a fabric fault. When more fail, no new taints are added beyond
the cap (existing ones stay) and the failing nodes beyond it are labelled `suspect`, which
the webhook's node affinity does not exclude. Correlated staleness is the same storm: when
more than the cap of nodes lose their fresh report at once (a broker outage, an agent
rollout), they keep their last label instead of flipping to `unknown` and back.
A taint is lifted after `recoveryReports` consecutive passing reports (hysteresis, so a
flapping node does not flap its taint); a label follows a recovered node at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from netval.model.keys import TAINT_EFFECT, FabricHealth, TaintKey
from netval.model.status import Reason

# What the Gating condition says: (status True, reason, message).
GatingCondition = tuple[bool, str, str]

# "worst" for the label: no data ranks above healthy, a known warning above no data.
_RANK: Final = {
    FabricHealth.HEALTHY: 0,
    FabricHealth.UNKNOWN: 1,
    FabricHealth.DEGRADED: 2,
    FabricHealth.SUSPECT: 3,
    FabricHealth.UNHEALTHY: 4,
}
_VALUES: Final = {h.value: h for h in FabricHealth}


@dataclass(frozen=True, slots=True)
class GatingInput:
    """One validation's view of its nodes, as far as gating needs it."""

    name: str
    targeted: frozenset[str]
    node_label: bool
    taint: bool
    max_unhealthy_percent: float
    recovery_reports: int
    health: Mapping[str, FabricHealth]  # targeted nodes
    ok_streak: Mapping[str, int]  # consecutive passing reports per node


@dataclass(frozen=True, slots=True)
class TaintDecision:
    name: str
    tainted: frozenset[str]  # nodes this validation wants tainted
    cap: int  # most nodes it may taint
    unhealthy: int  # nodes failing now
    withheld: tuple[str, ...]  # failing nodes left untainted by the breaker

    @property
    def tripped(self) -> bool:
        return bool(self.withheld)


def breaker_cap(targeted: int, max_unhealthy_percent: float) -> int:
    """Most of a validation's nodes that netval marks failing (taint, `unhealthy` label) and
    most failing nodes with which it is Usable: the share `max_unhealthy_percent` of the
    targeted nodes, but at least one node, so that a pool under 100/percent nodes (9 nodes
    at 10 %) can still taint its one failing node."""
    if targeted <= 0:
        return 0
    return max(1, math.floor(targeted * max_unhealthy_percent / 100 + 1e-9))


def decide_taints(v: GatingInput, currently_tainted: Iterable[str]) -> TaintDecision:
    """Which of `v`'s nodes carry the taint after this round."""
    cap = breaker_cap(len(v.targeted), v.max_unhealthy_percent)
    unhealthy = sorted(n for n in v.targeted if v.health.get(n) is FabricHealth.UNHEALTHY)
    if not v.taint:
        return TaintDecision(v.name, frozenset(), cap, len(unhealthy), ())
    # Keep a taint until the node has passed `recovery_reports` times in a row; a node that
    # went silent keeps it (no evidence it recovered).
    keep = {
        n
        for n in currently_tainted
        if n in v.targeted
        and (
            v.health.get(n) is FabricHealth.UNHEALTHY or v.ok_streak.get(n, 0) < v.recovery_reports
        )
    }
    new = [n for n in unhealthy if n not in keep]
    room = max(0, cap - len(keep))
    return TaintDecision(
        v.name,
        frozenset(keep | set(new[:room])),
        cap,
        len(unhealthy),
        tuple(new[room:]),
    )


@dataclass(frozen=True, slots=True)
class LabelDecision:
    name: str
    labels: Mapping[str, FabricHealth]  # this validation's label value per targeted node
    cap: int
    suspect: tuple[str, ...]  # failing nodes labelled suspect, not unhealthy (the breaker)
    held: tuple[str, ...]  # nodes gone stale together that keep their last label

    @property
    def tripped(self) -> bool:
        return bool(self.suspect or self.held)


def decide_labels(
    v: GatingInput, current: Mapping[str, str | None], tainted: Iterable[str] = ()
) -> LabelDecision:
    """`v`'s label per targeted node after this round. `current` maps nodes to their
    netval.io/fabric label now, `tainted` are the nodes that carry the taint after this round
    (they are labelled unhealthy whatever the room, so label and taint agree)."""
    cap = breaker_cap(len(v.targeted), v.max_unhealthy_percent)
    labels = {n: v.health.get(n, FabricHealth.UNKNOWN) for n in v.targeted}
    failing = sorted(n for n, h in labels.items() if h is FabricHealth.UNHEALTHY)
    marked = set(tainted)
    keep = {n for n in failing if current.get(n) == FabricHealth.UNHEALTHY or n in marked}
    new = [n for n in failing if n not in keep]
    suspect = tuple(new[max(0, cap - len(keep)) :])
    for node in suspect:
        labels[node] = FabricHealth.SUSPECT
    # Nodes that had a verdict and have none now; more than the cap at once is one event
    # (the broker, a rollout), not that many nodes dying: their labels hold.
    going_stale = sorted(
        n
        for n, h in labels.items()
        if h is FabricHealth.UNKNOWN
        and _VALUES.get(current.get(n) or "", FabricHealth.UNKNOWN) is not FabricHealth.UNKNOWN
    )
    held: tuple[str, ...] = ()
    if len(going_stale) > cap:
        held = tuple(going_stale)
        for node in held:
            labels[node] = _VALUES[current[node] or ""]
    return LabelDecision(v.name, labels, cap, suspect, held)


def merge_labels(decided: Iterable[tuple[GatingInput, LabelDecision]]) -> dict[str, FabricHealth]:
    """The label value per node targeted by at least one labelling validation: the worst."""
    out: dict[str, FabricHealth] = {}
    for v, decision in decided:
        if not v.node_label:
            continue
        for node, health in decision.labels.items():
            if node not in out or _RANK[health] > _RANK[out[node]]:
                out[node] = health
    return out


def desired_labels(
    inputs: Iterable[GatingInput],
    current: Mapping[str, str | None] | None = None,
    tainted: Iterable[str] = (),
) -> dict[str, FabricHealth]:
    """`merge_labels` of each validation's `decide_labels`."""
    marked = frozenset(tainted)
    return merge_labels((v, decide_labels(v, current or {}, marked)) for v in inputs)


@dataclass(frozen=True, slots=True)
class NodeChange:
    node: str
    label: FabricHealth | None  # None: remove our label
    taint: bool


def plan_changes(
    current: Mapping[str, tuple[str | None, bool]],
    labels: Mapping[str, FabricHealth],
    taints: Iterable[str],
) -> list[NodeChange]:
    """Changes for nodes whose (label, tainted) differ from what gating wants.

    `current` maps every known node to (its netval.io/fabric label, has our taint). A node no
    validation labels or taints loses what netval put there.
    """
    tainted = set(taints)
    changes: list[NodeChange] = []
    for node in sorted(current):
        have_label, have_taint = current[node]
        want_label = labels.get(node)
        want_taint = node in tainted
        want_label_value = want_label.value if want_label is not None else None
        if have_label != want_label_value or have_taint != want_taint:
            changes.append(NodeChange(node, want_label, want_taint))
    return changes


def gating_condition(
    v: GatingInput, decision: TaintDecision, labels: LabelDecision | None = None
) -> GatingCondition:
    """The Gating condition of validation `v` after this round's decisions."""
    held = labels if labels is not None and v.node_label else None
    withheld = decision.withheld if v.taint else ()
    if not withheld and (held is None or not held.tripped):
        if v.taint:
            message = (
                f"{len(decision.tainted)} node(s) tainted of {len(v.targeted)} targeted "
                f"(cap {decision.cap})"
            )
        elif v.node_label:
            message = "node labels only (gating.taint is false)"
        else:
            message = "off"
        return (True, Reason.GATING_ACTIVE.value, message)
    cap = decision.cap
    parts: list[str] = []
    if decision.unhealthy > cap:
        parts.append(
            f"{decision.unhealthy} of {len(v.targeted)} targeted nodes failing, more than "
            f"maxUnhealthyPercent {v.max_unhealthy_percent:g}% allows ({cap})"
        )
    if withheld:
        parts.append(f"not tainting {len(withheld)} node(s) ({_names(withheld)})")
    if held is not None and held.suspect:
        parts.append(
            f"{len(held.suspect)} failing node(s) labelled {FabricHealth.SUSPECT.value}, not "
            f"{FabricHealth.UNHEALTHY.value} ({_names(held.suspect)})"
        )
    if held is not None and held.held:
        parts.append(
            f"{len(held.held)} of {len(v.targeted)} targeted nodes went stale at once, more "
            f"than {cap}: {len(held.held)} label(s) held at their last value "
            f"({_names(held.held)})"
        )
    parts.append("a mass failure is more likely a probe, config or broker fault")
    return (False, Reason.BREAKER_TRIPPED.value, "; ".join(parts))


def _names(nodes: tuple[str, ...], shown: int = 5) -> str:
    return ", ".join(nodes[:shown]) + (", ..." if len(nodes) > shown else "")


def _is_ours(taint: Mapping[str, Any]) -> bool:
    return taint.get("key") == TaintKey.FABRIC_UNHEALTHY and taint.get("effect") == TAINT_EFFECT


def has_fabric_taint(taints: Iterable[Mapping[str, Any]] | None) -> bool:
    return any(_is_ours(t) for t in taints or ())


def with_fabric_taint(taints: list[dict[str, Any]] | None, present: bool) -> list[dict[str, Any]]:
    """The node's taint list with ours added or removed; taints of other owners untouched."""
    others = [t for t in taints or [] if not _is_ours(t)]
    if present:
        others.append(
            {"key": TaintKey.FABRIC_UNHEALTHY.value, "value": "true", "effect": TAINT_EFFECT}
        )
    return others
