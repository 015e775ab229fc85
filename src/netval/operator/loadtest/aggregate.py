"""Per-node load-test results -> the figures of `status.lastRun`. Pure.

Incremental: `Aggregator.add` folds each result message as it arrives (stage by stage) into
per-cell rate arrays and latency histograms; when a fourth stage's results arrive the
oldest stage is sealed (its cells keep their figures only, and a message for it is refused
as late), so a run of 10,000 nodes never holds its messages nor its flows.
`Aggregator.finish` derives the figures. `aggregate` does both for a list.

Acceptance. A result counts only if it belongs to the plan (its window exists, its sender
was told to send to that peer or read that endpoint there) and happened when planned:
its measured interval (agent clock) must lie within the window's measured part widened by
`CLOCK_TOLERANCE_SECONDS` at each end and cover at least `MIN_COVERAGE` of it. Anything
else is a refused flow (counted in `refusedFlows`). Each message also estimates its
node's clock offset, `sentAt - receivedAt` (agent clock minus operator clock, less the
transit time); beyond the tolerance either way the node ran its flows at the wrong time (or
its result took over a second to arrive, which is as doubtful): the message's flows are
refused and the node is listed in skippedNodes (ClockOffset). A participant with no result
at all is NoResult. A repeated message (QoS 1 redelivery) counts once.

Figures (rates: bytes x 8 / 10^6 / the flow's own measured seconds; storage in 10^6 B/s):

- East-west cells, one per unordered domain pair (a == b: intra). ``perNodeMbps`` is the
  median over the window's senders (both directions for a cross cell), ``aggregateMbps``
  their sum. ``oversubscription`` = median per-node intra rate of the two domains (their
  intra senders pooled) / the cell's ``perNodeMbps``: 3 nodes per leaf behind an uplink of
  one node's rate give 3.0; intra cells are the reference, 1.0. ``lossPercent`` is the share
  of echoes lost under load; ``idle/loadedLatencyP99Ms`` the p99 of the echo samples of the
  cell's pairs, idle (before the load) and under load, from a log histogram (buckets 1%
  wide: the figure is within 0.5% of the exact nearest-rank p99).
- Storage, per endpoint: ``aggregateMBps`` = the sum of the nodes' rates in the all-at-once
  window (they share it), ``perNodeMBpsMin/Median`` over those nodes, ``singleNodeMBps`` =
  the median of the single-node reads, ``fairness`` = Jain's index (sum x)^2 / (n sum x^2)
  of the all-at-once rates (1.0: an even share; 1/n: one node takes everything).
"""

from __future__ import annotations

import math
from array import array
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
_BUCKET: Final = math.log(1.01)  # latency histogram buckets: 1% wide
# Stages open at once: a stage's results arrive just after its deadline, while the next one
# runs. When a fourth stage's results come, the oldest is sealed: its cells keep only their
# figures and a message for it is refused as late.
_STAGES_KEPT: Final = 3

_Pair = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Received:
    """One result message and when the operator received it (its clock)."""

    result: LoadResult
    received_at: datetime


class _Hist:
    """Counts of samples per 1%-wide bucket: fixed memory for any number of samples."""

    __slots__ = ("buckets", "n")

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.n = 0

    def add(self, values: Iterable[float]) -> None:
        b = self.buckets
        for v in values:
            k = math.floor(math.log(v) / _BUCKET) if v > 0 else -(10**6)
            b[k] = b.get(k, 0) + 1
            self.n += 1

    def p99(self) -> float | None:
        if not self.n:
            return None
        rank = max(1, math.ceil(0.99 * self.n))
        seen = 0
        for k in sorted(self.buckets):
            seen += self.buckets[k]
            if seen >= rank:
                return 0.0 if k == -(10**6) else math.exp((k + 0.5) * _BUCKET)
        return None  # unreachable: the counts add up to n


@dataclass(slots=True)
class _Cell:
    rates: array[float] = field(default_factory=lambda: array("d"))
    idle: _Hist = field(default_factory=_Hist)
    loaded: _Hist = field(default_factory=_Hist)
    sent: int = 0
    received: int = 0


