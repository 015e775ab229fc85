"""East-west aggregation: the domain x domain matrix, capacity ratios, suspect nodes.

Pure and in memory (no I/O, no clock); the output types live in `netval.model.east_west`
(the status model and `netval status` read them too). Input: the ``peer.*`` results of the latest report of
each node of one validation (a result's subject is the peer node) and each node's domain
(the value of its `peers.topologyKey` label). Output: an `EastWest` summary, bounded in size
so it fits the CR status.

- Matrix. One cell per unordered domain pair (``a <= b``; ``a == b`` is intra-domain) with
  the medians over the pair results that fell in it: p50/p99 round trip, loss, throughput,
  plus the smallest path MTU and the number of failing results. Latency, loss and path MTU
  are round-trip properties, so both directions share a cell; throughput samples of both
  directions are pooled too.
- Capacity ratio. For a cross-domain cell, ``throughputRatio`` = median cross-domain
  throughput / median intra-domain throughput of the two domains (their intra samples
  pooled), and ``capacityRatio`` = its inverse (4.0 reads "4:1"). A cell whose ratio is
  below `minThroughputRatio` is flagged. The samples are single flows taken one at a time,
  so this is the ratio of what one flow gets along each path (a narrow link shows, an
  oversubscribed uplink does not: a lone flow gets its full rate); oversubscription is what
  a `NetworkLoadTest` measures, with every node sending at once (`netval.operator.loadtest`).
- Suspect isolation. Node pairs are edges; an edge is bad when any latency, loss or path-MTU
  result between the two nodes (either direction) failed or errored. A node is a suspect
  when at least ``SUSPECT_MIN_BAD`` of its edges and at least half of them are bad, while
  the peers on those bad edges do fine with others (the median of their bad fraction
  without this node is below half of the node's own fraction and below 0.5). Suspects are
  picked greedily, worst first, and their bad edges removed before looking again, so a lossy
  node explains its pairs and two bad nodes are both found; a domain-wide fault (every
  cross-rack pair failing) makes no suspect: its failing pairs stay "unexplained" and the
  matrix shows where they are; the link localization (`state.localize`, run first) names
  the uplink or domain pair that explains them, and its failing pairs are left out of the
  node search. The nodes whose failing pairs all point at a suspect elsewhere are the
  observers (`analyse`), whose path results do not make them degraded.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from pydantic import JsonValue

from netval.model.east_west import (
    MAX_CELLS,
    MAX_FLAGGED,
    MAX_SUSPECTS,
    UNASSIGNED,
    Cell,
    EastWest,
    FlaggedPair,
    Suspect,
)
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.operator.state.localize import localize, observers, suspect_nodes

# The operator runs this every status window over the latest results of every node (~100k
# at 1,000 nodes), so the loop over results (`_Matrix.add`) keeps to plain dict, set and
# identity operations. What it avoids, each measured there: `Status.is_bad` (a Python
# property) and `Status.SKIP` (an enum class lookup) per result, `isinstance(x, int | float)`
# (builds a union per call), a `sorted()` and helper calls per result for its cell and pair.
_LATENCY: Final = CheckId.PEER_LATENCY
_LOSS: Final = CheckId.PEER_LOSS
_PATH_MTU: Final = CheckId.PEER_PATH_MTU
_THROUGHPUT: Final = CheckId.PEER_THROUGHPUT
_PEER_CHECKS: Final = frozenset({_LATENCY, _LOSS, _PATH_MTU, _THROUGHPUT})
_BAD: Final = frozenset(s for s in Status if s.is_bad)

_Pair = tuple[str, str]  # two nodes or two domains, the smaller first


@dataclass(slots=True)
class _Acc:
    # The cell's node pairs: those with a latency/loss/path-MTU result (True: one failed) and
    # those with a throughput result. A pair falls in one cell only, so these also count the
    # cell's pairs and, chained, are the suspect search's edges.
    edges: dict[_Pair, bool] = field(default_factory=dict)
    sampled: set[_Pair] = field(default_factory=set)
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    mtu: list[float] = field(default_factory=list)  # as reported: see `_cells`
    mbps: list[float] = field(default_factory=list)
    failing: int = 0


def _number(value: JsonValue) -> float | None:
    """A JSON number as a float (callers test for the usual type first: the cheap case)."""
    # a tuple, not `int | float`: that builds a union object on every call
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


@dataclass(slots=True)
class _Matrix:
    """The accumulators of one run: the cells (with their node pairs), the failing pairs, the
    nodes seen."""

    domain_of: dict[str, str]  # the given domains; `resolve` adds the nodes missing there
    cells: dict[_Pair, _Acc] = field(default_factory=dict)
    # domain -> other domain -> the accumulator of their cell, so a result finds its cell in
    # two lookups, with no sorting
    rows: dict[str, dict[str, _Acc]] = field(default_factory=dict)
    bad_edges: dict[_Pair, set[str]] = field(default_factory=dict)  # -> the checks that failed
    # pairs whose throughput sample failed: no path evidence (a sample fails for many
    # reasons), but a prober's warning all the same, explained when a suspect explains it
    bad_samples: set[_Pair] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)
    announced: dict[str, str] = field(default_factory=dict)  # of nodes missing from domains
    # results whose prober or peer is missing from the given domains: their domain may be
    # announced by a later result, so they are bucketed once every result has been seen
    deferred: list[tuple[str, list[CheckResult]]] = field(default_factory=list)

    def cell(self, da: str, db: str) -> _Acc:
        key = (da, db) if da <= db else (db, da)
        acc = self.cells.get(key)
        if acc is None:
            acc = self.cells[key] = _Acc()
        self.rows.setdefault(da, {})[db] = acc
        self.rows.setdefault(db, {})[da] = acc
        return acc

    def add(self, prober: str, results: Iterable[CheckResult]) -> None:
        """Bucket one node's results (the hot loop: see the note above `_LATENCY`)."""
        self.nodes.add(prober)
        dp = self.domain_of.get(prober)
        if dp is None:
            self._defer(prober, results)
            return
        row = self.rows.setdefault(dp, {})
        domain_get, nodes_add = self.domain_of.get, self.nodes.add
        bad_edges = self.bad_edges
        peer_checks, bad_statuses, skip, passed = _PEER_CHECKS, _BAD, Status.SKIP, Status.PASS
        latency, loss, throughput = _LATENCY, _LOSS, _THROUGHPUT
        later: list[CheckResult] = []
        last: str | None = None
        here = False  # the current peer's results are bucketed now (else self or deferred)
        edged = False  # the current pair is in its cell's edges
        ds, pair, acc = dp, (prober, prober), None
        for r in results:
            check = r.check
            if check not in peer_checks:
                continue
            subject = r.subject
            if subject != last:  # a peer's results come together: one set of lookups for all
                last, here, edged = subject, False, False
                if subject != prober:
                    nodes_add(subject)
                    found = domain_get(subject)
                    if found is not None:
                        here, ds = True, found
                        acc = row.get(ds)
                        pair = (prober, subject) if prober < subject else (subject, prober)
            if not here:
                if subject != prober:
                    later.append(r)
                    self._announce(r)
                continue
            status = r.status
            if status is skip:
                continue
            if acc is None:  # made on its first sample: a cell of skips only is no cell
                acc = self.cell(dp, ds)
            obs = r.observed
            if check is throughput:
                acc.sampled.add(pair)
                if status is passed:
                    v = obs.get("mbps")
                    if (type(v) is float or (v := _number(v)) is not None) and v > 0:
                        acc.mbps.append(v)
                elif status in bad_statuses:
                    self.bad_samples.add(pair)
                continue
            if check is latency:
                v = obs.get("p50Ms")
                if type(v) is float or (v := _number(v)) is not None:
                    acc.p50.append(v)
                v = obs.get("p99Ms")
                if type(v) is float or (v := _number(v)) is not None:
                    acc.p99.append(v)
            elif check is loss:
                v = obs.get("lossPercent")
                if type(v) is float or (v := _number(v)) is not None:
                    acc.loss.append(v)
            else:
                v = obs.get("pathMTU")
                if type(v) is int or (v := _number(v)) is not None:  # an int, as a rule
                    acc.mtu.append(v)
            if status in bad_statuses:
                acc.edges[pair] = True
                acc.failing += 1
                checks = bad_edges.get(pair)
                if checks is None:
                    checks = bad_edges[pair] = set()
                checks.add(check.value)
            elif not edged and pair not in acc.edges:
                acc.edges[pair] = False
            edged = True
        if later:
            self.deferred.append((prober, later))

    def _announce(self, r: CheckResult) -> None:
        if r.subject not in self.domain_of:
            announced = r.observed.get("domain")
            if isinstance(announced, str) and announced:
                self.announced.setdefault(r.subject, announced)

    def _defer(self, prober: str, results: Iterable[CheckResult]) -> None:
        kept = [r for r in results if r.check in _PEER_CHECKS and r.subject != prober]
        for r in kept:
            self.nodes.add(r.subject)
            self._announce(r)
        self.deferred.append((prober, kept))

    def resolve(self) -> None:
        """Nodes missing from the domains take the one announced first; then bucket the rest."""
        for node in self.nodes:
            if node not in self.domain_of:
                self.domain_of[node] = self.announced.get(node) or UNASSIGNED
        deferred, self.deferred = self.deferred, []
        for prober, results in deferred:
            self.add(prober, results)


