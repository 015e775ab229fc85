"""`status.topology.domainPairs` (pure): per cross-domain pair of the east-west level, the
latest measured figures. From the continuous samples (`status.eastWest`'s cells: the
path-capacity ratio of lone flows, latency, loss) and, when a NetworkLoadTest has run for
the validation, from its last run (oversubscription with every node sending at once, loaded
latency; of the worst rail plane, cells without a ratio or partial left out). Aggregates only: one entry per domain pair, never per node pair, at most
MAX_DOMAIN_PAIRS, worst first (the largest of capacity ratio and oversubscription).
"""

from __future__ import annotations

from collections.abc import Iterable

from netval.model.east_west import EastWest
from netval.model.loadtest import LoadCell
from netval.model.topology import MAX_DOMAIN_PAIRS, DomainPair


def domain_pairs(
    east_west: EastWest | None, load: Iterable[LoadCell] = ()
) -> tuple[list[DomainPair], int]:
    """(the listed pairs, how many more were left out)."""
    found: dict[tuple[str, str], DomainPair] = {}
    for cell in east_west.cells if east_west is not None else ():
        if cell.a != cell.b:
            found[_key(cell.a, cell.b)] = DomainPair(
                a=min(cell.a, cell.b),
                b=max(cell.a, cell.b),
                pairs=cell.pairs,
                capacity_ratio=cell.capacity_ratio,
                latency_p99_ms=cell.latency_p99_ms,
                loss_percent=cell.loss_percent,
            )
    worst: dict[tuple[str, str], LoadCell] = {}  # per pair, its worst rail plane
    for loaded in load:
        if loaded.a == loaded.b or loaded.oversubscription is None or loaded.reason is not None:
            continue
        key = _key(loaded.a, loaded.b)
        have = worst.get(key)
        if have is None or (have.oversubscription or 0.0) < loaded.oversubscription:
            worst[key] = loaded
    for key, loaded in worst.items():
        base = found.get(key) or DomainPair(a=key[0], b=key[1])
        found[key] = base.model_copy(
            update={
                "oversubscription": loaded.oversubscription,
                "loaded_latency_p99_ms": loaded.loaded_latency_p99_ms,
            }
        )
    ranked = sorted(found.values(), key=_severity)
    return ranked[:MAX_DOMAIN_PAIRS], max(0, len(ranked) - MAX_DOMAIN_PAIRS)


def _key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


def _severity(pair: DomainPair) -> tuple[float, str, str]:
    worst = max(pair.capacity_ratio or 0.0, pair.oversubscription or 0.0)
    return (-worst, pair.a, pair.b)


__all__ = ["domain_pairs"]