@dataclass(frozen=True, slots=True)
class _Sealed:
    """A cell's figures once its stage is over (each cell is measured in one stage)."""

    flows: int
    per_node: float | None
    aggregate: float | None
    loss: float | None
    idle_p99: float | None
    loaded_p99: float | None


def _seal(c: _Cell) -> _Sealed:
    return _Sealed(
        flows=len(c.rates),
        per_node=_mid(c.rates) if c.rates else None,
        aggregate=sum(c.rates) if c.rates else None,
        loss=100 * (c.sent - c.received) / c.sent if c.sent else None,
        idle_p99=c.idle.p99(),
        loaded_p99=c.loaded.p99(),
    )


@dataclass(frozen=True, slots=True)
class _StageIndex:
    windows: dict[str, Window]
    # window -> sender -> its peer (east-west: one flow out per node and window) or endpoint
    planned: dict[str, dict[str, str]]


def _within(window: Window, start: datetime, end: datetime) -> bool:
    """Did [start, end] (agent clock, offset within tolerance) happen in the window?"""
    tol = CLOCK_TOLERANCE_SECONDS
    lo = (start - window.measure_start).total_seconds()
    hi = (end - window.end).total_seconds()
    if lo < -tol or hi > tol:
        return False
    covered = min(end, window.end) - max(start, window.measure_start)
    return covered.total_seconds() >= MIN_COVERAGE * window.measured_seconds


def _mid(values: Iterable[float]) -> float:
    ordered = sorted(values)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else ordered[half - 1] / 2 + ordered[half] / 2


def jain(values: Iterable[float]) -> float | None:
    xs = list(values)
    squares = sum(v * v for v in xs)
    if not xs or squares <= 0 or not math.isfinite(squares):
        return None
    return sum(xs) ** 2 / (len(xs) * squares)


def _r(value: float | None, digits: int) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


