"""What a node's own report says at an instant, for the state tests: the report's effective
status (its results with the operator's verdicts folded in) as a label value while the
report is fresh, `unknown` otherwise. One input of the node verdict (`gating.verdict`), which
adds the memory (hysteresis, silent after failing) and the breaker."""

from __future__ import annotations

from datetime import datetime

from netval.model.ids import Status
from netval.operator.state import validation as vs
from netval.operator.state.node_verdicts import settle_fleet

_LABEL = {
    Status.SKIP: "healthy",
    Status.PASS: "healthy",
    Status.WARN: "degraded",
    Status.FAIL: "unhealthy",
    Status.ERROR: "unhealthy",
}


def node_health(state: vs.ValidationState, node: str, now: datetime) -> str:
    if state.fleet.dirty or state.fleet.expires_at is not None:
        settle_fleet(state, now)
    rec = state.nodes.get(node)
    if node not in state.targeted or rec is None or not vs.is_fresh(state, node, now):
        return "unknown"
    return _LABEL[rec.status]
