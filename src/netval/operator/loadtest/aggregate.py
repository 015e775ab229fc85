"""Per-node load-test results -> the figures of `status.lastRun`. Pure.

Acceptance. A result counts only if it belongs to the plan (its window exists, its sender
was told to send to that peer or read that endpoint there) and happened when planned:
its measured interval (agent clock) must lie within the window's measured part widened by
`CLOCK_TOLERANCE_SECONDS` at each end and cover at least `MIN_COVERAGE` of it. Anything
else is a refused flow (counted in `refusedFlows`). A node whose clock is off by more than
the tolerance (estimated from its messages: the largest `sentAt - receivedAt`, the sample
least inflated by transit) ran its flows at the wrong time: all of its results are refused
and it is listed as skipped (ClockOffset). A participant with no result at all is NoResult.

Figures (rates: bytes x 8 / 10^6 / the flow's own measured seconds; storage in 10^6 B/s):

- East-west cells, one per unordered domain pair (a == b: intra). ``perNodeMbps`` is the
  median over the window's senders (both directions for a cross cell), ``aggregateMbps``
  their sum. ``oversubscription`` = median per-node intra rate of the two domains (their
  intra senders pooled) / the cell's ``perNodeMbps``: 3 nodes per leaf behind an uplink of
  one node's rate give 3.0; intra cells are the reference, 1.0. ``lossPercent`` is the share
  of echoes lost under load; ``idle/loadedLatencyP99Ms`` the nearest-rank p99 of the echo
  samples of the cell's pairs, idle (before the load) and under load.
- Storage, per endpoint: ``aggregateMBps`` = the sum of the nodes' rates in the all-at-once
  window (they share it), ``perNodeMBpsMin/Median`` over those nodes, ``singleNodeMBps`` =
  the median of the single-node reads, ``fairness`` = Jain's index (sum x)^2 / (n sum x^2)
  of the all-at-once rates (1.0: an even share; 1/n: one node takes everything).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from netval.model.loadplan import CLOCK_TOLERANCE_SECONDS, LoadResult
from netval.model.loadtest import (
    MAX_BREACHES,
    MAX_LOAD_CELLS,
    MAX_SKIPPED,
    Breach,
    Expectations,
    LoadCell,
    LoadEastWest,
    LoadRun,
    LoadStorage,
    SkippedNode,
    SkipReason,
)
from netval.operator.loadtest.plan import RunPlan, Window, WindowKind

MIN_COVERAGE: Final = 0.8  # of the measured part a counted flow must cover

_Pair = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Received:
    """One result message and when the operator received it (its clock)."""

    result: LoadResult
    received_at: datetime


@dataclass(slots=True)
class _Cell:
    rates: list[float] = field(default_factory=list)
    idle: list[float] = field(default_factory=list)
    loaded: list[float] = field(default_factory=list)
    sent: int = 0
    received: int = 0


def clock_offsets(received: Iterable[Received]) -> dict[str, float]:
    """node -> estimated clock offset in seconds (positive: the agent is ahead)."""
    out: dict[str, float] = {}
    for r in received:
        offset = (r.result.sent_at - r.received_at).total_seconds()
        node = r.result.node
        out[node] = max(out.get(node, -math.inf), offset)
    return out


def _within(window: Window, start: datetime, end: datetime) -> bool:
    """Did [start, end] (agent clock, offset within tolerance) happen in the window?"""
    tol = CLOCK_TOLERANCE_SECONDS
    lo = (start - window.measure_start).total_seconds()
    hi = (end - window.end).total_seconds()
    if lo < -tol or hi > tol:
        return False
    covered = min(end, window.end) - max(start, window.measure_start)
    return covered.total_seconds() >= MIN_COVERAGE * window.measured_seconds


def _mid(values: list[float]) -> float:
    ordered = sorted(values)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else ordered[half - 1] / 2 + ordered[half] / 2


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def jain(values: list[float]) -> float | None:
    squares = sum(v * v for v in values)
    if not values or squares <= 0 or not math.isfinite(squares):
        return None
    return sum(values) ** 2 / (len(values) * squares)


def _r(value: float | None, digits: int) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


@dataclass(slots=True)
class _Tally:
    plan: RunPlan
    windows: dict[str, Window]
    expected: dict[str, dict[str, set[str]]]  # window -> sender -> peers / endpoints
    cells: dict[_Pair, _Cell] = field(default_factory=dict)
    intra: dict[str, list[float]] = field(default_factory=dict)  # domain -> per-node rates
    storage_all: dict[str, list[float]] = field(default_factory=dict)
    storage_single: dict[str, list[float]] = field(default_factory=dict)
    refused: int = 0

    def cell(self, a: str, b: str) -> _Cell:
        da, db = self.plan.domain_of[a], self.plan.domain_of[b]
        key = (da, db) if da <= db else (db, da)
        found = self.cells.get(key)
        if found is None:
            found = self.cells[key] = _Cell()
        return found

    def planned(self, window: str, node: str, peer: str) -> Window | None:
        w = self.windows.get(window)
        if w is None or peer not in self.expected[window].get(node, ()):
            return None
        return w

    def add(self, r: LoadResult) -> None:
        node = r.node
        for f in r.flows:
            w = self.planned(f.window, node, f.peer)
            if w is None or w.kind is WindowKind.IDLE or f.error or not _within(w, f.start, f.end):
                self.refused += 1
                continue
            rate = f.bytes * 8 / 1e6 / (f.end - f.start).total_seconds()
            self.cell(node, f.peer).rates.append(rate)
            if w.kind is WindowKind.INTRA:
                self.intra.setdefault(self.plan.domain_of[node], []).append(rate)
        for lat in r.latency:
            w = self.planned(lat.window, node, lat.peer)
            if w is None or lat.loaded is (w.kind is WindowKind.IDLE):
                self.refused += 1
                continue
            c = self.cell(node, lat.peer)
            if lat.loaded:
                c.loaded += lat.samples_ms
                c.sent += lat.sent
                c.received += lat.received
            else:
                c.idle += lat.samples_ms
        for s in r.storage:
            w = self.planned(s.window, node, s.endpoint)
            if w is None or s.error or not _within(w, s.start, s.end):
                self.refused += 1
                continue
            rate = s.bytes / 1e6 / (s.end - s.start).total_seconds()
            into = self.storage_all if w.kind is WindowKind.STORAGE else self.storage_single
            into.setdefault(s.endpoint, []).append(rate)


def aggregate(
    plan: RunPlan,
    received: Iterable[Received],
    *,
    expect: Expectations,
    finished_at: datetime,
) -> LoadRun:
    """The run's figures and breaches (see the module docstring)."""
    # one message per (node, stage): a QoS 1 redelivery must not count twice
    firsts: dict[tuple[str, int], Received] = {}
    for r in received:
        res = r.result
        if (
            res.run == plan.run_id
            and res.node in plan.domain_of
            and res.validation == plan.settings.validation
        ):
            firsts.setdefault((res.node, res.stage), r)
    messages = list(firsts.values())
    offsets = clock_offsets(messages)
    off_clock = {n for n, o in offsets.items() if abs(o) > CLOCK_TOLERANCE_SECONDS}
    windows = {w.id: w for w in plan.windows}
    expected: dict[str, dict[str, set[str]]] = {}
    for w in windows.values():
        by_sender = expected[w.id] = {}
        for a, b in w.flows:
            by_sender.setdefault(a, set()).add(b)
    tally = _Tally(plan=plan, windows=windows, expected=expected)
    for r in messages:
        if r.result.node in off_clock:
            tally.refused += len(r.result.flows) + len(r.result.storage)
        else:
            tally.add(r.result)
    heard = {r.result.node for r in messages}
    skipped = [
        *plan.skipped,
        *((n, SkipReason.CLOCK_OFFSET) for n in sorted(off_clock)),
        *((n, SkipReason.NO_RESULT) for n in sorted(plan.domain_of.keys() - heard)),
    ]
    cells = _cells(tally)
    storage = _storage(tally, plan.settings.endpoints)
    breaches = _breaches(cells, storage, expect)
    over = [c.oversubscription for c in cells if c.a != c.b and c.oversubscription is not None]
    shown = _bounded(cells, breaches)
    ran = plan.stages[0].start
    return LoadRun(
        id=plan.run_id,
        started_at=ran,
        finished_at=finished_at,
        nodes=len(heard - off_clock),
        skipped_nodes=[SkippedNode(node=n, reason=why) for n, why in skipped[:MAX_SKIPPED]],
        skipped_count=len(skipped),
        refused_flows=tally.refused,
        max_oversubscription=max(over) if over else None,
        east_west=LoadEastWest(cells=shown, omitted_cells=len(cells) - len(shown))
        if cells
        else None,
        storage=storage,
        breaches=breaches[:MAX_BREACHES],
    )


