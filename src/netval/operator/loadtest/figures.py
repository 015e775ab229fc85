"""A run's figures from its sealed cells and reads: ratios, verdicts, breaches. Pure.

Rates are each flow's bytes over its own measured interval (Mbit/s = 10^6 bit/s; storage
in MB/s = 10^6 B/s). Cells are per unordered domain pair and rail plane (a <= b; a == b:
the intra-domain reference of that plane).

- ``perNodeMbps``: the median over the cell's flows (both directions of a cross cell: with
  unequal domains every node of the larger side has exactly one flow each way, so this is
  its per-node rate), ``aggregateMbps`` their sum.
- ``oversubscription`` of a cross cell: the median intra rate of its two domains on the same
  plane (pooled) / its ``perNodeMbps``; intra cells are the reference, 1.0.
- **SenderLimited** (a verdict, not a ratio): an intra cell whose median stays below
  ``senderLimitedPercent`` of the slowest port its flows reported (or whose ports are
  unknown) while more than half of its flows had a CPU-bound engine on the sending or the
  receiving host (iperf3's CPU demand over the measured part >= 90 % of a core,
  `CPU_BOUND_PERCENT`). The hosts, not the network, set the pace: the cell carries no
  ratio, and neither do the cross cells that would divide by it (or whose own flows were
  host-limited). A shaped or congested link leaves the engines waiting on the network:
  their demand stays low and the cell is measured. A port rate alone is never evidence
  (a veth reports 10000 Mb/s it never reaches).
- **NotMeasured**: a planned cell with no counted flow: no figure, and a breach.
- **Partial**: a cross cell whose larger side could not all be loaded (beyond the fan-out
  bound), or whose ratio is the smaller side's fan-in within 10 % (its receivers' ports,
  carrying that many flows each, may be the bottleneck rather than the uplink; a ratio
  clearly above the fan-in is the uplink's): kept out of ``maxOversubscription``.
- Latency: ``idle/loadedLatencyP99Ms`` the p99 of every round trip of the cell's pairs
  (first rail), from 1%-wide buckets: within 0.5 % of the exact nearest-rank p99.
- Storage per endpoint: every planned reader counts, a failed or silent one as 0 MB/s, in
  ``perNodeMBpsMin``, the median and ``fairness`` (Jain's index over all readers).
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from netval.model.loadplan import bucket_ms
from netval.model.loadtest import (
    MAX_LOAD_CELLS,
    MAX_NOTE,
    Breach,
    CellReason,
    Expectations,
    LoadCell,
    LoadStorage,
)

CellKey = tuple[str, str, int]  # (domain a, domain b, rail), a <= b
PARTIAL_FAN_SHARE: Final = 0.1  # a ratio this close to the fan-in: the receivers' ports


class Hist:
    """Round trips per 1%-wide bucket (netval.model.loadplan.latency_bucket)."""

    __slots__ = ("buckets", "n")

    def __init__(self) -> None:
        self.buckets: Counter[int] = Counter()
        self.n = 0

    def add(self, pairs: Iterable[tuple[int, int]]) -> None:
        for bucket, count in pairs:
            self.buckets[bucket] += count
            self.n += count

    def p99(self) -> float | None:
        if not self.n:
            return None
        rank = max(1, math.ceil(0.99 * self.n))
        seen = 0
        for k in sorted(self.buckets):
            seen += self.buckets[k]
            if seen >= rank:
                return bucket_ms(k)
        return None  # unreachable: the counts add up to n


@dataclass(frozen=True, slots=True)
class Sealed:
    """A cell's figures and evidence once its stage is over."""

    flows: int
    planned: int
    per_node: float | None
    aggregate: float | None
    loss: float | None
    idle_p99: float | None
    loaded_p99: float | None
    port: float | None
    evidenced: int
    bound_senders: int
    serves: int
    bound_receivers: int
    retransmits: int | None
    fanout: tuple[int, int, int] | None  # (fan, loaded, size)

    def host_limited(self, percent: float) -> str | None:
        """Why the hosts limited this cell's flows (the note), or None."""
        if self.per_node is None:
            return None
        below = self.port is None or self.per_node < percent / 100 * self.port
        senders = self.evidenced and 2 * self.bound_senders > self.evidenced
        receivers = self.serves and 2 * self.bound_receivers > self.serves
        if not below or not (senders or receivers):
            return None
        port = f"{self.port:.0f}" if self.port is not None else "unknown"
        return (
            f"{self.per_node:.0f} Mbit/s per node, port {port} Mbit/s (limit "
            f"{percent:g} %); CPU-bound engines: {self.bound_senders}/{self.evidenced} "
            f"senders, {self.bound_receivers}/{self.serves} receivers"
        )


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


