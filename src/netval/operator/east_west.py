"""East-west aggregation: the domain x domain matrix, oversubscription, suspect nodes.

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
- Oversubscription. For a cross-domain cell, ``throughputRatio`` = median cross-domain
  throughput / median intra-domain throughput of the two domains (their intra samples
  pooled), and ``oversubscription`` = its inverse (4.0 reads "4:1"). A cell whose ratio is
  below `minThroughputRatio` is flagged.
- Suspect isolation. Node pairs are edges; an edge is bad when any latency, loss or path-MTU
  result between the two nodes (either direction) failed or errored. A node is a suspect
  when at least ``SUSPECT_MIN_BAD`` of its edges and at least half of them are bad, while
  the peers on those bad edges do fine with others (the median of their bad fraction
  without this node is below half of the node's own fraction and below 0.5). Suspects are
  picked greedily, worst first, and their edges removed before looking again, so a lossy
  node explains its pairs and two bad nodes are both found; a domain-wide fault (every
  cross-rack pair failing) makes no suspect: its failing pairs stay "unexplained" and the
  matrix shows where they are.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from pydantic import JsonValue

from netval.model.east_west import (
    MAX_CELLS,
    MAX_FLAGGED,
    MAX_SUSPECT_CHECKS,
    MAX_SUSPECTS,
    UNASSIGNED,
    Cell,
    EastWest,
    FlaggedPair,
    Suspect,
)
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult

SUSPECT_MIN_BAD: Final = 2
SUSPECT_MIN_FRACTION: Final = 0.5
PEERS_OK_FRACTION: Final = 0.5

_PATH_CHECKS: Final = frozenset({CheckId.PEER_LATENCY, CheckId.PEER_LOSS, CheckId.PEER_PATH_MTU})
_PEER_CHECKS: Final = _PATH_CHECKS | {CheckId.PEER_THROUGHPUT}


@dataclass(slots=True)
class _Acc:
    pairs: set[tuple[str, str]] = field(default_factory=set)
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    mtu: list[int] = field(default_factory=list)
    mbps: list[float] = field(default_factory=list)
    failing: int = 0


def _number(observed: Mapping[str, JsonValue], key: str) -> float | None:
    value = observed.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _domains(
    results_by_node: Mapping[str, Iterable[CheckResult]], domains: Mapping[str, str | None]
) -> tuple[dict[str, str], dict[str, list[CheckResult]]]:
    """Each node's domain (given, else as its probers saw it announced) and its peer results."""
    kept: dict[str, list[CheckResult]] = {}
    seen: dict[str, str] = {}
    for node, results in results_by_node.items():
        mine = [r for r in results if r.check in _PEER_CHECKS and r.subject != node]
        kept[node] = mine
        for r in mine:
            announced = r.observed.get("domain")
            if isinstance(announced, str) and announced:
                seen.setdefault(r.subject, announced)
    everyone = set(kept) | {r.subject for rs in kept.values() for r in rs}
    resolved: dict[str, str] = {}
    for node in everyone:
        given = domains.get(node)
        resolved[node] = given or (seen.get(node) if node not in domains else None) or UNASSIGNED
    return resolved, kept


def east_west(
    results_by_node: Mapping[str, Iterable[CheckResult]],
    domains: Mapping[str, str | None],
    *,
    min_throughput_ratio: float,
    max_cells: int = MAX_CELLS,
    max_suspects: int = MAX_SUSPECTS,
) -> EastWest:
    """The summary of one validation; see the module docstring."""
    domain_of, kept = _domains(results_by_node, domains)
    cells: dict[tuple[str, str], _Acc] = {}
    edges: dict[tuple[str, str], bool] = {}
    edge_checks: dict[tuple[str, str], set[str]] = {}
    for prober, results in kept.items():
        for r in results:
            if r.status is Status.SKIP:
                continue
            da, db = sorted((domain_of[prober], domain_of[r.subject]))
            key = (da, db)
            acc = cells.get(key)
            if acc is None:  # not setdefault: that builds an accumulator per result
                acc = cells[key] = _Acc()
            pair = (min(prober, r.subject), max(prober, r.subject))
            acc.pairs.add(pair)
            _collect(acc, r)
            if r.check in _PATH_CHECKS:
                bad = r.status.is_bad
                edges[pair] = edges.get(pair, False) or bad
                if bad:
                    acc.failing += 1
                    edge_checks.setdefault(pair, set()).add(r.check.value)
    built = _cells(cells, min_throughput_ratio)
    flagged = sorted(
        (c for c in built if c.flagged),
        key=lambda c: (c.throughput_ratio or 0.0, c.a, c.b),
    )
    suspects, unexplained = _suspects(edges, edge_checks, domain_of, max_suspects)
    shown = _bounded(built, max_cells)
    return EastWest(
        domains=len(set(domain_of.values())),
        nodes=len(domain_of),
        min_throughput_ratio=min_throughput_ratio,
        cells=shown,
        omitted_cells=len(built) - len(shown),
        flagged=[
            FlaggedPair(
                a=c.a,
                b=c.b,
                throughput_ratio=c.throughput_ratio or 0.0,
                oversubscription=c.oversubscription or 0.0,
            )
            for c in flagged[:MAX_FLAGGED]
        ],
        suspects=suspects,
        failing_pairs=sum(edges.values()),
        unexplained_failing_pairs=unexplained,
    )


