"""Fold fingerprints into verdicts: re-judge only the cohorts that changed (pure, in memory).

`refresh` returns the `fleet.consistency` verdict of every node whose cohort was re-judged;
the validation state folds each into the node's record, so gating, admission, the failures
list and the check counts treat an Outlier like any other warn (or fail, if so configured).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from netval.model.consistency import FindingKind
from netval.model.ids import Status, worst
from netval.model.spec import Consistency, FindingSeverity
from netval.operator.consistency.fingerprint import Fleet
from netval.operator.consistency.judge import CohortVerdict, Finding, Settings, judge_cohort

MAX_MESSAGE: Final = 1024
_SEVERITY: Final = {FindingSeverity.WARN: Status.WARN, FindingSeverity.FAIL: Status.FAIL}


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    """A node's fleet.consistency result: status, message, and (key, message) per failing key."""

    status: Status
    message: str
    failing: tuple[tuple[str, str], ...] = ()


def configure(fleet: Fleet, spec: Consistency) -> None:
    """The spec's consistency section; a change re-judges every cohort."""
    settings = Settings(
        majority=spec.majority_percent / 100,
        min_cohort=spec.min_cohort,
        expect={k: frozenset(v) for k, v in spec.expect.items()},
        rollout={k: (frozenset(r.allowed), r.until) for k, r in spec.rollout.items()},
    )
    severities = (_SEVERITY[spec.outlier_severity], _SEVERITY[spec.violation_severity])
    if (settings, spec.enabled, severities) != (
        fleet.settings,
        fleet.enabled,
        (fleet.outlier, fleet.violation),
    ):
        fleet.settings = settings
        fleet.enabled = spec.enabled
        fleet.outlier, fleet.violation = severities
        fleet.dirty.update(fleet.cohorts)
        fleet.dirty.update(fleet.verdicts)


def refresh(
    fleet: Fleet, targeted: Collection[str], now: datetime
) -> dict[str, NodeVerdict | None]:
    """Re-judge the dirty cohorts (all of them once a rollout's `until` has passed).
    Returns node -> verdict for the nodes concerned; None: the node has no verdict now."""
    if fleet.expires_at is not None and now >= fleet.expires_at:
        fleet.dirty.update(fleet.cohorts)
    if not fleet.dirty:
        return {}
    fleet.expires_at = fleet.settings.next_expiry(now)
    out: dict[str, NodeVerdict | None] = {}
    for cohort in sorted(fleet.dirty):
        old = fleet.verdicts.pop(cohort, None)
        if old is not None:
            out.update(dict.fromkeys(old.member_nodes))
        members = {n: fleet.nodes[n].values for n in fleet.cohorts.get(cohort, ()) if n in targeted}
        if not members or not fleet.enabled:
            continue
        verdict = judge_cohort(cohort, members, fleet.settings, now)
        fleet.verdicts[cohort] = verdict
        for node in members:
            out[node] = node_verdict(fleet, verdict, verdict.findings.get(node, []))
    fleet.dirty.clear()
    return out


def node_verdict(fleet: Fleet, verdict: CohortVerdict, findings: list[Finding]) -> NodeVerdict:
    if not findings:
        if not verdict.judged:
            return NodeVerdict(
                Status.SKIP,
                f"cohort {verdict.cohort} has {verdict.members} nodes, fewer than"
                f" minCohort {fleet.settings.min_cohort}: not compared",
            )
        return NodeVerdict(
            Status.PASS, f"consistent with cohort {verdict.cohort} ({verdict.members} nodes)"
        )
    statuses = {
        FindingKind.VIOLATION: fleet.violation,
        FindingKind.OUTLIER: fleet.outlier,
        FindingKind.TRANSITIONING: Status.PASS,
    }
    status = worst(statuses.get(f.kind, Status.PASS) for f in findings)
    parts = [f"{f.kind.value} {f.key}={f.value}: {f.detail}" for f in findings]
    failing = tuple(
        (f.key, _clip(f"{f.kind.value} {f.key}={f.value}: {f.detail}"))
        for f in findings
        if statuses.get(f.kind, Status.PASS).is_bad
    )
    return NodeVerdict(status, _clip("; ".join(parts)), failing)


def _clip(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 1] + "\u2026"