def _cells(t: _Tally) -> list[LoadCell]:
    out: list[LoadCell] = []
    for (a, b), c in sorted(t.cells.items()):
        per_node = _mid(c.rates) if c.rates else None
        if a == b:
            over = 1.0 if per_node else None
        else:
            pool = t.intra.get(a, []) + t.intra.get(b, [])
            over = _mid(pool) / per_node if pool and per_node else None
        out.append(
            LoadCell(
                a=a,
                b=b,
                flows=len(c.rates),
                per_node_mbps=_r(per_node, 3),
                aggregate_mbps=_r(sum(c.rates), 3) if c.rates else None,
                oversubscription=_r(over, 3),
                loss_percent=_r(100 * (c.sent - c.received) / c.sent, 3) if c.sent else None,
                idle_latency_p99_ms=_r(_p99(c.idle), 4),
                loaded_latency_p99_ms=_r(_p99(c.loaded), 4),
            )
        )
    return out


def _storage(t: _Tally, endpoints: Iterable[str]) -> list[LoadStorage]:
    out: list[LoadStorage] = []
    for e in endpoints:
        rates = t.storage_all.get(e, [])
        single = t.storage_single.get(e, [])
        out.append(
            LoadStorage(
                endpoint=e,
                nodes=len(rates),
                aggregate_m_bps=_r(sum(rates), 3) if rates else None,
                per_node_m_bps_min=_r(min(rates), 3) if rates else None,
                per_node_m_bps_median=_r(_mid(rates), 3) if rates else None,
                single_node_m_bps=_r(_mid(single), 3) if single else None,
                fairness=_r(jain(rates), 4),
            )
        )
    return out


