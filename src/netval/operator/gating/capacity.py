"""Admission on capacity (pure): the Usable condition, and whether a workload may start.

On a fleet some node is always failing, so the validation-wide Healthy condition is nearly
always False; the node affinity the webhook injects (and Kueue's per-node check) already keep
workloads off the failing nodes. So admission, under `gating.admissionPolicy: capacity`
(the default), asks instead whether the validation is *usable*: its failing nodes are within
the breaker's cap (`maxUnhealthyPercent`, at least one node), so the verdicts are trusted,
and it has healthy nodes -- as many as the workload says it needs. `strict` keeps the
behaviour before: wait until the validation is Healthy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from netval.model.keys import AnnotationKey
from netval.model.spec import AdmissionPolicy
from netval.model.status import Condition, NodeCounts, Reason
from netval.operator.gating.decisions import breaker_cap

if TYPE_CHECKING:
    from netval.operator.state.store import ValidationView

MAX_MIN_HEALTHY_NODES: Final = 1_000_000
_WHOLE: Final = re.compile(r"[0-9]{1,7}")  # ASCII only: str.isdigit() takes "²" too

UsableCondition = tuple[Literal["True", "False", "Unknown"], str, str]


def usable_condition(
    nodes: NodeCounts, healthy: Condition | None, max_unhealthy_percent: float
) -> UsableCondition:
    """The Usable condition (status, reason, message) from the node counts of a status and
    its Healthy condition (Unknown there, with no fresh report, is Unknown here too)."""
    if healthy is not None and healthy.status == "Unknown":
        return "Unknown", healthy.reason, healthy.message
    targeted = nodes.targeted
    if targeted == 0:
        return "Unknown", Reason.NO_TARGETED_NODES.value, "nodeSelector matches no node"
    cap = breaker_cap(targeted, max_unhealthy_percent)
    good = nodes.passing + nodes.warning
    allowed = f"maxUnhealthyPercent {max_unhealthy_percent:g}% allows {cap}"
    not_judged = f"; {nodes.stale} without a fresh report not counted" if nodes.stale else ""
    if nodes.failing > cap:
        return (
            "False",
            Reason.TOO_MANY_FAILING.value,
            f"{nodes.failing} of {targeted} targeted nodes failing, more than {allowed}: a "
            "mass failure is more likely a probe or config fault, admission waits"
            f"{not_judged}",
        )
    if good == 0:
        return (
            "False",
            Reason.NO_HEALTHY_NODES.value,
            f"no healthy node among the {targeted} targeted{not_judged}",
        )
    return (
        "True",
        Reason.CAPACITY_AVAILABLE.value,
        f"{good} of {targeted} targeted nodes healthy, {nodes.failing} failing ({allowed}); "
        f"workloads are kept off the failing nodes{not_judged}",
    )


def min_healthy_nodes(annotations: Mapping[str, Any] | None) -> int | None:
    """The `netval.io/min-healthy-nodes` annotation of a Pod or Job (None when absent);
    ValueError, saying what is wrong, when it is not a whole number >= 1."""
    raw = (annotations or {}).get(AnnotationKey.MIN_HEALTHY_NODES)
    if raw is None:
        return None
    text = str(raw).strip()
    if not _WHOLE.fullmatch(text) or not 1 <= int(text) <= MAX_MIN_HEALTHY_NODES:
        raise ValueError(
            f"annotation {AnnotationKey.MIN_HEALTHY_NODES.value} must be a whole number from 1 "
            f"to {MAX_MIN_HEALTHY_NODES}, got {str(raw)[:40]!r}"
        )
    return int(text)


@dataclass(frozen=True, slots=True)
class AdmissionVerdict:
    ok: bool
    why: str  # what admits it, or what it waits for
    # the condition it waits for, for messages ("until it is Usable"); "" when ok
    waits_for: str = ""


def judge(view: ValidationView, needed: int | None = None) -> AdmissionVerdict:
    """Whether a workload judged by `view` may start now. `needed`: the healthy nodes it
    needs (capacity policy only; None: any one)."""
    name = f"NetworkValidation {view.name!r}"
    if view.policy is AdmissionPolicy.STRICT:
        if view.healthy:
            return AdmissionVerdict(True, f"{name} is Healthy")
        return AdmissionVerdict(
            False, f"{name} is not Healthy: {view.healthy_message}", "it is Healthy"
        )
    if not view.usable:
        return AdmissionVerdict(
            False, f"{name} is not Usable: {view.usable_message}", "it is Usable"
        )
    if needed is not None and view.healthy_nodes < needed:
        return AdmissionVerdict(
            False,
            f"{name} has {view.healthy_nodes} healthy node(s), the workload needs {needed}",
            f"it has {needed} healthy nodes",
        )
    return AdmissionVerdict(True, f"{name} is Usable: {view.usable_message}")
