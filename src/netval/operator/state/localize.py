"""Culprit localization: which uplink, domain pair or node explains failing paths.

Pure (no I/O, no clock). Network tomography on the east-west edges: every node pair with a
latency, loss or path-MTU result is a path, bad when one of them failed; a path between two
domains crosses the first domain's uplink, the fabric between the domains and the second
domain's uplink; a path inside a domain crosses none of them. An element is suspect when the
paths through it fail and the paths around it do not:

- **uplink of domain d** (`LinkKind.UPLINK`, needs 3 domains or more: with two, nothing
  tells one uplink from the other): every cross-domain cell of d with a result is bad, at
  least ``MIN_CELLS`` of them, and the paths around it (inside any domain, between two other
  domains) are fine;
- **domain pair (a, b)** (`LinkKind.DOMAIN_PAIR`): the cell of a and b is bad, and the
  paths around it (inside a and b, from a or b to a third domain) are fine.

A cell is bad when at least ``MIN_FAILING`` of its paths and at least ``THROUGH_FRACTION``
of them fail, and the failing ones touch at least two nodes on each side (or every node a
side has): a fault of one node's port fails its own paths only, so one node covering every
failing path of a cell is that node's suspicion (`east_west_matrix._suspects`), not a
link's. Paths around are fine when at most ``AROUND_FRACTION`` of them fail, and there must
be at least one: with no witness nothing separates the link from its endpoints.

Confidence = (failing / paths through) x (1 - failing / paths around). The failing paths a
suspect link explains are handed back, so the node search runs on the rest and the
verdict treats the endpoints of those paths as observers, not culprits.

The node search (`suspect_nodes`, on the failing pairs no link explains) is described in
`east_west_matrix`'s docstring (suspect isolation).

Cost: one pass over the cells (domains squared, at most a few hundred) plus one over the
failing paths; nothing per healthy node pair beyond the counts the matrix keeps anyway.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from netval.model.east_west import (
    MAX_LINK_SUSPECTS,
    MAX_SUSPECT_CHECKS,
    UNASSIGNED,
    LinkKind,
    LinkSuspect,
    Suspect,
)

SUSPECT_MIN_BAD: Final = 2
SUSPECT_MIN_FRACTION: Final = 0.5
PEERS_OK_FRACTION: Final = 0.5
MIN_FAILING: Final = 2
MIN_CELLS: Final = 2
THROUGH_FRACTION: Final = 0.75
AROUND_FRACTION: Final = 0.25

Pair = tuple[str, str]  # two nodes, or two domains, the smaller first


@dataclass(slots=True)
class _Cell:
    paths: int = 0
    bad: list[Pair] = field(default_factory=list)
    # the nodes on each side of the cell's paths (a cell inside one domain: one side)
    nodes: dict[str, set[str]] = field(default_factory=dict)

    @property
    def fraction(self) -> float:
        return len(self.bad) / self.paths if self.paths else 0.0


def _cells(
    cells: Mapping[Pair, Mapping[Pair, bool]], domain_of: Mapping[str, str]
) -> dict[Pair, _Cell]:
    out: dict[Pair, _Cell] = {}
    for key, edges in cells.items():
        if not edges:
            continue
        c = out[key] = _Cell(paths=len(edges))
        for (x, y), bad in edges.items():
            c.nodes.setdefault(domain_of[x], set()).add(x)
            c.nodes.setdefault(domain_of[y], set()).add(y)
            if bad:
                c.bad.append((x, y))
    return out


def _is_bad(c: _Cell, domain_of: Mapping[str, str]) -> bool:
    if len(c.bad) < MIN_FAILING or c.fraction < THROUGH_FRACTION:
        return False
    touched: dict[str, set[str]] = {}
    for x, y in c.bad:
        touched.setdefault(domain_of[x], set()).add(x)
        touched.setdefault(domain_of[y], set()).add(y)
    return all(len(touched.get(d, ())) >= min(2, len(nodes)) for d, nodes in c.nodes.items())


def _around(cells: Mapping[Pair, _Cell], through: set[Pair], near: set[str]) -> tuple[int, int]:
    """(failing, paths) of the cells not in `through` with a domain in `near`; every other
    cell too when `near` is empty."""
    failing = paths = 0
    for key, c in cells.items():
        if key in through or (near and not near.intersection(key)):
            continue
        failing += len(c.bad)
        paths += c.paths
    return failing, paths


def _suspect(
    kind: LinkKind,
    a: str,
    b: str | None,
    through: list[_Cell],
    around: tuple[int, int],
    bad_checks: Mapping[Pair, set[str]],
) -> LinkSuspect | None:
    failing_around, paths_around = around
    if not paths_around or failing_around / paths_around > AROUND_FRACTION:
        return None
    failing = sum(len(c.bad) for c in through)
    paths = sum(c.paths for c in through)
    checks: set[str] = set()
    for c in through:
        for pair in c.bad:
            checks |= bad_checks.get(pair, set())
    confidence = (failing / paths) * (1 - failing_around / paths_around)
    return LinkSuspect(
        kind=kind,
        a=a,
        b=b,
        failing_paths=failing,
        paths=paths,
        failing_around=failing_around,
        paths_around=paths_around,
        checks=sorted(checks)[:MAX_SUSPECT_CHECKS],
        confidence=round(min(1.0, max(0.0, confidence)), 3),
    )


def localize(
    cells: Mapping[Pair, Mapping[Pair, bool]],
    bad_checks: Mapping[Pair, set[str]],
    domain_of: Mapping[str, str],
    *,
    limit: int = MAX_LINK_SUSPECTS,
) -> tuple[list[LinkSuspect], set[Pair]]:
    """The suspect links (worst first, at most `limit`) and the failing node pairs they
    explain. `cells`: per domain pair (the smaller first) its node pairs with a path result
    (True: one failed); `bad_checks`: per failing node pair the checks that failed."""
    stats = _cells(cells, domain_of)
    # nodes without a domain label share no uplink: their cells name no link
    bad = {
        key
        for key, c in stats.items()
        if key[0] != key[1] and UNASSIGNED not in key and _is_bad(c, domain_of)
    }
    found: list[tuple[LinkSuspect, list[Pair]]] = []  # with the domain pairs it covers
    for d in sorted({d for key in stats for d in key}):
        mine = [key for key in stats if key[0] != key[1] and d in key]
        if d == UNASSIGNED or len(mine) < MIN_CELLS or not all(key in bad for key in mine):
            continue
        # around an uplink: every path that does not leave or enter d
        suspect = _suspect(LinkKind.UPLINK, d, None, [stats[k] for k in mine],
                           _around(stats, set(mine), set()), bad_checks)  # fmt: skip
        if suspect is not None:
            found.append((suspect, mine))
            bad.difference_update(mine)
    for a, b in sorted(bad):
        # around the pair: inside a and b, and a or b to a third domain (their uplinks)
        suspect = _suspect(LinkKind.DOMAIN_PAIR, a, b, [stats[(a, b)]],
                           _around(stats, {(a, b)}, {a, b}), bad_checks)  # fmt: skip
        if suspect is not None:
            found.append((suspect, [(a, b)]))
    found.sort(key=lambda f: (-f[0].confidence, -f[0].failing_paths, f[0].a, f[0].b or ""))
    kept = found[:limit]
    explained = {pair for _, keys in kept for key in keys for pair in stats[key].bad}
    return [s for s, _ in kept], explained


def observers(
    bad_pairs: Mapping[Pair, object],
    by_link: set[Pair],
    by_node: Mapping[Pair, str],
) -> frozenset[str]:
    """The nodes whose failing node pairs are all explained by a suspect that is not them:
    a suspect link (both ends observe) or a suspect node (the other end observes)."""
    seen: set[str] = set()
    blamed: set[str] = set(by_node.values())
    unexplained: set[str] = set()
    for pair in bad_pairs:
        culprit = by_node.get(pair)
        for node in pair:
            seen.add(node)
            if pair in by_link or (culprit is not None and culprit != node):
                continue
            unexplained.add(node)
    return frozenset(seen - unexplained - blamed)


def suspect_nodes(
    edges: Iterable[Pair],
    bad_edges: Mapping[Pair, set[str]],
    domain_of: Mapping[str, str],
    limit: int,
    intra_ok: Collection[str] = (),
) -> tuple[list[Suspect], dict[Pair, str], int]:
    """Suspects from every node pair with a path result and the failing ones (with checks);
    the failing pairs each suspect explains (-> the suspect); the unexplained count.
    `intra_ok`: the nodes with a passing path inside their own domain. Such a node whose
    failing paths all leave its domain is no suspect: every path of a node crosses its
    port, so a passing one clears the port, and the failing ones point at the way out (the
    first failing cross paths of an uplink fault, before its cell fails as a whole)."""
    # Only bad edges are walked; of the others only the count per node matters: a thousand
    # nodes have tens of thousands of edges, and usually a handful of bad ones.
    degree = Counter(itertools.chain.from_iterable(edges))
    bad_adj: dict[str, set[str]] = {}
    for a, b in bad_edges:
        bad_adj.setdefault(a, set()).add(b)
        bad_adj.setdefault(b, set()).add(a)
    found: list[Suspect] = []
    explained: dict[Pair, str] = {}
    while len(found) < limit:
        candidates: list[tuple[float, int, str]] = []  # (-fraction, -bad, node): min is worst
        for node, failed in bad_adj.items():
            if len(failed) < SUSPECT_MIN_BAD:
                continue
            if node in intra_ok:
                home = domain_of.get(node)
                if all(domain_of.get(p) != home for p in failed):
                    continue
            fraction = len(failed) / degree[node]
            if fraction < SUSPECT_MIN_FRACTION:
                continue
            # the share of bad edges of each bad peer without its (bad) edge to this node
            elsewhere = [(len(bad_adj[p]) - 1) / (degree[p] - 1) for p in failed if degree[p] > 1]
            if not elsewhere:
                continue  # nobody else to compare with: cannot tell the node from the path
            if statistics.median(elsewhere) >= min(PEERS_OK_FRACTION, fraction / 2):
                continue
            candidates.append((-fraction, -len(failed), node))
        if not candidates:
            break
        worst_fraction, _, node = min(candidates)
        bad_peers = sorted(bad_adj.pop(node))
        checks: set[str] = set()
        elsewhere = [(len(bad_adj[p]) - 1) / (degree[p] - 1) for p in bad_peers if degree[p] > 1]
        for p in bad_peers:
            pair = (min(node, p), max(node, p))
            checks |= bad_edges[pair]
            explained[pair] = node
            # only its bad edges go with it: its good peers keep counting their edge to it
            bad_adj[p].discard(node)
            degree[p] -= 1
        found.append(
            Suspect(
                node=node,
                domain=domain_of.get(node, UNASSIGNED),
                failing_peers=len(bad_peers),
                peers=degree.pop(node),
                checks=sorted(checks)[:MAX_SUSPECT_CHECKS],
                # its own share of failing peers, times how clean those peers are elsewhere
                confidence=round(-worst_fraction * (1 - statistics.median(elsewhere)), 3),
            )
        )
    unexplained = sum(len(peers) for peers in bad_adj.values()) // 2
    return found, explained, unexplained


__all__ = ["localize", "observers", "suspect_nodes"]