def _breaches(
    cells: list[LoadCell], storage: list[LoadStorage], expect: Expectations
) -> list[Breach]:
    out: list[Breach] = []
    if expect.max_oversubscription is not None:
        limit = expect.max_oversubscription
        out += [
            Breach(
                expectation="maxOversubscription",
                subject=f"{c.a}/{c.b}",
                observed=c.oversubscription,
                expected=limit,
            )
            for c in cells
            if c.oversubscription is not None and c.oversubscription > limit
        ]
    if expect.max_latency_inflation is not None:
        limit = expect.max_latency_inflation
        for c in cells:
            idle, loaded = c.idle_latency_p99_ms, c.loaded_latency_p99_ms
            if not idle or loaded is None:
                continue
            inflation = loaded / idle
            if math.isfinite(inflation) and inflation > limit:
                out.append(
                    Breach(
                        expectation="maxLatencyInflation",
                        subject=f"{c.a}/{c.b}",
                        observed=round(inflation, 3),
                        expected=limit,
                    )
                )
    if expect.min_storage_m_bps_per_node is not None:
        floor = expect.min_storage_m_bps_per_node
        out += [
            Breach(
                expectation="minStorageMBpsPerNode",
                subject=s.endpoint,
                observed=s.per_node_m_bps_min,
                expected=floor,
            )
            for s in storage
            if s.per_node_m_bps_min is not None and s.per_node_m_bps_min < floor
        ]
    # the worst first: the furthest from its limit, relatively
    return sorted(out, key=lambda b: -abs(math.log(max(b.observed, 1e-9) / b.expected)))


def _bounded(cells: list[LoadCell], breaches: list[Breach]) -> list[LoadCell]:
    """All cells if they fit; else breached cells, then the most oversubscribed."""
    if len(cells) <= MAX_LOAD_CELLS:
        return cells
    hit = {b.subject for b in breaches}
    ranked = sorted(
        cells, key=lambda c: (f"{c.a}/{c.b}" not in hit, -(c.oversubscription or 0.0), c.a, c.b)
    )
    return sorted(ranked[:MAX_LOAD_CELLS], key=lambda c: (c.a, c.b))
