"""The node verdict's inputs, read off the operator's state at one instant (pure, no I/O).

Per validation: its `spec.gating` (`policy`) and, per targeted node, `NodeFacts`: how fresh
its last report is (`state.validation.heard`: 3 intervals, a beat, the agent's last will,
the operator's own reconnect grace), the report's effective status (its results with the
operator's verdicts folded in: fleet.consistency, topology.agreement, the east-west blame),
its recovery streak, whether it is an observer (its report warns only of failing paths, and
a suspect elsewhere explains all of them -- `ValidationState.observers` -- or it is the
first such report in a row: the next cycle's targeted re-probes carry the witnesses that
tell the culprit), and the decision of the round before. The decision before is the
validation's last verdict; for a node it has none of (the first round of an operator term,
a node newly targeted) it is what the Node carries: our taint or the label `unhealthy` mean
excluded, so a restart keeps a failing node out until it has passed `recoveryReports` times.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Final

from netval.model.ids import Status
from netval.model.keys import FabricHealth
from netval.model.spec import NetworkValidationSpec
from netval.operator.gating.verdict import (
    GatingPolicy,
    Heard,
    NodeFacts,
    ValidationVerdict,
    decide_validation,
)
from netval.operator.state import validation as vs
from netval.operator.state.node_verdicts import BLAME, settle_fleet

# what netval has on a Node: (its netval.io/fabric label, our taint present)
NodeFabric = Mapping[str, tuple[str | None, bool]]
_LABELS: Final = {h.value: h for h in FabricHealth}
PATH_GRACE_REPORTS: Final = 2
_PASS: Final = Status.PASS
_SKIP: Final = Status.SKIP


def policy(name: str, spec: NetworkValidationSpec) -> GatingPolicy:
    g = spec.gating
    return GatingPolicy(
        name=name,
        node_label=g.node_label,
        taint=g.taint,
        max_unhealthy_percent=g.max_unhealthy_percent,
        recovery_reports=g.recovery_reports,
        on_breaker_tripped=g.on_breaker_tripped,
    )


def node_facts(
    state: vs.ValidationState, node_fabric: NodeFabric, now: datetime
) -> dict[str, NodeFacts]:
    """Every targeted node's facts at `now`."""
    vs.require_aware(now)
    if state.fleet.dirty or state.fleet.expires_at is not None:
        settle_fleet(state, now)  # a pending cohort judgement changes report statuses
    before = state.verdict.nodes if state.verdict is not None else {}
    # the freshness rule of `state.validation.heard`, inlined: this runs for every targeted
    # node of every validation every status window
    offline, records, window = state.offline, state.nodes, state.stale_after
    heard_at = state.deafness.heard_at
    observers = state.observers
    fresh, silent = Heard.FRESH, Heard.SILENT
    out: dict[str, NodeFacts] = {}
    for node in state.targeted:
        rec = records.get(node)
        decided = before.get(node)
        was_label: FabricHealth | None
        if decided is not None:
            was_excluded, was_label = decided.excluded, decided.label
        else:
            label, tainted = node_fabric.get(node, (None, False))
            was_label = _LABELS.get(label or "")
            was_excluded = tainted or was_label is FabricHealth.UNHEALTHY
        if node in offline:
            heard = Heard.OFFLINE
        elif rec is None:
            out[node] = NodeFacts(Heard.NEVER, None, 0, False, False, was_excluded, was_label)
            continue
        elif rec.unconfirmed or now - heard_at(node, rec.reported_at) > window:
            heard = silent
        else:
            heard = fresh
        if rec is None:
            out[node] = NodeFacts(heard, None, 0, False, False, was_excluded, was_label)
            continue
        # a first report of failing paths is an observer's too: localization needs the
        # next cycle's witnesses (the targeted re-probes) to tell who the culprit is
        observer = (
            rec.path_warn
            and (node in observers or rec.path_warn_streak < PATH_GRACE_REPORTS)
            and all(st is None or st is _PASS or st is _SKIP for st, _ in rec.folded.values())
        )
        out[node] = NodeFacts(heard, rec.status, rec.ok_streak, BLAME in rec.folded,
                              rec.retries is not None, was_excluded, was_label,
                              observer)  # fmt: skip
    return out


def verdict_of(
    name: str,
    state: vs.ValidationState,
    spec: NetworkValidationSpec,
    node_fabric: NodeFabric,
    now: datetime,
) -> ValidationVerdict:
    """The validation's verdict at `now` (not recorded: the gating round records it)."""
    return decide_validation(policy(name, spec), node_facts(state, node_fabric, now))


def current_verdict(
    name: str,
    state: vs.ValidationState,
    spec: NetworkValidationSpec | None,
    node_fabric: NodeFabric,
    now: datetime,
) -> ValidationVerdict | None:
    """The last recorded verdict, else (before the first gating round) one decided now."""
    if state.verdict is not None or spec is None:
        return state.verdict
    return verdict_of(name, state, spec, node_fabric, now)


__all__ = ["NodeFabric", "current_verdict", "node_facts", "policy", "verdict_of"]