def _collect(acc: _Acc, r: CheckResult) -> None:
    obs = r.observed
    if r.check is CheckId.PEER_LATENCY:
        p50, p99 = _number(obs, "p50Ms"), _number(obs, "p99Ms")
        if p50 is not None:
            acc.p50.append(p50)
        if p99 is not None:
            acc.p99.append(p99)
    elif r.check is CheckId.PEER_LOSS:
        loss = _number(obs, "lossPercent")
        if loss is not None:
            acc.loss.append(loss)
    elif r.check is CheckId.PEER_PATH_MTU:
        mtu = _number(obs, "pathMTU")
        if mtu is not None:
            acc.mtu.append(int(mtu))
    elif r.check is CheckId.PEER_THROUGHPUT and r.status is Status.PASS:
        mbps = _number(obs, "mbps")
        if mbps is not None and mbps > 0:
            acc.mbps.append(mbps)


def _median(values: list[float], digits: int) -> float | None:
    return round(statistics.median(values), digits) if values else None


def _cells(cells: Mapping[tuple[str, str], _Acc], min_ratio: float) -> list[Cell]:
    intra = {a: acc.mbps for (a, b), acc in cells.items() if a == b}
    out: list[Cell] = []
    for (a, b), acc in sorted(cells.items()):
        cross = _median(acc.mbps, 3)
        ratio = over = None
        if a != b and cross is not None:
            pool = intra.get(a, []) + intra.get(b, [])
            base = statistics.median(pool) if pool else None
            if base:
                ratio = round(cross / base, 4)
                over = round(base / cross, 3) if cross > 0 else None
        out.append(
            Cell(
                a=a,
                b=b,
                pairs=len(acc.pairs),
                latency_p50_ms=_median(acc.p50, 4),
                latency_p99_ms=_median(acc.p99, 4),
                loss_percent=_median(acc.loss, 3),
                path_mtu=min(acc.mtu) if acc.mtu else None,
                throughput_mbps=cross,
                throughput_samples=len(acc.mbps),
                throughput_ratio=ratio,
                oversubscription=over,
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


def _suspects(
    edges: Mapping[tuple[str, str], bool],
    edge_checks: Mapping[tuple[str, str], set[str]],
    domain_of: Mapping[str, str],
    limit: int,
) -> tuple[list[Suspect], int]:
    adj: dict[str, dict[str, bool]] = {}
    for (a, b), bad in edges.items():
        adj.setdefault(a, {})[b] = bad
        adj.setdefault(b, {})[a] = bad
    found: list[Suspect] = []
    while len(found) < limit:
        candidates: list[tuple[float, int, str]] = []  # (-fraction, -bad, node): min is worst
        for node, peers in adj.items():
            bad_peers = [p for p, bad in peers.items() if bad]
            if len(bad_peers) < SUSPECT_MIN_BAD:
                continue
            fraction = len(bad_peers) / len(peers)
            if fraction < SUSPECT_MIN_FRACTION:
                continue
            elsewhere = [
                sum(b for q, b in adj[p].items() if q != node) / (len(adj[p]) - 1)
                for p in bad_peers
                if len(adj[p]) > 1
            ]
            if not elsewhere:
                continue  # nobody else to compare with: cannot tell the node from the path
            if statistics.median(elsewhere) >= min(PEERS_OK_FRACTION, fraction / 2):
                continue
            candidates.append((-fraction, -len(bad_peers), node))
        if not candidates:
            break
        node = min(candidates)[2]
        peers = adj.pop(node)
        bad_peers = sorted(p for p, bad in peers.items() if bad)
        checks: set[str] = set()
        for p in bad_peers:
            checks |= edge_checks.get((min(node, p), max(node, p)), set())
            adj[p].pop(node, None)
        found.append(
            Suspect(
                node=node,
                domain=domain_of.get(node, UNASSIGNED),
                failing_peers=len(bad_peers),
                peers=len(peers),
                checks=sorted(checks)[:MAX_SUSPECT_CHECKS],
            )
        )
    unexplained = sum(1 for peers in adj.values() for bad in peers.values() if bad) // 2
    return found, unexplained


__all__ = ["MAX_CELLS", "UNASSIGNED", "Cell", "EastWest", "FlaggedPair", "Suspect", "east_west"]
