"""Node gating decisions (pure): the fabric label, the taint, the circuit breaker, recovery.

Labels are information and always follow health: `netval.io/fabric` is the worst health
across the validations with `gating.nodeLabel` that target the node. Taints are enforcement
and obey a breaker: a validation never has more than `maxUnhealthyPercent` of its targeted
nodes tainted, because a mass failure is more likely a probe or config fault than a fabric
fault. When the breaker trips no new taints are added beyond the cap, existing ones stay.
A taint is lifted after `recoveryReports` consecutive passing reports (hysteresis, so a
flapping node does not flap its taint).
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
    FabricHealth.UNHEALTHY: 3,
}


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


def taint_cap(targeted: int, max_unhealthy_percent: float) -> int:
    return math.floor(targeted * max_unhealthy_percent / 100 + 1e-9)


def decide_taints(v: GatingInput, currently_tainted: Iterable[str]) -> TaintDecision:
    """Which of `v`'s nodes carry the taint after this round."""
    cap = taint_cap(len(v.targeted), v.max_unhealthy_percent)
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


def desired_labels(inputs: Iterable[GatingInput]) -> dict[str, FabricHealth]:
    """The label value per node targeted by at least one labelling validation."""
    out: dict[str, FabricHealth] = {}
    for v in inputs:
        if not v.node_label:
            continue
        for node in v.targeted:
            health = v.health.get(node, FabricHealth.UNKNOWN)
            if node not in out or _RANK[health] > _RANK[out[node]]:
                out[node] = health
    return out


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


def gating_condition(v: GatingInput, decision: TaintDecision) -> GatingCondition:
    """The Gating condition of validation `v` after this round's `decision`."""
    if not v.taint:
        message = "node labels only (gating.taint is false)" if v.node_label else "off"
        return (True, Reason.GATING_ACTIVE.value, message)
    if decision.tripped:
        return (
            False,
            Reason.BREAKER_TRIPPED.value,
            f"{decision.unhealthy} of {len(v.targeted)} targeted nodes failing, more than "
            f"maxUnhealthyPercent {v.max_unhealthy_percent:g}% allows ({decision.cap}); "
            f"not tainting {len(decision.withheld)} node(s) "
            f"({', '.join(decision.withheld[:5])}{', ...' if len(decision.withheld) > 5 else ''}): "
            "a mass failure is more likely a probe or config fault; labels still follow health",
        )
    return (
        True,
        Reason.GATING_ACTIVE.value,
        f"{len(decision.tainted)} node(s) tainted of {len(v.targeted)} targeted "
        f"(cap {decision.cap})",
    )


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
