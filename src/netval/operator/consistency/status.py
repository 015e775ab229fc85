"""`status.consistency` from the cohorts' last verdicts (pure, bounded whatever the fleet).

Rows with findings (outliers, splits, transitioning nodes) come first, then the rest by
cohort and key; at most `MAX_KEYS` rows, `maxOutliersPerKey` named outliers per row with a
count of the rest, `MAX_VIOLATIONS` violations (oldest first) with a count of the rest.
"""

from __future__ import annotations

from datetime import UTC, datetime

from netval.model.consistency import (
    MAX_KEYS,
    MAX_NAMED,
    MAX_SPLIT_GROUPS,
    MAX_VIOLATIONS,
    ConsistencyStatus,
    FindingKind,
    KeySummary,
    NodeValue,
    ValueGroup,
    Violation,
)
from netval.operator.consistency.fingerprint import Fleet
from netval.operator.consistency.judge import KeyVerdict


def consistency_status(fleet: Fleet, *, max_named: int) -> ConsistencyStatus | None:
    """None when judgement is off (the field is then removed from the status)."""
    if not fleet.enabled:
        return None
    named = min(max_named, MAX_NAMED)
    rows: list[tuple[bool, str, KeyVerdict]] = []
    violations: list[Violation] = []
    nodes = 0
    for cohort, verdict in fleet.verdicts.items():
        nodes += verdict.members
        rows.extend((not (k.has_findings or k.transitioning), cohort, k) for k in verdict.keys)
        for node, findings in verdict.findings.items():
            for f in findings:
                if f.kind is FindingKind.VIOLATION:
                    violations.append(
                        Violation(
                            node=node, key=f.key, value=f.value, since=_since(fleet, node, f.key)
                        )
                    )
    rows.sort(key=lambda row: (row[0], row[1], row[2].key))
    keys = [_row(fleet, cohort, k, named) for _, cohort, k in rows[:MAX_KEYS]]
    violations.sort(key=lambda v: (v.since, v.node, v.key))
    return ConsistencyStatus(
        cohorts=len(fleet.verdicts),
        nodes=nodes,
        keys=keys,
        more_keys=max(0, len(rows) - MAX_KEYS),
        violations=violations[:MAX_VIOLATIONS],
        more_violations=max(0, len(violations) - MAX_VIOLATIONS),
    )


def _row(fleet: Fleet, cohort: str, k: KeyVerdict, named: int) -> KeySummary:
    outliers = [
        NodeValue(node=node, value=value, since=_since(fleet, node, k.key))
        for node, value in k.outliers
    ]
    # the longest-standing outliers first: the ones a rollout forgot
    outliers.sort(key=lambda o: (o.since, o.node))
    return KeySummary(
        cohort=cohort,
        key=k.key,
        nodes=k.nodes,
        majority=k.majority,
        share=round(k.share, 4),
        outliers=outliers[:named],
        more_outliers=max(0, len(outliers) - named),
        split=[ValueGroup(value=v, nodes=n) for v, n in k.split[:MAX_SPLIT_GROUPS]],
        transitioning=k.transitioning,
    )


def _since(fleet: Fleet, node: str, key: str) -> datetime:
    facts = fleet.nodes.get(node)
    at = facts.since.get(key) if facts is not None else None
    return at if at is not None else datetime.min.replace(tzinfo=UTC)