class Aggregator:
    """The figures of one run, folded message by message."""

    def __init__(self, plan: RunPlan) -> None:
        self.plan = plan
        self._by_index = {s.index: s for s in plan.stages}
        self._indexes: dict[int, _StageIndex] = {}
        self._seen: dict[str, int] = {}  # node -> a bit per stage folded: ~N x stages bits
        self.cells: dict[_Pair, _Cell] = {}  # of the open stages
        self._open: dict[int, set[_Pair]] = {}  # stage -> the cells it touched
        self.sealed: dict[_Pair, _Sealed] = {}
        self._sealed_stages: set[int] = set()
        self.intra: dict[str, array[float]] = {}  # domain -> per-node intra rates
        self.storage_all: dict[str, array[float]] = {}
        self.storage_single: dict[str, array[float]] = {}
        self.refused = 0
        self.folded: set[str] = set()  # nodes with a counted message
        self.off_clock: set[str] = set()

    def _index(self, stage: int) -> _StageIndex | None:
        found = self._indexes.get(stage)
        if found is None:
            spec = self._by_index.get(stage)
            if spec is None:
                return None
            windows = {w.id: w for w in self.plan.windows_of(spec)}
            planned = {wid: dict(w.flows) for wid, w in windows.items()}
            if len(self._indexes) >= _STAGES_KEPT:
                self._seal_stage(next(iter(self._indexes)))
            found = self._indexes[stage] = _StageIndex(windows, planned)
        return found

    def _seal_stage(self, stage: int) -> None:
        self._indexes.pop(stage, None)
        self._sealed_stages.add(stage)
        for key in self._open.pop(stage, ()):
            cell = self.cells.pop(key, None)
            if cell is not None:
                self.sealed[key] = _seal(cell)

    def _cell(self, a: str, b: str, stage: int) -> _Cell:
        domain_of = self.plan.domain_of
        da, db = domain_of[a], domain_of[b]
        key = (da, db) if da <= db else (db, da)
        found = self.cells.get(key)
        if found is None:
            found = self.cells[key] = _Cell()
            self._open.setdefault(stage, set()).add(key)
        return found

    def add(self, received: Received) -> bool:
        """Fold one message; False when it is not for this run or already folded."""
        r = received.result
        plan = self.plan
        if r.run != plan.run_id or r.validation != plan.settings.validation:
            return False
        seen = self._seen.get(r.node, 0)
        if r.node not in plan.domain_of or r.stage not in self._by_index or seen >> r.stage & 1:
            return False
        self._seen[r.node] = seen | 1 << r.stage
        offset = (r.sent_at - received.received_at).total_seconds()
        if abs(offset) > CLOCK_TOLERANCE_SECONDS or r.stage in self._sealed_stages:
            if r.stage not in self._sealed_stages:
                self.off_clock.add(r.node)
            self.refused += len(r.flows) + len(r.storage)
            return True
        index = self._index(r.stage)
        assert index is not None  # the stage is the plan's
        self.folded.add(r.node)
        self._fold(r, index)
        return True

    def _fold(self, r: LoadResult, index: _StageIndex) -> None:
        node, windows, planned = r.node, index.windows, index.planned
        for f in r.flows:
            w = windows.get(f.window)
            if (
                w is None
                or planned[w.id].get(node) != f.peer
                or w.kind is WindowKind.IDLE
                or f.error
                or not _within(w, f.start, f.end)
            ):
                self.refused += 1
                continue
            rate = f.bytes * 8 / 1e6 / (f.end - f.start).total_seconds()
            self._cell(node, f.peer, r.stage).rates.append(rate)
            if w.kind is WindowKind.INTRA:
                domain = self.plan.domain_of[node]
                self.intra.setdefault(domain, array("d")).append(rate)
        for lat in r.latency:
            w = windows.get(lat.window)
            if w is None or planned[w.id].get(node) != lat.peer:
                continue
            if lat.loaded is (w.kind is WindowKind.IDLE):
                continue
            c = self._cell(node, lat.peer, r.stage)
            if lat.loaded:
                c.loaded.add(lat.samples_ms)
                c.sent += lat.sent
                c.received += lat.received
            else:
                c.idle.add(lat.samples_ms)
        for s in r.storage:
            w = windows.get(s.window)
            if (
                w is None
                or planned[w.id].get(node) != s.endpoint
                or s.error
                or not _within(w, s.start, s.end)
            ):
                self.refused += 1
                continue
            rate = s.bytes / 1e6 / (s.end - s.start).total_seconds()
            into = self.storage_all if w.kind is WindowKind.STORAGE else self.storage_single
            into.setdefault(s.endpoint, array("d")).append(rate)

    def finish(self, *, expect: Expectations, finished_at: datetime) -> LoadRun:
        plan = self.plan
        for stage in list(self._indexes):
            self._seal_stage(stage)
        skipped = [
            *plan.skipped,
            *((n, SkipReason.CLOCK_OFFSET) for n in sorted(self.off_clock)),
            *(
                (n, SkipReason.NO_RESULT)
                for n in sorted(plan.domain_of.keys() - self.folded - self.off_clock)
            ),
        ]
        cells = self._cells()
        storage = self._storage()
        breaches = _breaches(cells, storage, expect)
        over = [c.oversubscription for c in cells if c.a != c.b and c.oversubscription is not None]
        shown = _bounded(cells, breaches)
        return LoadRun(
            id=plan.run_id,
            started_at=plan.stages[0].start,
            finished_at=finished_at,
            nodes=len(self.folded),
            skipped_nodes=[SkippedNode(node=n, reason=why) for n, why in skipped[:MAX_SKIPPED]],
            skipped_count=len(skipped),
            refused_flows=self.refused,
            max_oversubscription=max(over) if over else None,
            east_west=(
                LoadEastWest(
                    cells=[c.model() for c in shown], omitted_cells=len(cells) - len(shown)
                )
                if cells
                else None
            ),
            storage=storage,
            breaches=[b.model() for b in breaches[:MAX_BREACHES]],
        )

    def _cells(self) -> list[_CellFigures]:
        out: list[_CellFigures] = []
        for (a, b), c in sorted(self.sealed.items()):
            per_node = c.per_node
            if a == b:
                over = 1.0 if per_node else None
            else:
                pool = [*self.intra.get(a, ()), *self.intra.get(b, ())]
                over = _mid(pool) / per_node if pool and per_node else None
            out.append(
                _CellFigures(
                    a=a,
                    b=b,
                    flows=c.flows,
                    per_node_mbps=_r(per_node, 3),
                    aggregate_mbps=_r(c.aggregate, 3),
                    oversubscription=_r(over, 3),
                    loss_percent=_r(c.loss, 3),
                    idle_latency_p99_ms=_r(c.idle_p99, 4),
                    loaded_latency_p99_ms=_r(c.loaded_p99, 4),
                )
            )
        return out

    def _storage(self) -> list[LoadStorage]:
        out: list[LoadStorage] = []
        for e in self.plan.settings.endpoints:
            rates = self.storage_all.get(e, array("d"))
            single = self.storage_single.get(e, array("d"))
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


