"""The status one write would carry (pure): the aggregated conditions and counts, the
east-west summary of peers-enabled validations, the Usable condition (admission on capacity,
`netval.operator.gating.capacity`) and the Gating condition node gating set."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Literal

from netval.model.ids import CheckId, Status, worst
from netval.model.spec import NetworkValidationSpec
from netval.model.status import (
    CheckCounts,
    Condition,
    ConditionType,
    NetworkValidationStatus,
    Reason,
)
from netval.operator.gating.capacity import usable_condition
from netval.operator.gating.decisions import GatingCondition
from netval.operator.state import validation as vs
from netval.operator.state.aggregation import compute_status
from netval.operator.state.east_west_matrix import east_west
from netval.operator.state.validation import ValidationState
from netval.operator.topology.agreement import peer_topology_key
from netval.operator.topology.summary import fold_topology


def validation_status(
    state: ValidationState,
    spec: NetworkValidationSpec | None,
    *,
    node_labels: Mapping[str, Mapping[str, str]],
    previous: NetworkValidationStatus | None,
    gate: GatingCondition | None,
    now: datetime,
) -> NetworkValidationStatus:
    status = compute_status(state, now, previous=previous)
    if spec is not None and spec.checks.peers.enabled:
        key = peer_topology_key(spec, (node_labels.get(n, {}) for n in state.targeted))
        fresh = {
            n: rec.peer_results
            for n, rec in state.nodes.items()
            if n in state.targeted and vs.is_fresh(state, n, now)
        }
        # every targeted node's domain, so a silent node still counts in its domain
        domains = {n: node_labels.get(n, {}).get(key) for n in state.targeted}
        summary = east_west(
            fresh, domains, min_throughput_ratio=spec.checks.peers.min_throughput_ratio
        )
        status = status.model_copy(update={"east_west": summary})
    if spec is not None and (spec.topology.lldp or spec.topology.levels):
        status = _with_topology(status, state, spec, node_labels, now)
    if spec is not None:
        usable = usable_condition(
            status.nodes,
            status.condition(ConditionType.HEALTHY),
            spec.gating.max_unhealthy_percent,
        )
    else:
        usable = ("Unknown", Reason.INVALID_SPEC.value, "no valid spec")
    status = _with_condition(status, ConditionType.USABLE, *usable, state, previous, now)
    if gate is None:
        return status
    ok, reason, message = gate
    return _with_condition(
        status, ConditionType.GATING, "True" if ok else "False", reason, message, state,
        previous, now,
    )  # fmt: skip


def _with_topology(
    status: NetworkValidationStatus,
    state: ValidationState,
    spec: NetworkValidationSpec,
    node_labels: Mapping[str, Mapping[str, str]],
    now: datetime,
) -> NetworkValidationStatus:
    """status.topology, and topology.agreement counted per node in status.checks."""
    seen = {
        n: rec.topology
        for n, rec in state.nodes.items()
        if rec.topology is not None and n in state.targeted and vs.is_fresh(state, n, now)
    }
    fold = fold_topology(spec.topology, state.targeted, node_labels, seen)
    counts = CheckCounts()
    for results in fold.agreement.results.values():
        worst_status = worst(r.status for r in results)
        if worst_status is Status.PASS:
            counts = counts.model_copy(update={"pass_": counts.pass_ + 1})
        elif worst_status is Status.WARN:
            counts = counts.model_copy(update={"warn": counts.warn + 1})
        elif worst_status.is_bad:
            counts = counts.model_copy(update={"fail": counts.fail + 1})
    checks = dict(status.checks)
    if counts != CheckCounts():
        checks[CheckId.TOPOLOGY_AGREEMENT.value] = counts
    return status.model_copy(update={"topology": fold.status, "checks": checks})


def _with_condition(
    status: NetworkValidationStatus,
    kind: ConditionType,
    value: Literal["True", "False", "Unknown"],
    reason: str,
    message: str,
    state: ValidationState,
    previous: NetworkValidationStatus | None,
    now: datetime,
) -> NetworkValidationStatus:
    """`status` with condition `kind` set (lastTransitionTime kept while its status holds)."""
    before = previous.condition(kind) if previous is not None else None
    condition = Condition(
        type=kind,
        status=value,
        reason=reason,
        message=message,
        last_transition_time=before.last_transition_time
        if before is not None and before.status == value
        else now,
        observed_generation=state.generation,
    )
    others = [c for c in status.conditions if c.type != kind]
    return status.model_copy(update={"conditions": [*others, condition]})