@dataclass(frozen=True, slots=True)
class CellFigures:
    """A cell before it becomes status: the model is built for the cells shown only."""

    a: str
    b: str
    rail: int
    flows: int
    planned: int
    per_node_mbps: float | None
    aggregate_mbps: float | None
    oversubscription: float | None
    loss_percent: float | None
    idle_latency_p99_ms: float | None
    loaded_latency_p99_ms: float | None
    reason: CellReason | None
    note: str
    port_mbps: float | None
    cpu_bound_percent: float | None
    retransmits: int | None

    @property
    def subject(self) -> str:
        base = f"{self.a}/{self.b}"
        return base if self.rail == 0 else f"{base} rail {self.rail}"

    def model(self) -> LoadCell:
        return LoadCell(
            a=self.a, b=self.b, rail=self.rail, flows=self.flows, planned=self.planned,
            per_node_mbps=self.per_node_mbps, aggregate_mbps=self.aggregate_mbps,
            oversubscription=self.oversubscription, loss_percent=self.loss_percent,
            idle_latency_p99_ms=self.idle_latency_p99_ms,
            loaded_latency_p99_ms=self.loaded_latency_p99_ms, reason=self.reason,
            note=self.note[:MAX_NOTE], port_mbps=self.port_mbps,
            cpu_bound_percent=self.cpu_bound_percent, retransmits=self.retransmits,
        )  # fmt: skip


def _verdict(
    key: CellKey,
    c: Sealed,
    intra: Mapping[tuple[str, int], array[float]],
    limited: Mapping[tuple[str, int], str],
    percent: float,
) -> tuple[float | None, CellReason | None, str]:
    """(oversubscription, reason, note) of one cell."""
    a, b, rail = key
    if c.flows == 0:
        return None, CellReason.NOT_MEASURED, f"{c.planned} flow(s) planned, none counted"
    if a == b:
        why = limited.get((a, rail))
        if why is not None:
            return None, CellReason.SENDER_LIMITED, why
        return (1.0 if c.per_node else None), None, ""
    for domain in (a, b):
        why = limited.get((domain, rail))
        if why is not None:
            return None, CellReason.SENDER_LIMITED, f"the reference of {domain}: {why}"
    why = c.host_limited(percent)
    if why is not None:
        return None, CellReason.SENDER_LIMITED, why
    pool = [*intra.get((a, rail), ()), *intra.get((b, rail), ())]
    over = _mid(pool) / c.per_node if pool and c.per_node else None
    if c.fanout is not None and over is not None:
        fan, loaded, size = c.fanout
        if loaded < size:
            return (
                over,
                CellReason.PARTIAL,
                (
                    f"unequal domains: {loaded} of {size} nodes of the larger side loaded "
                    f"({fan} flows per receiver at most): the uplink was not fully loaded"
                ),
            )
        if fan > 1 and abs(over / fan - 1) <= PARTIAL_FAN_SHARE:
            return (
                over,
                CellReason.PARTIAL,
                (
                    f"unequal domains: the smaller side's nodes received {fan} flows each; "
                    f"at {over:.2f} their ports, not the uplink, may be the bottleneck "
                    f"(oversubscription at least {over:.2f})"
                ),
            )
    return over, None, ""


