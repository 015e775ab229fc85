"""Scores of the detection campaign (pure: no I/O, no clock): what the product said at each
look (`Look`), who it flagged, whether it named an injected fault, and the per-class table.

What the product says, and only that, is scored (docs/detection.md):

- a node is **flagged** when its `netval.io/fabric` label is not `healthy` (`degraded`,
  `unhealthy`, `suspect`, `unknown`), it carries the `netval.io/fabric-unhealthy` taint, or
  `status.eastWest.suspects` names it; it is **gated** when labelled `unhealthy` or
  `suspect` or tainted;
- a fault is **named** (detected) when the product points at its subject with a check the
  docs give for it: a node fault by an entry of `status.failures` of that node or a suspect
  with one of the expected checks; a silent node by its label `unknown` (or worse); a link
  fault by a failing cross-domain cell of `status.eastWest` involving its leaf;
- during an injection (from the injection to the end of its settle time after the repair)
  every other flagged node is one **wrong naming** (for a link fault every flagged node is);
- a link fault is **localized** when, while it holds, `status.eastWest.linkSuspects` names
  its leaf's uplink or a domain pair with its leaf, and no node was gated meanwhile.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

FLAGGING_LABELS: Final = frozenset({"degraded", "unhealthy", "suspect", "unknown"})
GATING_LABELS: Final = frozenset({"unhealthy", "suspect"})
Kind = Literal["node", "silent", "link"]

# The goal figures (issue 33), printed beside the measured ones.
GOALS: Final = {
    "recall": 1.0,
    "precision": 0.98,
    "localized": 0.95,
    "ttd_p99_intervals": 2.0,  # link and configuration faults
    "soak_fp_per_node_hour": 0.0,
}


@dataclass(frozen=True, slots=True)
class Look:
    """One read of the validation's status and the targeted Nodes."""

    at: float  # monotonic seconds
    labels: dict[str, str | None]
    tainted: frozenset[str] = frozenset()
    failures: tuple[tuple[str, str, str], ...] = ()  # (node, check, subject)
    suspects: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (node, checks)
    cells: tuple[tuple[str, str, int], ...] = ()  # (domain a, domain b, failing results)
    links: tuple[tuple[str, str, str | None], ...] = ()  # status.eastWest.linkSuspects


@dataclass(frozen=True, slots=True)
class Expect:
    """What naming an injected fault takes: its kind, subject (a node, or for a link fault
    the leaf whose uplink it is) and the check ids docs/checks.md gives for it."""

    kind: Kind
    subject: str
    checks: frozenset[str] = frozenset()


def flagged(look: Look) -> dict[str, frozenset[str]]:
    """Node -> why it is flagged at this look (label, taint, suspect)."""
    why: dict[str, set[str]] = {}
    for node, label in look.labels.items():
        if label in FLAGGING_LABELS:
            why.setdefault(node, set()).add(f"label={label}")
    for node in look.tainted:
        why.setdefault(node, set()).add("taint")
    for node, checks in look.suspects:
        why.setdefault(node, set()).add(f"suspect({','.join(checks)})")
    return {n: frozenset(w) for n, w in why.items()}


def gated(look: Look) -> frozenset[str]:
    labelled = {n for n, label in look.labels.items() if label in GATING_LABELS}
    return frozenset(labelled | look.tainted)


def named(look: Look, expect: Expect) -> bool:
    if expect.kind == "silent":
        return look.labels.get(expect.subject) in FLAGGING_LABELS
    if expect.kind == "link":
        return any(n > 0 and a != b and expect.subject in (a, b) for a, b, n in look.cells)
    by_failure = any(
        node == expect.subject and check in expect.checks for node, check, _ in look.failures
    )
    by_suspect = any(
        node == expect.subject and expect.checks.intersection(checks)
        for node, checks in look.suspects
    )
    return by_failure or by_suspect


def link_named(look: Look, leaf: str) -> bool:
    """A suspect link of the product names the leaf: its uplink, or a domain pair with it."""
    return any(leaf in (a, b) for _, a, b in look.links)


def quiet(look: Look) -> bool:
    """Nothing flagged and no failure listed."""
    return not flagged(look) and not look.failures


@dataclass(frozen=True, slots=True)
class Injection:
    fault: str
    expect: Expect
    injected: float  # monotonic
    repaired: float
    ended: float  # end of the settle time
    interval: float
    detail: str = ""
    preflagged: frozenset[str] = frozenset()  # still flagged from before: not this fault's


@dataclass(frozen=True, slots=True)
class Scored:
    fault: str
    subject: str
    detected: bool
    ttd: float | None  # seconds, injection -> first look naming it
    wrong: dict[str, tuple[float, frozenset[str]]]  # node -> (seconds after injection, why)
    localized: bool | None  # link faults only
    clear_after: float | None  # seconds after the repair until nothing was flagged
    detail: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "fault": self.fault, "subject": self.subject, "detected": self.detected,
            "ttdSeconds": _round(self.ttd), "localized": self.localized,
            "clearAfterSeconds": _round(self.clear_after), "detail": self.detail,
            "wrong": {n: {"afterSeconds": round(t, 1), "why": sorted(w)}
                      for n, (t, w) in sorted(self.wrong.items())},
        }  # fmt: skip


