"""Admission on capacity (pure): whether a workload may start.

On a fleet some node is always failing, so the validation-wide Healthy condition is nearly
always False; the node affinity the webhook injects (and Kueue's per-node check) already keep
workloads off the excluded nodes. So admission, under `gating.admissionPolicy: capacity`
(the default), asks instead whether the validation is *usable* (the `Usable` condition,
`gating.conditions`) and has healthy nodes -- as many as the workload says it needs.
`strict` waits until the validation is Healthy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from netval.model.keys import AnnotationKey
from netval.model.spec import AdmissionPolicy

if TYPE_CHECKING:
    from netval.operator.state.store import ValidationView

MAX_MIN_HEALTHY_NODES: Final = 1_000_000
_WHOLE: Final = re.compile(r"[0-9]{1,7}")  # ASCII only: str.isdigit() takes "²" too


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