def cell_figures(
    sealed: Mapping[CellKey, Sealed], intra: Mapping[tuple[str, int], array[float]], percent: float
) -> list[CellFigures]:
    limited: dict[tuple[str, int], str] = {}
    for (a, b, rail), c in sealed.items():
        if a == b and (why := c.host_limited(percent)) is not None:
            limited[(a, rail)] = why
    out: list[CellFigures] = []
    for key, c in sorted(sealed.items()):
        a, b, rail = key
        over, reason, note = _verdict(key, c, intra, limited, percent)
        shown_over = (
            None if reason in (CellReason.SENDER_LIMITED, CellReason.NOT_MEASURED) else over
        )
        evidence = c.evidenced + c.serves
        bound = c.bound_senders + c.bound_receivers
        out.append(
            CellFigures(
                a=a, b=b, rail=rail, flows=c.flows, planned=c.planned,
                per_node_mbps=_r(c.per_node, 3), aggregate_mbps=_r(c.aggregate, 3),
                oversubscription=_r(shown_over, 3), loss_percent=_r(c.loss, 3),
                idle_latency_p99_ms=_r(c.idle_p99, 4), loaded_latency_p99_ms=_r(c.loaded_p99, 4),
                reason=reason, note=note, port_mbps=_r(c.port, 1),
                cpu_bound_percent=_r(100 * bound / evidence, 1) if evidence else None,
                retransmits=c.retransmits,
            )
        )  # fmt: skip
    return out


def storage_figures(
    endpoints: Sequence[str],
    every: Mapping[str, array[float]],
    single: Mapping[str, array[float]],
    readers: Mapping[str, int],
) -> list[LoadStorage]:
    """Per endpoint: every planned reader counts, one that read nothing as 0 MB/s."""
    out: list[LoadStorage] = []
    for e in endpoints:
        rates = list(every.get(e, ()))
        planned = max(readers.get(e, 0), len(rates))
        padded = rates + [0.0] * (planned - len(rates))
        alone = single.get(e, ())
        out.append(
            LoadStorage(
                endpoint=e,
                nodes=len(rates),
                readers=planned,
                aggregate_m_bps=_r(sum(rates), 3) if rates else None,
                per_node_m_bps_min=_r(min(padded), 3) if padded else None,
                per_node_m_bps_median=_r(_mid(padded), 3) if padded else None,
                single_node_m_bps=_r(_mid(alone), 3) if alone else None,
                fairness=_r(jain(padded), 4) if padded else None,
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class BreachFigures:
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


NOT_MEASURED: Final = "NotMeasured"


def breaches_of(
    cells: list[CellFigures], storage: list[LoadStorage], expect: Expectations
) -> list[BreachFigures]:
    out: list[BreachFigures] = [
        BreachFigures(NOT_MEASURED, c.subject, float(c.flows), float(c.planned))
        for c in cells
        if c.reason is CellReason.NOT_MEASURED
    ]
    out += [
        BreachFigures(NOT_MEASURED, s.endpoint, 0.0, float(s.readers))
        for s in storage
        if s.readers and s.nodes == 0
    ]
    if expect.max_oversubscription is not None:
        limit = expect.max_oversubscription
        out += [
            BreachFigures("maxOversubscription", c.subject, c.oversubscription, limit)
            for c in cells
            if c.oversubscription is not None and c.reason is None and c.oversubscription > limit
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
                    BreachFigures("maxLatencyInflation", c.subject, round(inflation, 3), limit)
                )
    if expect.min_storage_m_bps_per_node is not None:
        floor = expect.min_storage_m_bps_per_node
        out += [
            BreachFigures("minStorageMBpsPerNode", s.endpoint, s.per_node_m_bps_min, floor)
            for s in storage
            if s.nodes and s.per_node_m_bps_min is not None and s.per_node_m_bps_min < floor
        ]
    # the worst first: nothing measured, then the furthest from its limit, relatively
    return sorted(
        out,
        key=lambda b: (
            b.expectation != NOT_MEASURED,
            -abs(math.log(max(b.observed, 1e-9) / max(b.expected, 1e-9))),
        ),
    )


def bounded_cells(cells: list[CellFigures], breaches: list[BreachFigures]) -> list[CellFigures]:
    """All cells if they fit; else breached cells, then those with a reason, then the most
    oversubscribed."""
    if len(cells) <= MAX_LOAD_CELLS:
        return cells
    hit = {b.subject for b in breaches}
    ranked = sorted(
        cells,
        key=lambda c: (
            c.subject not in hit,
            c.reason is None,
            -(c.oversubscription or 0.0),
            c.a,
            c.b,
            c.rail,
        ),
    )
    return sorted(ranked[:MAX_LOAD_CELLS], key=lambda c: (c.a, c.b, c.rail))