class Analysis(NamedTuple):
    summary: EastWest
    observers: frozenset[str]
    explained: dict[tuple[str, str], str | None]  # failing pair -> suspect node (None: link)


def east_west(
    results_by_node: Mapping[str, Iterable[CheckResult]],
    domains: Mapping[str, str | None],
    *,
    min_throughput_ratio: float,
    max_cells: int = MAX_CELLS,
    max_suspects: int = MAX_SUSPECTS,
) -> EastWest:
    """The summary of one validation; see the module docstring."""
    return analyse(
        results_by_node, domains, min_throughput_ratio=min_throughput_ratio,
        max_cells=max_cells, max_suspects=max_suspects,
    ).summary  # fmt: skip


def analyse(
    results_by_node: Mapping[str, Iterable[CheckResult]],
    domains: Mapping[str, str | None],
    *,
    min_throughput_ratio: float,
    max_cells: int = MAX_CELLS,
    max_suspects: int = MAX_SUSPECTS,
    recent: Mapping[_Pair, str | None] | None = None,
) -> Analysis:
    """The summary, its observers (the nodes whose failing paths a suspect elsewhere
    explains, `state.localize.observers`) and the failing pairs explained (-> the suspect
    node, None for a link). `recent`: pairs an earlier run explained; while they still fail
    they stay explained (a fault's last failing results outlive the suspect by a cycle: they
    make no node suspect, and their probers stay observers)."""
    m = _Matrix(domain_of={node: domain or UNASSIGNED for node, domain in domains.items()})
    for prober, results in results_by_node.items():
        m.add(prober, results)
    m.resolve()
    built = _cells(m.cells, min_throughput_ratio)
    flagged = sorted(
        (c for c in built if c.flagged),
        key=lambda c: (c.throughput_ratio or 0.0, c.a, c.b),
    )
    # links first: a failing uplink makes every node of its domain look half bad, and the
    # node search must not pick one of them for it
    links, by_link = localize(
        {key: acc.edges for key, acc in m.cells.items()}, m.bad_edges, m.domain_of
    )
    earlier = recent or {}
    linked = by_link | {p for p, c in earlier.items() if c is None and p in m.bad_edges}
    rest = {pair: checks for pair, checks in m.bad_edges.items() if pair not in linked}
    edges = itertools.chain.from_iterable(acc.edges for acc in m.cells.values())
    intra_ok = {
        node
        for (da, db), acc in m.cells.items()
        if da == db
        for pair, bad in acc.edges.items()
        if not bad
        for node in pair
    }
    suspects, by_node, unexplained = suspect_nodes(edges, rest, m.domain_of, max_suspects, intra_ok)
    shown = _bounded(built, max_cells)
    blamed = {p: c for p, c in earlier.items() if c is not None and p in rest} | by_node
    # a failed throughput sample towards a suspect node, or across a suspect link
    named = {s.node for s in suspects}
    cut = {(x.a, x.b) for x in links if x.b is not None}
    uplinks = {x.a for x in links if x.b is None}
    for x, y in m.bad_samples - m.bad_edges.keys():
        dx, dy = m.domain_of[x], m.domain_of[y]
        if dx != dy and ((min(dx, dy), max(dx, dy)) in cut or uplinks & {dx, dy}):
            linked.add((x, y))
        elif x in named or y in named:
            blamed[(x, y)] = x if x in named else y
    failing = m.bad_edges.keys() | m.bad_samples
    watching = observers(dict.fromkeys(failing), linked, blamed)
    summary = EastWest(
        domains=len({m.domain_of[n] for n in m.nodes}),
        nodes=len(m.nodes),
        min_throughput_ratio=min_throughput_ratio,
        cells=shown,
        omitted_cells=len(built) - len(shown),
        flagged=[
            FlaggedPair(
                a=c.a,
                b=c.b,
                throughput_ratio=c.throughput_ratio or 0.0,
                capacity_ratio=c.capacity_ratio or 0.0,
            )
            for c in flagged[:MAX_FLAGGED]
        ],
        suspects=suspects,
        link_suspects=links,
        observers=len(watching),
        failing_pairs=len(m.bad_edges),
        unexplained_failing_pairs=unexplained,
    )
    explained: dict[_Pair, str | None] = dict.fromkeys(by_link)
    explained.update(by_node)
    return Analysis(summary, watching, explained)


