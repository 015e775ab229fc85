"""The NetworkValidation status of one validation, computed from its `ValidationState`.

Pure: no I/O, no clock (``now`` is passed in). The semantics it implements (freshness,
Ready and Healthy, failures and their ``since``) are stated in `netval.operator.state.validation`.
"""

from __future__ import annotations

import heapq
import itertools
from datetime import datetime, timedelta
from typing import Final, Literal

from netval.model.ids import Status
from netval.model.status import (
    MAX_FAILURES,
    CheckCounts,
    Condition,
    ConditionType,
    Failure,
    NetworkValidationStatus,
    NodeCounts,
    Reason,
)
from netval.operator.gating.verdict import Heard
from netval.operator.state.validation import (
    FailureKey,
    NodeRecord,
    ValidationState,
    grace_start,
    heard,
    require_aware,
)

MAX_NAMES_IN_MESSAGE: Final = 5
MAX_CHECKS_PER_NODE_IN_MESSAGE: Final = 3

ConditionStatus = Literal["True", "False", "Unknown"]


def compute_status(
    state: ValidationState, now: datetime, *, previous: NetworkValidationStatus | None
) -> NetworkValidationStatus:
    """The status to write. ``previous`` (the status last written) keeps lastTransitionTime
    of conditions whose status did not change, and its conditions of other types (Gating)."""
    require_aware(now)
    window = state.stale_after
    fresh: list[tuple[str, NodeRecord]] = []
    stale: list[tuple[str, str]] = []  # (node, why)
    awaiting: list[str] = []
    ever_reported = 0
    last_report: datetime | None = None
    for node in state.targeted:
        rec = state.nodes.get(node)
        if rec is not None:
            ever_reported += 1
            if last_report is None or rec.reported_at > last_report:
                last_report = rec.reported_at
        seen = heard(state, node, now)
        if seen is Heard.FRESH and rec is not None:
            fresh.append((node, rec))
        elif seen is Heard.OFFLINE:
            stale.append((node, "offline"))
        elif rec is not None and rec.unconfirmed:
            stale.append((node, "a beat contradicts its last report; awaiting the next"))
        elif rec is not None:
            stale.append((node, f"last report {_ago(now - rec.reported_at)} ago"))
        elif now - grace_start(state, node) > window:
            stale.append((node, "never reported"))
        else:
            awaiting.append(node)

    passing = warning = 0
    failing: list[tuple[str, NodeRecord]] = []
    older_generation = 0
    totals: dict[str, list[int]] = {}
    failure_lists: list[tuple[FailureKey, ...]] = []
    for node, rec in fresh:
        severity = rec.status.severity
        if severity >= Status.FAIL.severity:
            failing.append((node, rec))
            if rec.failures:
                failure_lists.append(rec.failures)
        elif severity == Status.WARN.severity:
            warning += 1
        else:
            passing += 1
        if rec.generation < state.generation:
            older_generation += 1
        for check, bucket in rec.check_buckets:
            counts = totals.get(check)
            if counts is None:
                counts = totals[check] = [0, 0, 0]
            counts[bucket] += 1

    failures = [
        Failure(node=n, check=c, subject=s, message=m, since=t)
        for t, n, c, s, m in itertools.islice(heapq.merge(*failure_lists), MAX_FAILURES)
    ]
    targeted = len(state.targeted)
    node_counts = NodeCounts(
        targeted=targeted,
        reporting=len(fresh),
        passing=passing,
        warning=warning,
        failing=len(failing),
        stale=targeted - len(fresh),
    )
    ready = _ready(state, fresh, stale, awaiting, older_generation)
    healthy = _healthy(state, fresh, failing, warning, len(stale) + len(awaiting), ever_reported)
    conditions = [
        _condition(ConditionType.READY, *ready, state=state, now=now, previous=previous),
        _condition(ConditionType.HEALTHY, *healthy, state=state, now=now, previous=previous),
    ]
    if previous is not None:
        ours = (ConditionType.READY, ConditionType.HEALTHY)
        conditions.extend(c for c in previous.conditions if c.type not in ours)
    return NetworkValidationStatus(
        observed_generation=state.generation,
        conditions=conditions,
        nodes=node_counts,
        checks={
            check: CheckCounts(pass_=c[0], warn=c[1], fail=c[2])
            for check, c in sorted(totals.items())
        },
        failures=failures,
        last_report_time=last_report,
    )


_Verdict = tuple[ConditionStatus, Reason, str]


