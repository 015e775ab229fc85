"""`topology.agreement` folded into the judged nodes' own records, so it counts like any
check: in the node's status (warn: degraded; with agreement: fail, unhealthy, and so the
`netval.io/fabric` label and gating), in `status.checks` and, failing, in `status.failures`.

The judgement needs every node's view, so it is made at status time (`fold_into_nodes`) and
kept on each record until the next one: a new report of the node carries its previous
verdicts over (`carry_over`), so the node's health does not flicker between a report and the
next judgement. `own` keeps the report's values alone, so applying verdicts is idempotent.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from netval.model.ids import CheckId, Status, worst
from netval.model.spec import NetworkValidationSpec
from netval.model.topology import TopologyStatus
from netval.operator.state.node_verdicts import CHECK_BUCKET, fold_verdict
from netval.operator.topology.summary import fold_topology

if TYPE_CHECKING:
    from netval.operator.state.validation import NodeRecord, ValidationState

TopologyVerdicts = tuple[tuple[str, Status, str], ...]  # (netdev, status, message)
_CHECK = CheckId.TOPOLOGY_AGREEMENT.value


def apply_verdicts(rec: NodeRecord, verdicts: TopologyVerdicts) -> bool:
    """Fold `verdicts` into `rec` (on top of its own values and any other operator verdict);
    True when anything changed."""
    if verdicts == rec.topology_verdicts and (rec.own is not None or not verdicts):
        return False
    judged = [v for v in verdicts if v[1] in CHECK_BUCKET]
    status = worst(v[1] for v in judged) if judged else None
    failures = tuple(
        sorted((rec.reported_at, rec.node_name, _CHECK, v[0], v[2]) for v in judged if v[1].is_bad)
    )
    rec.topology_verdicts = verdicts
    return fold_verdict(rec, _CHECK, status, failures)


def carry_over(rec: NodeRecord, previous: NodeRecord | None) -> None:
    """A new report keeps the node's last verdicts until the next judgement."""
    if previous is not None and previous.topology_verdicts:
        apply_verdicts(rec, previous.topology_verdicts)


def fold_into_nodes(
    state: ValidationState,
    spec: NetworkValidationSpec,
    node_labels: Mapping[str, Mapping[str, str]],
    now: datetime,
) -> TopologyStatus | None:
    """Judge the fresh targeted nodes, fold the verdicts into their records, return
    `status.topology` (None when spec.topology asks for nothing: verdicts are cleared)."""
    from netval.operator.state import validation as vs

    enabled = spec.topology.lldp or bool(spec.topology.levels)
    seen = {}
    if enabled:
        seen = {
            n: rec.topology
            for n, rec in state.nodes.items()
            if rec.topology is not None and n in state.targeted and vs.is_fresh(state, n, now)
        }
    fold = fold_topology(spec.topology, state.targeted, node_labels, seen) if enabled else None
    results = fold.agreement.results if fold is not None else {}
    for node, rec in state.nodes.items():
        verdicts = tuple((v.subject, v.status, v.message) for v in results.get(node, []))
        if apply_verdicts(rec, verdicts):
            state.dirty = True
    return fold.status if fold is not None else None


__all__ = ["TopologyVerdicts", "apply_verdicts", "carry_over", "fold_into_nodes"]
