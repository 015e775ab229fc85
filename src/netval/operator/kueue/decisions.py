"""Pure decisions of the Kueue AdmissionCheck controller: parameters, conditions, the next
state of our check entries."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

from netval.model.manifest import API_GROUP, KIND
from netval.operator.gating.capacity import judge
from netval.operator.kueue.topology import DomainNeed
from netval.operator.term_runtime import ValidationView

ACTIVE: Final = "Active"
MAX_MESSAGE: Final = 1024

CheckState = Literal["Pending", "Ready", "Retry", "Rejected"]


def check_parameters(spec: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
    """(validation name, None) or (None, why the parameters cannot be used)."""
    params = (spec or {}).get("parameters") or {}
    want = f"apiGroup {API_GROUP}, kind {KIND}"
    if not params:
        return None, f"spec.parameters must name a NetworkValidation ({want}, name)"
    if params.get("apiGroup") != API_GROUP or params.get("kind") != KIND:
        got = f"apiGroup {params.get('apiGroup')!r}, kind {params.get('kind')!r}"
        return None, f"spec.parameters must reference {want}; got {got}"
    name = params.get("name")
    if not isinstance(name, str) or not name:
        return None, "spec.parameters.name must name a NetworkValidation"
    return name, None


def condition(
    conditions: Sequence[Mapping[str, Any]] | None, kind: str
) -> Mapping[str, Any] | None:
    return next((c for c in conditions or () if c.get("type") == kind), None)


def condition_true(status: Mapping[str, Any] | None, kind: str) -> bool:
    found = condition((status or {}).get("conditions"), kind)
    return found is not None and found.get("status") == "True"


def with_condition(
    conditions: Sequence[Mapping[str, Any]] | None, new: Mapping[str, Any], now: datetime
) -> list[dict[str, Any]]:
    """`conditions` with `new` set (metav1.Condition rules: lastTransitionTime moves only when
    the status changes); other types untouched."""
    out = [dict(c) for c in conditions or () if c.get("type") != new["type"]]
    old = condition(conditions, str(new["type"]))
    entry = dict(new)
    if old is not None and old.get("status") == new["status"] and old.get("lastTransitionTime"):
        entry["lastTransitionTime"] = old["lastTransitionTime"]
    else:
        entry["lastTransitionTime"] = _timestamp(now)
    out.append(entry)
    return out


def same_condition(a: Mapping[str, Any] | None, b: Mapping[str, Any]) -> bool:
    keys = ("status", "reason", "message", "observedGeneration")
    return a is not None and all(a.get(k) == b.get(k) for k in keys)


def active_condition(
    validation: str | None, error: str | None, found: bool, generation: int
) -> dict[str, Any]:
    """The Active condition for an AdmissionCheck of ours (without lastTransitionTime)."""
    if error is not None:
        status, reason, message = "False", "BadParameters", error
    elif not found:
        status, reason = "False", "ValidationNotFound"
        message = f"no NetworkValidation named {validation!r} is known to the netval operator"
    else:
        status, reason = "True", "Active"
        message = f"netval judges workloads by NetworkValidation {validation!r}"
    return {
        "type": ACTIVE,
        "status": status,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "observedGeneration": generation,
    }


@dataclass(frozen=True, slots=True)
class Verdict:
    state: CheckState
    message: str


def decide(
    current: Mapping[str, Any],
    view: ValidationView | None,
    *,
    validation: str,
    admitted: bool,
    assigned_nodes: Sequence[str] = (),
    domains: Sequence[DomainNeed] = (),
    pods: int = 0,
) -> Verdict | None:
    """The state our check entry should have (None: leave it as it is).

    `assigned_nodes`: the nodes a Topology-Aware Scheduling assignment names by hostname
    (none may be excluded by the node verdict); `domains`: the domains above nodes it
    places pods in (each must have as many admissible nodes as it needs). Without either,
    `pods` (the pods of the admission's podSetAssignments) is the number of healthy nodes
    the Workload needs under `admissionPolicy: capacity` (one pod per node)."""
    state = current.get("state") or "Pending"
    if view is None:
        if state == "Pending":
            return Verdict("Pending", f"NetworkValidation {validation!r} is not known to netval")
        return None
    bad = [n for n in assigned_nodes if n in view.excluded]
    short = [(d, have) for d in domains if (have := _admissible(view, d)) < d.needed]
    placed = bool(assigned_nodes or domains)
    verdict = judge(view, None if placed or pods <= 0 else pods)
    ok = verdict.ok and not bad and not short
    where = _where(validation, bad, short)
    if state == "Pending":
        if ok:
            return Verdict("Ready", f"{verdict.why}{_placed(assigned_nodes, domains)}")
        if where:
            return Verdict("Retry", f"{where}; retry on other nodes")
        return Verdict("Pending", f"waiting until {verdict.waits_for}: {verdict.why}")
    if state == "Ready" and not ok and not admitted:
        return Verdict("Retry", f"no longer admitted: {where or verdict.why}")
    return None


def _admissible(view: ValidationView, domain: DomainNeed) -> int:
    decisions = view.decisions
    return sum(1 for n in domain.nodes if (d := decisions.get(n)) is not None and d.admissible)


def _where(validation: str, bad: Sequence[str], short: Sequence[tuple[DomainNeed, int]]) -> str:
    """Why the placement cannot stand ("" when it can)."""
    parts = []
    if bad:
        parts.append(f"assigned node(s) with unhealthy fabric: {_names(bad)}")
    parts += [
        f"domain {d.describe()} has {have} healthy node(s), the assignment needs {d.needed}"
        for d, have in short[:5]
    ]
    return f"{'; '.join(parts)} (NetworkValidation {validation!r})" if parts else ""


def _placed(assigned: Sequence[str], domains: Sequence[DomainNeed]) -> str:
    out = ""
    if assigned:
        out += f"; none of the assigned nodes ({_names(assigned)}) is unhealthy"
    if domains:
        shown = ", ".join(f"{d.describe()} ({d.needed})" for d in domains[:5])
        out += f"; enough healthy nodes in {shown}"
    return out


def updated_checks(
    checks: Sequence[Mapping[str, Any]], verdicts: Mapping[str, Verdict], now: datetime
) -> list[dict[str, Any]] | None:
    """The whole admissionChecks list with our verdicts applied; None when nothing changes.
    Entries of other controllers are copied as they are."""
    out: list[dict[str, Any]] = []
    changed = False
    for entry in checks:
        new = copy.deepcopy(dict(entry))
        verdict = verdicts.get(str(entry.get("name")))
        if verdict is not None:
            message = verdict.message[:MAX_MESSAGE]
            if new.get("state") != verdict.state:
                new["state"] = verdict.state
                new["lastTransitionTime"] = _timestamp(now)
                changed = True
            if new.get("message") != message:
                new["message"] = message
                changed = True
            if not new.get("lastTransitionTime"):
                new["lastTransitionTime"] = _timestamp(now)
                changed = True
        out.append(new)
    return out if changed else None


def _names(names: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(names[:limit])
    return f"{shown} and {len(names) - limit} more" if len(names) > limit else shown


def _timestamp(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rv_older(new: str | None, old: str | None) -> bool:
    """Whether resourceVersion `new` is older than `old` (when both are numbers, as etcd's
    are; opaque ones are never called older)."""
    try:
        return new is not None and old is not None and int(new) < int(old)
    except ValueError:
        return False