def _mid(values: list[float]) -> float:
    """The median without overflow: statistics.median averages the two middle values as
    (a + b) / 2, which is inf for two finite numbers near the float maximum."""
    ordered = sorted(values)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else ordered[half - 1] / 2 + ordered[half] / 2


def _median(values: list[float], digits: int) -> float | None:
    return round(_mid(values), digits) if values else None


def _ratio(num: float, den: float, digits: int) -> float | None:
    """num / den, or None where it is not a finite number (a huge over a tiny one)."""
    value = num / den
    return round(value, digits) if math.isfinite(value) else None


def _cells(cells: Mapping[tuple[str, str], _Acc], min_ratio: float) -> list[Cell]:
    intra = {a: acc.mbps for (a, b), acc in cells.items() if a == b}
    out: list[Cell] = []
    for (a, b), acc in sorted(cells.items()):
        cross = _median(acc.mbps, 3)
        ratio = capacity = None
        if a != b and cross is not None:
            pool = intra.get(a, []) + intra.get(b, [])
            base = _mid(pool) if pool else None
            if base:
                ratio = _ratio(cross, base, 4)
                capacity = _ratio(base, cross, 3) if cross > 0 else None
        out.append(
            Cell(
                a=a,
                b=b,
                pairs=len(acc.edges) + len(acc.sampled.difference(acc.edges)),
                latency_p50_ms=_median(acc.p50, 4),
                latency_p99_ms=_median(acc.p99, 4),
                loss_percent=_median(acc.loss, 3),
                # int(float(x)) never reorders, so converting the smallest alone gives the
                # smallest converted value
                path_mtu=int(float(min(acc.mtu))) if acc.mtu else None,
                throughput_mbps=cross,
                throughput_samples=len(acc.mbps),
                throughput_ratio=ratio,
                capacity_ratio=capacity,
                failing=acc.failing,
                flagged=ratio is not None and ratio < min_ratio,
            )
        )
    return out


def _bounded(cells: list[Cell], limit: int) -> list[Cell]:
    """All cells if they fit; else flagged and failing cells first, then the busiest."""
    if len(cells) <= limit:
        return cells
    ranked = sorted(cells, key=lambda c: (not c.flagged, c.failing == 0, -c.pairs, c.a, c.b))
    return sorted(ranked[:limit], key=lambda c: (c.a, c.b))


__all__ = [
    "MAX_CELLS",
    "UNASSIGNED",
    "Analysis",
    "Cell",
    "EastWest",
    "FlaggedPair",
    "Suspect",
    "analyse",
    "east_west",
]
