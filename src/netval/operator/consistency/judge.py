"""Fleet consistency judgement (pure): one cohort's facts -> per-key verdicts and findings.

A cohort is the targeted nodes with the same NIC model (and the same `cohortLabel` value).
For each fact key:

- a value outside the declared intent (`expect`) is a Violation, whatever the cohort's size;
- values a rollout allows are Transitioning until its `until` (then ordinary values again),
  and do not count towards the majority (a half-done rollout must not make a Split);
- among the other nodes, a value held by >= `majority` of a cohort of >= `min_cohort` nodes
  reporting the key is the majority, and every other value an Outlier;
- no such majority is a Split: the groups are reported, none is picked, no node is blamed;
- a cohort below `min_cohort` gives no Outlier and no Split.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from netval.model.consistency import FindingKind


@dataclass(frozen=True, slots=True)
class Settings:
    majority: float = 0.8  # share of the cohort, 0.5 < majority <= 1
    min_cohort: int = 5
    expect: Mapping[str, frozenset[str]] = field(default_factory=dict)
    rollout: Mapping[str, tuple[frozenset[str], datetime]] = field(default_factory=dict)

    def transitioning(self, key: str, value: str, now: datetime) -> bool:
        window = self.rollout.get(key)
        return window is not None and value in window[0] and now < window[1]

    def next_expiry(self, now: datetime) -> datetime | None:
        """The earliest rollout end still ahead: time alone changes the judgement then."""
        ahead = [until for _, until in self.rollout.values() if until > now]
        return min(ahead) if ahead else None


@dataclass(frozen=True, slots=True)
class Finding:
    kind: FindingKind
    key: str
    value: str
    detail: str


@dataclass(slots=True)
class KeyVerdict:
    key: str
    nodes: int  # members reporting the key
    majority: str | None = None
    share: float = 0.0
    outliers: list[tuple[str, str]] = field(default_factory=list)  # (node, value), sorted
    split: list[tuple[str, int]] = field(default_factory=list)  # (value, nodes), largest first
    transitioning: int = 0

    @property
    def has_findings(self) -> bool:
        return bool(self.outliers or self.split)


@dataclass(slots=True)
class CohortVerdict:
    cohort: str
    members: int
    keys: list[KeyVerdict] = field(default_factory=list)
    findings: dict[str, list[Finding]] = field(default_factory=dict)  # node -> findings
    judged: bool = False  # the cohort reached min_cohort
    member_nodes: tuple[str, ...] = ()


def judge_cohort(
    cohort: str, members: Mapping[str, Mapping[str, str]], settings: Settings, now: datetime
) -> CohortVerdict:
    """O(members x keys). `members`: node -> its facts (nodes of this cohort only)."""
    verdict = CohortVerdict(
        cohort=cohort,
        members=len(members),
        judged=len(members) >= settings.min_cohort,
        member_nodes=tuple(members),
    )
    by_key: dict[str, dict[str, str]] = {}
    for node, facts in members.items():
        for key, value in facts.items():
            by_key.setdefault(key, {})[node] = value
    for key in sorted(by_key):
        verdict.keys.append(_judge_key(key, by_key[key], settings, now, verdict))
    return verdict


def _judge_key(
    key: str,
    values: dict[str, str],
    settings: Settings,
    now: datetime,
    verdict: CohortVerdict,
) -> KeyVerdict:
    out = KeyVerdict(key=key, nodes=len(values))
    allowed = settings.expect.get(key)
    base: dict[str, str] = {}
    violating: set[str] = set()
    for node, value in values.items():
        if settings.transitioning(key, value, now):
            out.transitioning += 1
            until = settings.rollout[key][1].isoformat()
            _add(verdict, node, FindingKind.TRANSITIONING, key, value, f"rollout until {until}")
            continue
        if allowed is not None and value not in allowed:
            violating.add(node)
            want = ", ".join(sorted(allowed))
            _add(verdict, node, FindingKind.VIOLATION, key, value, f"expected one of: {want}")
        base[node] = value
    if not base:
        return out
    counts = Counter(base.values())
    top, top_count = min(counts.items(), key=lambda item: (-item[1], item[0]))
    out.share = top_count / len(base)
    if len(values) < settings.min_cohort:
        return out  # too few to say what is normal: no Outlier, no Split
    if out.share + 1e-9 >= settings.majority:
        out.majority = top
        share = f"{top_count} of {len(base)} nodes"
        for node in sorted(base):
            value = base[node]
            if value == top:
                continue
            out.outliers.append((node, value))
            if node not in violating:  # a Violation already says more than an Outlier
                detail = f"cohort {verdict.cohort} majority {top} ({share})"
                _add(verdict, node, FindingKind.OUTLIER, key, value, detail)
    else:
        out.split = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return out


def _add(
    verdict: CohortVerdict, node: str, kind: FindingKind, key: str, value: str, detail: str
) -> None:
    verdict.findings.setdefault(node, []).append(Finding(kind, key, value, detail))