def _ready(
    state: ValidationState,
    fresh: list[tuple[str, NodeRecord]],
    stale: list[tuple[str, str]],
    awaiting: list[str],
    older_generation: int,
) -> _Verdict:
    targeted = len(state.targeted)
    if state.spec_error is not None:
        return "False", Reason.INVALID_SPEC, _clip(f"invalid spec: {state.spec_error}")
    if not state.agents_ready:
        detail = f": {state.agents_detail}" if state.agents_detail else ""
        return "False", Reason.AGENTS_PENDING, f"agent DaemonSet not rolled out yet{detail}"
    if targeted == 0:
        return (
            "False",
            Reason.NO_TARGETED_NODES,
            "nodeSelector matches no node: nothing to validate",
        )
    reporting = f"{len(fresh)} of {targeted} targeted nodes reporting"
    if stale:
        stale.sort()
        names = _names([f"{n} ({why})" for n, why in stale], len(stale))
        msg = f"{len(stale)} of {targeted} targeted nodes stale: {names}"
        if awaiting:
            msg += f"; {len(awaiting)} awaiting a first report"
        return "False", Reason.NODES_STALE, _clip(_with_agent_pods(state, msg))
    if awaiting:
        awaiting.sort()
        msg = f"{reporting}; awaiting a first report from {_names(awaiting, len(awaiting))}"
        return "False", Reason.AWAITING_REPORTS, _clip(_with_agent_pods(state, msg))
    msg = f"all {targeted} targeted nodes reporting"
    if older_generation:
        msg += (
            f"; {older_generation} still on a generation older than {state.generation}"
            " (agents rolling out)"
        )
    return "True", Reason.AGENTS_REPORTING, msg


def _with_agent_pods(state: ValidationState, message: str) -> str:
    return f"{message}; {state.agent_pods}" if state.agent_pods else message


def _healthy(
    state: ValidationState,
    fresh: list[tuple[str, NodeRecord]],
    failing: list[tuple[str, NodeRecord]],
    warning: int,
    not_judged: int,
    ever_reported: int,
) -> _Verdict:
    targeted = len(state.targeted)
    if targeted == 0:
        return "Unknown", Reason.NO_TARGETED_NODES, "nodeSelector matches no node"
    if not fresh:
        if ever_reported == 0:
            return "Unknown", Reason.AWAITING_REPORTS, "no targeted node has reported yet"
        return (
            "Unknown",
            Reason.NODES_STALE,
            f"no fresh report from any of the {targeted} targeted nodes",
        )
    if failing:
        failing.sort(key=lambda item: item[0])
        shown = [f"{n} ({_checks(rec.failing_checks)})" for n, rec in failing]
        names = _names(shown, len(failing))
        msg = f"{len(failing)} of {len(fresh)} reporting nodes failing: {names}"
        return "False", Reason.CHECKS_FAILING, msg
    msg = f"no failing checks on {len(fresh)} reporting nodes"
    if warning:
        warn_nodes = sorted(n for n, rec in fresh if rec.status is Status.WARN)
        msg += f"; {warning} warning: {_names(warn_nodes, warning)}"
    if not_judged:
        msg += f"; {not_judged} targeted nodes without a fresh report not judged (see Ready)"
    return "True", Reason.ALL_CHECKS_PASSING, msg


def _condition(
    kind: ConditionType,
    status: ConditionStatus,
    reason: Reason,
    message: str,
    *,
    state: ValidationState,
    now: datetime,
    previous: NetworkValidationStatus | None,
) -> Condition:
    before = previous.condition(kind) if previous is not None else None
    since = before.last_transition_time if before is not None and before.status == status else now
    return Condition(
        type=kind,
        status=status,
        reason=reason.value,
        message=message,
        last_transition_time=since,
        observed_generation=state.generation,
    )


def _checks(ids: tuple[str, ...]) -> str:
    if not ids:
        return "status fail"
    head = ", ".join(ids[:MAX_CHECKS_PER_NODE_IN_MESSAGE])
    more = len(ids) - MAX_CHECKS_PER_NODE_IN_MESSAGE
    return f"{head}, +{more} more" if more > 0 else head


def _names(items: list[str], total: int) -> str:
    head = ", ".join(items[:MAX_NAMES_IN_MESSAGE])
    more = total - MAX_NAMES_IN_MESSAGE
    return f"{head} and {more} more" if more > 0 else head


def _ago(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def _clip(message: str, limit: int = 1024) -> str:
    return message if len(message) <= limit else message[: limit - 1] + "\u2026"
