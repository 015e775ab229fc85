"""The east-west part of the HTML report: a latency and a throughput heatmap per domain pair
(from `status.eastWest`), the flagged pairs (low capacity ratio) and the suspect nodes.

Latency is coloured on a log2 scale relative to the intra-domain median (1x, 2x, 4x, ...),
throughput relative to the intra-domain median; each heatmap has a legend with the reference
value, and every coloured cell also shows its numbers and words ("FLAGGED", "above max"), so
nothing is said by colour alone.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from typing import Any

from netval.cli.report_html_format import (
    LATENCY_SCALE,
    LEGEND_STEPS,
    THROUGHPUT_SCALE,
    cell_style,
    escape,
    fmt_latency,
    fmt_rate,
    latency_position,
    legend,
    scale_colour,
)
from netval.cli.status_view import (
    NO_MEASUREMENTS,
    NOT_ENABLED,
    east_west_domains,
    fmt_percent,
    fmt_ratio,
    parse_east_west,
    peers_enabled,
)
from netval.model.east_west import Cell, EastWest, LinkKind
from netval.model.spec import PeerChecks

# -- the east-west heatmaps -------------------------------------------------------------------


def _max_latency_ms(obj: Mapping[str, Any]) -> float:
    spec = obj.get("spec")
    checks = spec.get("checks") if isinstance(spec, Mapping) else None
    peers = checks.get("peers") if isinstance(checks, Mapping) else None
    value = peers.get("maxLatencyMs") if isinstance(peers, Mapping) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return PeerChecks().max_latency_ms


def intra_median(ew: EastWest, value: Callable[[Cell], float | None]) -> float | None:
    """The median of `value` over the intra-domain cells (None when there is none): the
    reference the heatmaps colour against; without intra cells, the median of all cells."""
    intra = [v for c in ew.cells if c.intra and (v := value(c)) is not None and v > 0]
    if not intra:
        intra = [v for c in ew.cells if (v := value(c)) is not None and v > 0]
    return statistics.median(intra) if intra else None


def _latency_cell(cell: Cell | None, limit: float, reference: float) -> str:
    if cell is None or cell.latency_p50_ms is None:
        return '<td class="none">not measured</td>' if cell is None else _no_latency(cell)
    p50 = cell.latency_p50_ms
    parts = [f'<span class="v">{escape(fmt_latency(p50))}</span>']
    if reference > 0 and not cell.intra:
        parts.append(f'<span class="s">{escape(f"{p50 / reference:.1f}")}x intra median</span>')
    if p50 > limit:
        parts.append(f'<span class="s bad">above max {escape(fmt_latency(limit))}</span>')
    parts.append(
        f'<span class="s">p99 {escape(fmt_latency(cell.latency_p99_ms))} · loss '
        f"{escape(fmt_percent(cell.loss_percent))}%</span>"
    )
    if cell.path_mtu is not None:
        parts.append(f'<span class="s">path MTU {cell.path_mtu}</span>')
    parts.append(_pairs_line(cell))
    style = cell_style(scale_colour(latency_position(p50, reference), LATENCY_SCALE))
    return f'<td style="{style}">{"".join(parts)}</td>'


def _no_latency(cell: Cell) -> str:
    return f'<td class="none">no latency measured{_pairs_line(cell)}</td>'


def _pairs_line(cell: Cell) -> str:
    text = f"{cell.pairs} node pair(s)"
    if cell.failing:
        text += f' · <span class="bad">{cell.failing} failing</span>'
    return f'<span class="s">{text}</span>'


def _throughput_cell(cell: Cell | None, reference: float) -> str:
    if cell is None:
        return '<td class="none">not measured</td>'
    if cell.throughput_mbps is None:
        return f'<td class="none">no throughput sample<span class="s">{cell.pairs} node pair(s)</span></td>'
    mbps = cell.throughput_mbps
    parts = [
        f'<span class="v">{escape(fmt_rate(mbps))}</span>',
        f'<span class="s">{cell.throughput_samples} sample(s)</span>',
    ]
    if cell.intra:
        parts.append('<span class="s">intra-domain</span>')
    elif cell.throughput_ratio is not None:
        parts.append(
            f'<span class="s">ratio {escape(f"{cell.throughput_ratio:.2f}")} · '
            f"capacity {escape(fmt_ratio(cell.capacity_ratio))}</span>"
        )
    else:
        parts.append('<span class="s">no intra-domain baseline</span>')
    classes = ""
    if cell.flagged:
        parts.append('<span class="s flag">FLAGGED: low capacity ratio</span>')
        classes = ' class="flagged"'
    style = cell_style(scale_colour(mbps / reference if reference > 0 else 0.0, THROUGHPUT_SCALE))
    return f'<td{classes} style="{style}">{"".join(parts)}</td>'


def _heatmap(
    ew: EastWest,
    domains: list[str],
    caption: str,
    table_id: str,
    cell_html: Callable[[Cell | None], str],
) -> str:
    head = "".join(f'<th scope="col">{escape(d)}</th>' for d in domains)
    rows = []
    for a in domains:
        cells = "".join(cell_html(ew.cell(a, b)) for b in domains)
        rows.append(f'<tr><th scope="row">{escape(a)}</th>{cells}</tr>')
    return (
        f'<div class="scroll"><table class="heat" id="{table_id}">'
        f"<caption>{escape(caption)}</caption>"
        f'<thead><tr><th scope="col">domain</th>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def east_west_section(obj: Mapping[str, Any]) -> str:
    ew, problem = parse_east_west(obj)
    out = ['<section id="east-west"><h2>East-west</h2>']
    if ew is None:
        if problem is not None:
            message = problem
        elif peers_enabled(obj):
            message = (
                "East-west probing is enabled but there is no summary yet: the operator "
                "writes status.eastWest once agents report."
            )
        else:
            message = NOT_ENABLED
        out.append(f"<p>{escape(message)}</p></section>")
        return "".join(out)
    out.append(
        f'<p class="meta">{ew.domains} domain(s), {ew.nodes} node(s); pairs flagged when '
        "cross-domain throughput is below "
        f"{escape(f'{ew.min_throughput_ratio:g}')} of the intra-domain median "
        "(minThroughputRatio).</p>"
    )
    if not peers_enabled(obj):
        out.append(
            "<p>spec.checks.peers.enabled is not true: this summary may be left from before.</p>"
        )
    domains = east_west_domains(ew)
    if not domains:
        out.append(f"<p>{escape(NO_MEASUREMENTS)}</p></section>")
        return "".join(out)
    limit = _max_latency_ms(obj)
    lat_ref = intra_median(ew, lambda c: c.latency_p50_ms) or limit
    out.append("<h3>Latency per domain pair</h3>")
    out.append(
        "<p>Median over the node pairs of their p50 round trip. Coloured on a log scale "
        f"against the intra-domain median ({escape(fmt_latency(lat_ref))}): each step doubles it. "
        f"Cells above peers.maxLatencyMs ({escape(fmt_latency(limit))}) say so.</p>"
    )
    ticks = [f"{2**i:g}x · {fmt_latency(lat_ref * 2**i)}" for i in range(LEGEND_STEPS)]
    ticks[0] = f"≤ {ticks[0]}"
    ticks[-1] = f"≥ {ticks[-1]}"
    out.append(legend("p50 vs intra-domain median:", LATENCY_SCALE, ticks))
    out.append(
        _heatmap(
            ew,
            domains,
            "Latency heatmap: median p50 round trip, p99, loss (%), path MTU",
            "latency-heatmap",
            lambda c: _latency_cell(c, limit, lat_ref),
        )
    )
    tp_ref = intra_median(ew, lambda c: c.throughput_mbps) or 0.0
    out.append("<h3>Throughput per domain pair</h3>")
    out.append(
        "<p>Median of the TCP samples between the two domains, coloured against the "
        f"intra-domain median ({escape(fmt_rate(tp_ref))}); for cross-domain pairs the ratio to it "
        "and the capacity ratio it means (4.0:1: a lone cross-domain flow gets a quarter of the "
        "intra-domain throughput). Single flows taken one at a time show a narrow path, not "
        "oversubscription: a NetworkLoadTest measures that, with every node sending at once.</p>"
    )
    ticks = [f"{25 * i}% · {fmt_rate(tp_ref * i / 4)}" for i in range(LEGEND_STEPS)]
    ticks[0] = "0%"
    ticks[-1] = f"≥ {ticks[-1]}"
    out.append(legend("throughput vs intra-domain median:", THROUGHPUT_SCALE, ticks))
    out.append(
        _heatmap(
            ew,
            domains,
            "Throughput heatmap: median throughput, cross/intra ratio, capacity ratio",
            "throughput-heatmap",
            lambda c: _throughput_cell(c, tp_ref),
        )
    )
    if ew.omitted_cells:
        out.append(
            f"<p>{ew.omitted_cells} more domain pair(s) are not in the status (it keeps "
            f"{len(ew.cells)}: flagged and failing pairs first).</p>"
        )
    out.append(_flagged_table(ew))
    out.append(_suspects_table(ew))
    out.append("</section>")
    return "".join(out)


def _flagged_table(ew: EastWest) -> str:
    title = "<h3>Flagged pairs (capacity ratio)</h3>"
    if not ew.flagged:
        return f"{title}<p>None.</p>"
    rows = []
    for f in ew.flagged:
        cell = ew.cell(f.a, f.b)
        cross = fmt_rate(cell.throughput_mbps) if cell is not None else "-"
        rows.append(
            f"<tr><td>{escape(f.a)}</td><td>{escape(f.b)}</td><td class='num'>{escape(cross)}</td>"
            f"<td class='num'>{escape(f'{f.throughput_ratio:g}')}</td>"
            f"<td class='num'>{escape(fmt_ratio(f.capacity_ratio))}</td></tr>"
        )
    return (
        f"{title}<table><thead><tr><th scope='col'>domain</th><th scope='col'>domain</th>"
        "<th scope='col'>cross throughput</th><th scope='col'>cross/intra ratio</th>"
        f"<th scope='col'>capacity ratio</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _link_name(kind: LinkKind, a: str, b: str | None) -> str:
    return f"uplink of {a}" if kind is LinkKind.UPLINK else f"{a} <-> {b}"


def _suspects_table(ew: EastWest) -> str:
    title = "<h3>Suspect nodes</h3>"
    intro = "<p>Nodes whose probes fail to many peers while those peers pass with others.</p>"
    summary = (
        f"<p>Failing node pairs: {ew.failing_pairs}, of which "
        f"{ew.unexplained_failing_pairs} not explained by a suspect.</p>"
    )
    links = "".join(
        f"<p>Suspect link: {escape(_link_name(x.kind, x.a, x.b))}: {x.failing_paths} of "
        f"{x.paths} node pairs through it fail ({escape(', '.join(x.checks))}), "
        f"{x.failing_around} of {x.paths_around} around it, confidence {x.confidence:g}.</p>"
        for x in ew.link_suspects
    )
    summary = links + summary
    if not ew.suspects:
        return f"{title}{intro}<p>None.</p>{summary}"
    rows = "".join(
        f"<tr><td>{escape(s.node)}</td><td>{escape(s.domain)}</td>"
        f"<td class='num'>{s.failing_peers} of {s.peers}</td>"
        f"<td>{escape(', '.join(s.checks))}</td></tr>"
        for s in ew.suspects
    )
    return (
        f"{title}{intro}<table><thead><tr><th scope='col'>node</th><th scope='col'>domain</th>"
        "<th scope='col'>failing peers</th><th scope='col'>checks</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>{summary}"
    )


# -- the verdict ----------------------------------------------------------------------------------
