"""The `Gating` and `Usable` conditions, read off a validation's node verdict (pure).

`Gating` says what the breaker does: True `GatingActive` while the nodes that want exclusion
fit under the cap (`maxUnhealthyPercent`, at least one node) and no correlated staleness
holds labels; False `BreakerTripped` otherwise, saying how many exclusions were withheld
(labelled `suspect`, not tainted), how many labels are held, and what admission does about
it (`gating.onBreakerTripped`).

`Usable` says whether admission (policy `capacity`) admits: False `TooManyFailing` while the
breaker is tripped under `onBreakerTripped: hold`; True `AdmittingPastBreaker` while it is
tripped under `admit` (the default: the capped exclusions still keep workloads off the nodes
they cover); False `NoHealthyNodes` without a fresh passing or warning node no exclusion
holds; else True `CapacityAvailable`. Unknown while no targeted node has a fresh report.
"""

from __future__ import annotations

from typing import Literal

from netval.model.spec import BreakerAction
from netval.model.status import Condition, NodeCounts, Reason
from netval.operator.gating.verdict import ValidationVerdict

# What the Gating condition says: (status True, reason, message).
GatingCondition = tuple[bool, str, str]
UsableCondition = tuple[Literal["True", "False", "Unknown"], str, str]

SHOWN_NAMES = 5


def _names(nodes: tuple[str, ...], shown: int = SHOWN_NAMES) -> str:
    return ", ".join(nodes[:shown]) + (", ..." if len(nodes) > shown else "")


def _allowed(verdict: ValidationVerdict) -> str:
    return f"maxUnhealthyPercent {verdict.policy.max_unhealthy_percent:g}% allows {verdict.cap}"


def gating_condition(verdict: ValidationVerdict) -> GatingCondition:
    p = verdict.policy
    targeted = len(verdict.nodes)
    held = verdict.held if p.node_label else ()
    if not verdict.tripped and not held:
        if p.taint:
            message = (
                f"{len(verdict.tainted)} node(s) tainted of {targeted} targeted (cap {verdict.cap})"
            )
        elif p.node_label:
            message = (
                f"{len(verdict.excluded)} node(s) labelled unhealthy of {targeted} targeted "
                f"(cap {verdict.cap}); gating.taint is false"
            )
        else:
            message = (
                f"{len(verdict.excluded)} node(s) excluded from admission; no labels, no taints"
            )
        return True, Reason.GATING_ACTIVE.value, message
    parts: list[str] = []
    if verdict.tripped:
        parts.append(
            f"{verdict.wanting} of {targeted} targeted nodes failing, more than {_allowed(verdict)}"
        )
    if verdict.suspect:
        if p.taint:
            parts.append(f"not tainting {len(verdict.suspect)} node(s) ({_names(verdict.suspect)})")
        parts.append(
            f"{len(verdict.suspect)} failing node(s) labelled suspect, not unhealthy "
            f"({_names(verdict.suspect)})"
        )
    if held:
        parts.append(
            f"{len(held)} of {targeted} targeted nodes went stale at once, more than "
            f"{verdict.cap}: {len(held)} label(s) held at their last value ({_names(held)})"
        )
    parts.append("a mass failure is more likely a probe, config or broker fault")
    if verdict.tripped:
        if p.on_breaker_tripped is BreakerAction.ADMIT:
            parts.append(
                f"admission goes on (onBreakerTripped: admit), keeping workloads off the "
                f"{len(verdict.excluded)} excluded node(s)"
            )
        else:
            parts.append("admission waits (onBreakerTripped: hold)")
    return False, Reason.BREAKER_TRIPPED.value, "; ".join(parts)


def usable_condition(
    nodes: NodeCounts, healthy: Condition | None, verdict: ValidationVerdict | None
) -> UsableCondition:
    """`nodes` and `healthy`: the status's counts and Healthy condition (Unknown there, with
    no fresh report, is Unknown here too)."""
    if healthy is not None and healthy.status == "Unknown":
        return "Unknown", healthy.reason, healthy.message
    targeted = nodes.targeted
    if targeted == 0 or verdict is None:
        return "Unknown", Reason.NO_TARGETED_NODES.value, "nodeSelector matches no node"
    good = verdict.admissible
    excluded = len(verdict.excluded)
    not_judged = f"; {nodes.stale} without a fresh report not counted" if nodes.stale else ""
    if verdict.tripped:
        failing = (
            f"{verdict.wanting} of {targeted} targeted nodes failing, more than "
            f"{_allowed(verdict)}: a mass failure is more likely a probe or config fault"
        )
        if verdict.holds_admission:
            return (
                "False",
                Reason.TOO_MANY_FAILING.value,
                f"{failing}; admission waits (onBreakerTripped: hold){not_judged}",
            )
        if good > 0:
            return (
                "True",
                Reason.ADMITTING_PAST_BREAKER.value,
                f"{failing}; admission goes on (onBreakerTripped: admit) on {good} healthy "
                f"node(s), kept off the {excluded} excluded{not_judged}",
            )
    if good == 0:
        return (
            "False",
            Reason.NO_HEALTHY_NODES.value,
            f"no healthy node among the {targeted} targeted ({excluded} excluded){not_judged}",
        )
    return (
        "True",
        Reason.CAPACITY_AVAILABLE.value,
        f"{good} of {targeted} targeted nodes healthy, {excluded} excluded "
        f"({_allowed(verdict)}); workloads are kept off the excluded nodes{not_judged}",
    )


__all__ = ["GatingCondition", "UsableCondition", "gating_condition", "usable_condition"]