def score(injection: Injection, looks: Sequence[Look]) -> Scored:
    expect = injection.expect
    during = [k for k in looks if injection.injected <= k.at <= injection.ended]
    faulty = [k for k in during if k.at <= injection.repaired]
    first = next((k for k in faulty if named(k, expect)), None)
    wrong: dict[str, tuple[float, frozenset[str]]] = {}
    for k in during:
        for node, why in flagged(k).items():
            if (expect.kind != "link" and node == expect.subject) or node in injection.preflagged:
                continue
            if node not in wrong:
                wrong[node] = (k.at - injection.injected, why)
    localized = None
    if expect.kind == "link":
        localized = any(link_named(k, expect.subject) for k in faulty) and not any(
            gated(k) for k in during
        )
    after = [k for k in during if k.at >= injection.repaired]
    clear = next((k for k in after if quiet(k)), None)
    return Scored(
        fault=injection.fault,
        subject=expect.subject,
        detected=first is not None,
        ttd=None if first is None else first.at - injection.injected,
        wrong=wrong,
        localized=localized,
        clear_after=None if clear is None else clear.at - injection.repaired,
        detail=injection.detail,
    )


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(p / 100 * len(ordered)))) - 1]


@dataclass
class ClassRow:
    fault: str
    injections: int = 0
    detected: int = 0
    wrong: int = 0
    ttds: list[float] = field(default_factory=list)
    localized: list[bool] = field(default_factory=list)
    clears: list[float | None] = field(default_factory=list)

    @property
    def precision(self) -> float | None:
        return self.detected / (self.detected + self.wrong) if self.detected + self.wrong else None

    @property
    def recall(self) -> float | None:
        return self.detected / self.injections if self.injections else None

    def as_json(self, interval: float) -> dict[str, Any]:
        p50, p99 = percentile(self.ttds, 50), percentile(self.ttds, 99)
        return {
            "fault": self.fault, "injections": self.injections, "detected": self.detected,
            "wrongNamings": self.wrong, "precision": _round(self.precision, 3),
            "recall": _round(self.recall, 3), "ttdP50Seconds": _round(p50),
            "ttdP99Seconds": _round(p99),
            "ttdP99Intervals": _round(None if p99 is None else p99 / interval, 2),
            "localized": _round(sum(self.localized) / len(self.localized), 3)
            if self.localized else None,
            "clearP50Seconds": _round(percentile([c for c in self.clears if c is not None], 50)),
            "neverClear": sum(1 for c in self.clears if c is None),
        }  # fmt: skip


def table(scored: Iterable[Scored]) -> list[ClassRow]:
    rows: dict[str, ClassRow] = {}
    for s in scored:
        row = rows.setdefault(s.fault, ClassRow(s.fault))
        row.injections += 1
        row.detected += s.detected
        row.wrong += len(s.wrong)
        if s.ttd is not None:
            row.ttds.append(s.ttd)
        if s.localized is not None:
            row.localized.append(s.localized)
        row.clears.append(s.clear_after)
    return list(rows.values())


def total(rows: Sequence[ClassRow]) -> ClassRow:
    out = ClassRow("all classes")
    for r in rows:
        out.injections += r.injections
        out.detected += r.detected
        out.wrong += r.wrong
        out.ttds += r.ttds
        out.localized += r.localized
        out.clears += r.clears
    return out


@dataclass(frozen=True, slots=True)
class Soak:
    seconds: float
    nodes: int
    flag_events: dict[str, int]  # node -> times it became flagged
    reasons: dict[str, list[str]]  # node -> why, at each time it became flagged
    path_mtu_failures: tuple[tuple[str, str, str], ...]  # (prober, peer, message)

    @property
    def fp_per_node_hour(self) -> float:
        hours = self.nodes * self.seconds / 3600
        return sum(self.flag_events.values()) / hours if hours else math.nan


def soak(looks: Sequence[Look], start: float, end: float, nodes: int,
         path_mtu_failures: Iterable[tuple[str, str, str]] = ()) -> Soak:  # fmt: skip
    """Flag events (a node going from not flagged to flagged) between `start` and `end`."""
    events: dict[str, int] = {}
    reasons: dict[str, list[str]] = {}
    before: frozenset[str] = frozenset()
    for k in looks:
        if not start <= k.at <= end:
            continue
        flags = flagged(k)
        for node in flags.keys() - before:
            events[node] = events.get(node, 0) + 1
            failures = sorted({f"{c} {sub}" for n, c, sub in k.failures if n == node})
            reasons.setdefault(node, []).append(" ".join([*sorted(flags[node]), *failures]))
        before = frozenset(flags)
    return Soak(end - start, nodes, events, reasons, tuple(path_mtu_failures))


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)