@dataclass(frozen=True, slots=True)
class _CellFigures:
    """A cell before it becomes status: the model is built for the cells shown only."""

    a: str
    b: str
    flows: int
    per_node_mbps: float | None
    aggregate_mbps: float | None
    oversubscription: float | None
    loss_percent: float | None
    idle_latency_p99_ms: float | None
    loaded_latency_p99_ms: float | None

    def model(self) -> LoadCell:
        return LoadCell(
            a=self.a,
            b=self.b,
            flows=self.flows,
            per_node_mbps=self.per_node_mbps,
            aggregate_mbps=self.aggregate_mbps,
            oversubscription=self.oversubscription,
            loss_percent=self.loss_percent,
            idle_latency_p99_ms=self.idle_latency_p99_ms,
            loaded_latency_p99_ms=self.loaded_latency_p99_ms,
        )


@dataclass(frozen=True, slots=True)
class _Breach:
    expectation: str
    subject: str
    observed: float
    expected: float

    def model(self) -> Breach:
        return Breach(
            expectation=self.expectation,
            subject=self.subject,
            observed=self.observed,
            expected=self.expected,
        )


def aggregate(
    plan: RunPlan,
    received: Iterable[Received],
    *,
    expect: Expectations,
    finished_at: datetime,
) -> LoadRun:
    """The run's figures and breaches from all its messages at once."""
    agg = Aggregator(plan)
    for r in received:
        agg.add(r)
    return agg.finish(expect=expect, finished_at=finished_at)


def _breaches(
    cells: list[_CellFigures], storage: list[LoadStorage], expect: Expectations
) -> list[_Breach]:
    out: list[_Breach] = []
    if expect.max_oversubscription is not None:
        limit = expect.max_oversubscription
        out += [
            _Breach("maxOversubscription", f"{c.a}/{c.b}", c.oversubscription, limit)
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
                    _Breach("maxLatencyInflation", f"{c.a}/{c.b}", round(inflation, 3), limit)
                )
    if expect.min_storage_m_bps_per_node is not None:
        floor = expect.min_storage_m_bps_per_node
        out += [
            _Breach("minStorageMBpsPerNode", s.endpoint, s.per_node_m_bps_min, floor)
            for s in storage
            if s.per_node_m_bps_min is not None and s.per_node_m_bps_min < floor
        ]
    # the worst first: the furthest from its limit, relatively
    return sorted(out, key=lambda b: -abs(math.log(max(b.observed, 1e-9) / b.expected)))


def _bounded(cells: list[_CellFigures], breaches: list[_Breach]) -> list[_CellFigures]:
    """All cells if they fit; else breached cells, then the most oversubscribed."""
    if len(cells) <= MAX_LOAD_CELLS:
        return cells
    hit = {b.subject for b in breaches}
    ranked = sorted(
        cells, key=lambda c: (f"{c.a}/{c.b}" not in hit, -(c.oversubscription or 0.0), c.a, c.b)
    )
    return sorted(ranked[:MAX_LOAD_CELLS], key=lambda c: (c.a, c.b))
