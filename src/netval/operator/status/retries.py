"""`status.retries`: requester-side retries on many nodes at once, and whom they point at
(pure).

When a node dies or stalls, every node that talks to it counts requester-side retries and
timeouts (`local_ack_timeout_err`, `req_transport_retries_exceeded`, ...); the agents report
those as `rdma.errors` warnings attributed to the requester (`netval.model.attribution`),
which never taint nor make a node `unhealthy`. When at least `MIN_NODES` fresh targeted
nodes warn so, the status says how many, since when, which counters, and names the likely
culprits: the targeted nodes that are offline (their agent's last will), silent (no report
within 3 intervals) or failing, those whose trouble began nearest before the retries did
first ("retries on 40 nodes since gpu-17 went offline"). The Healthy condition's message
carries the same sentence; an Event `RetriesAttributed` says it when the first culprit
changes (`status.writer`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

from netval.model.status import (
    MAX_CULPRITS,
    MAX_RETRY_COUNTERS,
    Condition,
    ConditionType,
    Culprit,
    CulpritState,
    NetworkValidationStatus,
    Retries,
)
from netval.operator.gating.verdict import Heard
from netval.operator.state.validation import ValidationState, heard

# fewer warning nodes than this are a node's own trouble, not a storm
MIN_NODES: Final = 3
_VERB: Final = {
    CulpritState.OFFLINE: "went offline",
    CulpritState.SILENT: "went silent",
    CulpritState.FAILING: "started failing",
}


def retries_summary(state: ValidationState, now: datetime) -> Retries | None:
    """`status.retries` of the validation at `now` (None: fewer than MIN_NODES warn so)."""
    warning: list[datetime] = []
    counters: set[str] = set()
    suspects: list[tuple[CulpritState, datetime, str]] = []
    for node in state.targeted:
        rec = state.nodes.get(node)
        seen = heard(state, node, now)
        if seen is Heard.OFFLINE:
            suspects.append((CulpritState.OFFLINE, state.offline[node], node))
        elif rec is None:
            continue
        elif seen is Heard.SILENT:
            suspects.append((CulpritState.SILENT, rec.reported_at, node))
        elif rec.status.is_bad:
            since = min((f[0] for f in rec.failures), default=rec.reported_at)
            suspects.append((CulpritState.FAILING, since, node))
        elif rec.retries is not None:
            warning.append(rec.retries.since)
            counters.update(rec.retries.counters)
    if len(warning) < MIN_NODES:
        return None
    onset = min(warning)
    # trouble that began before the retries did (within an interval: reports are that far
    # apart) explains them best, the nearest first
    slack = timedelta(seconds=state.interval_seconds)
    suspects.sort(key=lambda c: (c[1] > onset + slack, abs(c[1] - onset), c[2]))
    named = [Culprit(node=n, state=kind, since=at) for kind, at, n in suspects[:MAX_CULPRITS]]
    head = f"requester-side retries on {len(warning)} nodes"
    if named:
        first = named[0]
        message = f"{head} since {first.node} {_VERB[first.state]}"
        others = [f"{c.node} ({c.state.value})" for c in named[1:]]
        if others:
            message += f" (also {', '.join(others)})"
    else:
        message = (
            f"{head}, and no targeted node is offline, silent or failing: see the paths "
            "(status.eastWest)"
        )
    message += "; not their fault: they are neither tainted nor unhealthy"
    return Retries(
        nodes=len(warning),
        since=onset,
        counters=sorted(counters)[:MAX_RETRY_COUNTERS],
        culprits=named,
        message=message[:1024],
    )


def with_retries(
    status: NetworkValidationStatus, retries: Retries | None
) -> NetworkValidationStatus:
    """`status` with its `retries` set, and the Healthy message saying it too."""
    if retries is None:
        return status if status.retries is None else status.model_copy(update={"retries": None})
    conditions: list[Condition] = []
    for c in status.conditions:
        if c.type is ConditionType.HEALTHY:
            c = c.model_copy(update={"message": f"{c.message}; {retries.message}"})
        conditions.append(c)
    return status.model_copy(update={"retries": retries, "conditions": conditions})


__all__ = ["MIN_NODES", "retries_summary", "with_retries"]
