"""`status.topology.domainPairs` read for people, shared by `netval status NAME --topology`
(the "measured between domains" lines) and the HTML report's topology section: per domain
pair of the east-west level, the capacity ratio of lone flows (continuous samples), the
oversubscription under load (the latest NetworkLoadTest run), idle and loaded p99, loss.

Pure. Domain names are node-label values and the figures may be anything a status can hold
(huge, negative, not finite): names are made printable and cut, figures go through the
load-test formatters, which never raise and stay a few characters wide.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final

from netval.cli.loadtest_format import figure, millis, ratio
from netval.cli.status_view import printable
from netval.model.topology import DomainPair, TopologyStatus

DOMAIN_WIDTH: Final = 24  # a domain name in a row; longer ones are cut in the middle
_FIGURES: Final = ("PAIRS", "CAPACITY", "UNDER-LOAD", "P99-IDLE", "P99-LOADED", "LOSS%")


def percent(value: float | None) -> str:
    return figure(value, lambda v: f"{v:.2f}")


def load_source(topo: TopologyStatus) -> tuple[str, str | None] | None:
    """(NetworkLoadTest name, run id) the load figures come from ("<test>/<run id>"; a
    load-test name holds no "/"), None without a load test."""
    if topo.load_test is None:
        return None
    name, sep, run = topo.load_test.partition("/")
    return name, run if sep else None


def load_sentence(topo: TopologyStatus, limit: int = 63) -> str | None:
    """The sentence naming the load test and run (printable, each part cut to `limit`):
    NetworkLoadTest NAME, run RUN; None without a load test."""
    source = load_source(topo)
    if source is None:
        return None
    name, run = source
    tail = f", run {printable(run, limit)}" if run is not None else ""
    return f"NetworkLoadTest {printable(name, limit)}{tail}"


def severity(pair: DomainPair) -> float:
    """The larger of capacity ratio and oversubscription, as the operator ranks pairs;
    a value that is not a number counts as nothing, infinity as the worst."""
    return max(_finite_or_inf(pair.capacity_ratio), _finite_or_inf(pair.oversubscription))


def _finite_or_inf(value: float | None) -> float:
    if value is None or math.isnan(value):
        return -math.inf
    return value


def worst_index(values: Iterable[float | None]) -> int | None:
    """Index of the largest value above nothing (None and NaN are nothing), first on ties."""
    best: tuple[float, int] | None = None
    for i, value in enumerate(values):
        rank = _finite_or_inf(value)
        if rank > -math.inf and (best is None or rank > best[0]):
            best = (rank, i)
    return None if best is None else best[1]


def pair_lines(topo: TopologyStatus) -> list[str]:
    """The text section, indented for `render_topology`; [] when nothing was measured."""
    if not topo.domain_pairs and not topo.omitted_pairs:
        return []
    key = f" of {printable(topo.pairs_key, 80)}" if topo.pairs_key else ""
    lines = [f"  measured between domains{key}, worst first:"]
    source = load_sentence(topo)
    lines.append(
        f"    under load: {source}"
        if source is not None
        else "    under load: no NetworkLoadTest run yet (oversubscription needs one)"
    )
    rows = [
        (
            printable(p.a, DOMAIN_WIDTH),
            printable(p.b, DOMAIN_WIDTH),
            str(p.pairs),
            ratio(p.capacity_ratio),
            ratio(p.oversubscription),
            millis(p.latency_p99_ms),
            millis(p.loaded_latency_p99_ms),
            percent(p.loss_percent),
        )
        for p in topo.domain_pairs
    ]
    if rows:
        heads = ("A", "B", *_FIGURES)
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
        for cells in (heads, *rows):
            names = "  ".join(c.ljust(w) for c, w in zip(cells[:2], widths[:2], strict=True))
            figures = "  ".join(c.rjust(w) for c, w in zip(cells[2:], widths[2:], strict=True))
            lines.append(f"    {names}  {figures}".rstrip())
    if topo.omitted_pairs:
        lines.append(f"    … {topo.omitted_pairs} more pairs not listed (omittedPairs)")
    return lines


__all__ = [
    "DOMAIN_WIDTH",
    "load_sentence",
    "load_source",
    "pair_lines",
    "percent",
    "severity",
    "worst_index",
]
