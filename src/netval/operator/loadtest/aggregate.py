"""Per-node load-test results -> the figures of `status.lastRun`. Pure.

Incremental: `Aggregator.add` folds each result message as it arrives (stage by stage) into
per-cell rate arrays, evidence counts and latency histograms; when a fourth stage's results
arrive the oldest stage is sealed (its cells keep their figures only, and a message for it
is refused as late), so a run of 10,000 nodes never holds its messages nor its flows.
`Aggregator.finish` derives the figures (`figures`). `aggregate` does both for a list.

Acceptance. A result counts only if it belongs to the plan (its window exists, its sender
was told to send to that peer on that rail, or to read that endpoint there) and happened
when planned: its measured interval (agent clock) must lie within the window's measured
part widened by `CLOCK_TOLERANCE_SECONDS` at each end and cover at least `MIN_COVERAGE` of
it. Anything else is a refused flow (counted in `refusedFlows`); a flow or read repeated in
one message counts once. Each message also estimates its node's clock offset,
`sentAt - receivedAt` (agent clock minus operator clock, less the transit time); beyond the
tolerance either way the node ran its flows at the wrong time (or its result took over a
second to arrive, which is as doubtful): the message's flows are refused and the node is
listed in skippedNodes (ClockOffset). A participant with no result at all is NoResult; one
whose engine could not run says EngineUnavailable. A repeated message (QoS 1 redelivery)
counts once.

Evidence. Every planned flow and read is counted in `plannedFlows`; the counted ones in
`countedFlows`. A planned cell or endpoint with nothing counted is NotMeasured, and a run
that counted under `minCoveragePercent` is InsufficientData (`status`). A node left out
mid-stage (busy, gated, stale: `withdraw`) takes its flows of that stage out of the planned
count.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from netval.model.loadplan import CLOCK_TOLERANCE_SECONDS, Engine, LoadResult
from netval.model.loadtest import (
    MAX_BREACHES,
    MAX_ENGINES,
    MAX_SKIPPED,
    Expectations,
    LoadEastWest,
    LoadRun,
    SkippedNode,
    SkipReason,
)
from netval.operator.loadtest.figures import (
    CellKey,
    Hist,
    Sealed,
    bounded_cells,
    breaches_of,
    cell_figures,
    jain,
    storage_figures,
)
from netval.operator.loadtest.plan import RunPlan, Stage, Window, WindowKind
from netval.operator.loadtest.rails import common_rails, rail_engine

MIN_COVERAGE: Final = 0.8  # of the measured part a counted flow must cover
CPU_BOUND_PERCENT: Final = 90.0  # an engine's CPU demand from which the host set the pace
# Stages open at once: a stage's results arrive just after its deadline, while the next one
# runs. When a fourth stage's results come, the oldest is sealed: its cells keep only their
# figures and a message for it is refused as late.
_STAGES_KEPT: Final = 3


@dataclass(frozen=True, slots=True)
class Received:
    """One result message and when the operator received it (its clock)."""

    result: LoadResult
    received_at: datetime


@dataclass(slots=True)
class _Cell:
    rates: array[float] = field(default_factory=lambda: array("d"))
    idle: Hist = field(default_factory=Hist)
    loaded: Hist = field(default_factory=Hist)
    sent: int = 0
    received: int = 0
    planned: int = 0
    port: float | None = None  # the slowest port rate reported
    evidenced: int = 0  # flows whose sender engine's CPU demand is evidence
    bound_senders: int = 0
    serves: int = 0  # servers whose CPU demand is evidence
    bound_receivers: int = 0
    retransmits: int | None = None
    fanout: tuple[int, int, int] | None = None  # cross: (fan, loaded, size) of its big side

    def port_seen(self, mbps: float | None) -> None:
        if mbps is not None and mbps > 0:
            self.port = mbps if self.port is None else min(self.port, mbps)


def _seal(c: _Cell) -> Sealed:
    return Sealed(
        flows=len(c.rates),
        planned=c.planned,
        per_node=_mid(c.rates) if c.rates else None,
        aggregate=sum(c.rates) if c.rates else None,
        loss=100 * (c.sent - c.received) / c.sent if c.sent else None,
        idle_p99=c.idle.p99(),
        loaded_p99=c.loaded.p99(),
        port=c.port,
        evidenced=c.evidenced,
        bound_senders=c.bound_senders,
        serves=c.serves,
        bound_receivers=c.bound_receivers,
        retransmits=c.retransmits,
        fanout=c.fanout,
    )


@dataclass(slots=True)
class _StageIndex:
    windows: dict[str, Window]
    # window -> sender -> its receivers (east-west; several with unequal domains) or the
    # endpoint it reads (storage)
    planned: dict[str, dict[str, tuple[str, ...]]]
    cells: Counter[CellKey] = field(default_factory=Counter)  # planned flows per cell
    readers: Counter[str] = field(default_factory=Counter)  # endpoint -> planned (all at once)
    total: int = 0  # flows and reads planned


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


class Aggregator:
    """The figures of one run, folded message by message."""

    def __init__(self, plan: RunPlan) -> None:
        self.plan = plan
        self._by_index = {s.index: s for s in plan.stages}
        self._indexes: dict[int, _StageIndex] = {}
        self._seen: dict[str, int] = {}  # node -> a bit per stage folded: ~N x stages bits
        self.cells: dict[CellKey, _Cell] = {}  # of the open stages
        self._open: dict[int, set[CellKey]] = {}  # stage -> the cells it touched
        self.sealed: dict[CellKey, Sealed] = {}
        self._sealed_stages: set[int] = set()
        self.intra: dict[tuple[str, int], array[float]] = {}  # (domain, rail) -> intra rates
        self.storage_all: dict[str, array[float]] = {}
        self.storage_single: dict[str, array[float]] = {}
        self.storage_readers: Counter[str] = Counter()  # endpoint -> readers planned
        self.refused = 0
        self.planned = 0  # flows and reads planned (stages indexed)
        self.counted = 0
        self.folded: set[str] = set()  # nodes with a counted message
        self.off_clock: set[str] = set()
        self.unavailable: dict[str, str] = {}  # node -> what its engine lacked
        self.engines: set[str] = set()  # "iperf3 3.12"
        self._withdrawn: dict[int, set[str]] = {}  # stage -> nodes left out during it

    # -- the plan's side --------------------------------------------------------------

    def _index(self, stage: int) -> _StageIndex | None:
        found = self._indexes.get(stage)
        if found is None:
            spec = self._by_index.get(stage)
            if spec is None:
                return None
            if len(self._indexes) >= _STAGES_KEPT:
                self._seal_stage(next(iter(self._indexes)))
            found = self._indexes[stage] = self._build(spec)
            self.planned += found.total
        return found

    def _build(self, stage: Stage) -> _StageIndex:
        windows = {w.id: w for w in self.plan.windows_of(stage)}
        planned: dict[str, dict[str, tuple[str, ...]]] = {}
        for wid, w in windows.items():
            to: dict[str, list[str]] = {}
            for a, b in w.flows:
                to.setdefault(a, []).append(b)
            planned[wid] = {a: tuple(bs) for a, bs in to.items()}
        index = _StageIndex(windows, planned)
        self._count(index, stage.index)
        return index

    def _count(self, index: _StageIndex, stage: int) -> None:
        """What the stage plans to count (its withdrawn nodes' flows left out)."""
        gone = self._withdrawn.get(stage, set())
        index.cells.clear()
        index.readers.clear()
        index.total = 0
        plan = self.plan
        for w in index.windows.values():
            if w.kind is WindowKind.IDLE:
                continue
            for a, b in w.flows:
                if a in gone or b in gone:
                    continue
                if w.kind is WindowKind.STORAGE_SINGLE:
                    index.total += 1
                elif w.kind is WindowKind.STORAGE:
                    index.total += 1
                    index.readers[b] += 1
                else:
                    for rail in common_rails(plan.rails_of(a), plan.rails_of(b)):
                        index.cells[self._key(a, b, rail)] += 1
                        index.total += 1
        for key, n in index.cells.items():
            cell = self._open_cell(key, stage)
            cell.planned = n

    def withdraw(self, node: str, stage: int) -> None:
        """`node` was left out during `stage` (busy, gated, stale): its flows of the stage
        are not expected any more."""
        self._withdrawn.setdefault(stage, set()).add(node)
        index = self._indexes.get(stage)
        if index is not None:
            before = index.total
            self._count(index, stage)
            self.planned += index.total - before

    def _seal_stage(self, stage: int) -> None:
        index = self._indexes.pop(stage, None)
        self._sealed_stages.add(stage)
        if index is not None:
            for endpoint, n in index.readers.items():
                self.storage_readers[endpoint] += n
        for key in self._open.pop(stage, ()):
            cell = self.cells.pop(key, None)
            if cell is not None:
                self.sealed[key] = _seal(cell)

    def _key(self, a: str, b: str, rail: int) -> CellKey:
        domain_of = self.plan.domain_of
        da, db = domain_of[a], domain_of[b]
        return (da, db, rail) if da <= db else (db, da, rail)

    def _open_cell(self, key: CellKey, stage: int) -> _Cell:
        found = self.cells.get(key)
        if found is None:
            found = self.cells[key] = _Cell()
            self._open.setdefault(stage, set()).add(key)
            a, b, _rail = key
            if a != b:
                fan = self.plan.fanout(a, b, stage)
                if fan is not None:
                    found.fanout = (fan.fan, fan.loaded, fan.size)
        return found

    # -- results ----------------------------------------------------------------------

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
        if r.unavailable and r.node not in self.unavailable:
            self.unavailable[r.node] = r.unavailable
        for name, version in r.engines.items():
            if len(self.engines) < MAX_ENGINES:
                self.engines.add(f"{name} {version}"[:64])
        self._fold(r, r.stage, index)
        return True

    def _rail_ok(self, a: str, b: str, rail: int) -> bool:
        return bool(self.plan.rails_of(a).mask & self.plan.rails_of(b).mask & (1 << rail))

    def _iperf3(self, a: str, b: str, rail: int) -> bool:
        setting = self.plan.settings.engine
        ra, rb = self.plan.rails_of(a), self.plan.rails_of(b)
        return rail_engine(setting, ra, rb, rail) is Engine.IPERF3

    def _fold(self, r: LoadResult, stage: int, index: _StageIndex) -> None:
        node, windows, planned = r.node, index.windows, index.planned
        gone = self._withdrawn.get(stage, set())
        taken: set[tuple[str, str, int]] = set()
        for f in r.flows:
            w = windows.get(f.window)
            key = (f.window, f.peer, f.rail)
            if (
                w is None
                or w.kind not in (WindowKind.INTRA, WindowKind.CROSS)
                or f.peer not in planned[w.id].get(node, ())
                or not self._rail_ok(node, f.peer, f.rail)
                or key in taken
                or node in gone
                or f.peer in gone
                or f.error
                or not _within(w, f.start, f.end)
            ):
                self.refused += 1
                continue
            taken.add(key)
            rate = f.bytes * 8 / 1e6 / (f.end - f.start).total_seconds()
            c = self._open_cell(self._key(node, f.peer, f.rail), stage)
            c.rates.append(rate)
            self.counted += 1
            c.port_seen(f.port_mbps)
            if f.retransmits is not None:
                c.retransmits = (c.retransmits or 0) + f.retransmits
            # a busy-polling engine (perftest) is always near 100 %: no evidence either way
            if f.cpu_demand_percent is not None and self._iperf3(node, f.peer, f.rail):
                c.evidenced += 1
                c.bound_senders += f.cpu_demand_percent >= CPU_BOUND_PERCENT
            if w.kind is WindowKind.INTRA:
                domain = self.plan.domain_of[node]
                self.intra.setdefault((domain, f.rail), array("d")).append(rate)
        served: set[tuple[str, str, int]] = set()
        for s in r.serves:
            w = windows.get(s.window)
            key = (s.window, s.peer, s.rail)
            if (
                w is None
                or w.kind not in (WindowKind.INTRA, WindowKind.CROSS)
                or node not in planned[w.id].get(s.peer, ())
                or not self._rail_ok(node, s.peer, s.rail)
                or key in served
            ):
                continue
            served.add(key)
            c = self._open_cell(self._key(node, s.peer, s.rail), stage)
            c.port_seen(s.port_mbps)
            if s.cpu_demand_percent is not None and self._iperf3(s.peer, node, s.rail):
                c.serves += 1
                c.bound_receivers += s.cpu_demand_percent >= CPU_BOUND_PERCENT
        probed: set[tuple[str, str, bool]] = set()
        for lat in r.latency:
            w = windows.get(lat.window)
            key2 = (lat.window, lat.peer, lat.loaded)
            if w is None or lat.peer not in planned[w.id].get(node, ()) or key2 in probed:
                continue
            if lat.loaded is (w.kind is WindowKind.IDLE):
                continue
            probed.add(key2)
            c = self._open_cell(self._key(node, lat.peer, 0), stage)
            if lat.loaded:
                c.loaded.add(lat.histogram)
                c.sent += lat.sent
                c.received += lat.received
            else:
                c.idle.add(lat.histogram)
        read: set[str] = set()
        for st in r.storage:
            w = windows.get(st.window)
            if (
                w is None
                or st.endpoint not in planned[w.id].get(node, ())
                or st.window in read
                or node in gone
                or st.error
                or not _within(w, st.start, st.end)
            ):
                self.refused += 1
                continue
            read.add(st.window)
            rate = st.bytes / 1e6 / (st.end - st.start).total_seconds()
            into = self.storage_all if w.kind is WindowKind.STORAGE else self.storage_single
            into.setdefault(st.endpoint, array("d")).append(rate)
            self.counted += 1

    # -- the figures ------------------------------------------------------------------

    def finish(self, *, expect: Expectations, finished_at: datetime) -> LoadRun:
        plan = self.plan
        for spec in plan.stages:  # a stage nobody answered still planned its flows
            if spec.index not in self._indexes and spec.index not in self._sealed_stages:
                self._index(spec.index)
        for stage in list(self._indexes):
            self._seal_stage(stage)
        excluded = sorted(plan.excluded.items(), key=lambda kv: (kv[1][0], kv[0]))
        skipped: list[SkippedNode] = [
            *(SkippedNode(node=n, reason=why) for n, why in plan.skipped),
            *(SkippedNode(node=n, reason=why, stage=stage) for n, (stage, why) in excluded),
            *(
                SkippedNode(node=n, reason=SkipReason.ENGINE_UNAVAILABLE)
                for n in sorted(self.unavailable)
            ),
            *(SkippedNode(node=n, reason=SkipReason.CLOCK_OFFSET) for n in sorted(self.off_clock)),
            *(
                SkippedNode(node=n, reason=SkipReason.NO_RESULT)
                for n in sorted(plan.domain_of.keys() - self.folded - self.off_clock)
            ),
        ]
        settings = plan.settings
        cells = cell_figures(self.sealed, self.intra, settings.sender_limited_percent)
        storage = storage_figures(
            settings.endpoints, self.storage_all, self.storage_single, self.storage_readers
        )
        breaches = breaches_of(cells, storage, expect)
        over = [
            c.oversubscription
            for c in cells
            if c.a != c.b and c.oversubscription is not None and c.reason is None
        ]
        shown = bounded_cells(cells, breaches)
        # flows counted before their node was withdrawn stay counted: at most all planned
        coverage = 100 * min(self.counted, self.planned) / self.planned if self.planned else None
        return LoadRun(
            id=plan.run_id,
            started_at=plan.stages[0].start,
            finished_at=finished_at,
            nodes=len(self.folded),
            skipped_nodes=skipped[:MAX_SKIPPED],
            skipped_count=len(skipped),
            refused_flows=self.refused,
            planned_flows=self.planned,
            counted_flows=self.counted,
            coverage_percent=round(coverage, 2) if coverage is not None else None,
            engines=sorted(self.engines),
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


__all__ = ["Aggregator", "Received", "aggregate", "jain"]
