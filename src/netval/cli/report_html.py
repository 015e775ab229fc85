"""`netval report NAME --html FILE`: one NetworkValidation as a self-contained HTML page.

For people who would rather look than read: the conditions and counts, a latency and a
throughput heatmap per domain pair (from `status.eastWest`), the flagged (oversubscribed)
pairs, the suspect nodes, and the failing nodes and checks (`status.failures`).

- Self-contained: inline CSS, no script, no external asset; a Content-Security-Policy meta
  tag forbids loading anything, so the file can be mailed or archived by CI as it is.
- Colours are computed here, and every coloured cell also shows its numbers (and words such
  as "FLAGGED" or "above max"), so nothing is said by colour alone; text colour is black or
  white, whichever contrasts more with the cell.
- Every string taken from the object (names, reasons, messages, domains, check ids) is
  escaped with `html.escape`: they come from users, node labels and agents.
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from netval.cli.status_view import (
    NO_MEASUREMENTS,
    NOT_ENABLED,
    east_west_domains,
    fmt_mbps,
    fmt_ms,
    fmt_percent,
    fmt_ratio,
    parse_east_west,
    parse_status,
    peers_enabled,
)
from netval.model.east_west import Cell, EastWest
from netval.model.spec import PeerChecks
from netval.model.status import ConditionType, NetworkValidationStatus

Rgb = tuple[int, int, int]

# Sequential scales, light to dark (ColorBrewer YlOrRd and Blues, colour-blind safe).
LATENCY_SCALE: Final[tuple[Rgb, ...]] = (
    (255, 255, 204),
    (254, 217, 118),
    (253, 141, 60),
    (227, 26, 28),
    (128, 0, 38),
)
THROUGHPUT_SCALE: Final[tuple[Rgb, ...]] = (
    (247, 251, 255),
    (198, 219, 239),
    (107, 174, 214),
    (33, 113, 181),
    (8, 48, 107),
)
_LEGEND_STEPS: Final = 5

_CSS: Final = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5rem;
color:#1a1a1a;background:#fff;line-height:1.4}
h1{font-size:1.5rem;margin:0 0 .25rem}h2{font-size:1.2rem;margin-top:2rem;
border-bottom:1px solid #ccc}h3{font-size:1rem;margin-top:1.25rem}
.meta{color:#444;margin:0}
table{border-collapse:collapse;margin:.5rem 0}
th,td{border:1px solid #bbb;padding:.3rem .5rem;text-align:left;vertical-align:top}
th{background:#f0f0f0}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.scroll{overflow-x:auto;max-width:100%}
table.heat td{min-width:7.5rem;text-align:center;font-variant-numeric:tabular-nums}
table.heat td.none{color:#555;background:#fafafa;font-style:italic}
table.heat .v{display:block;font-size:1.05rem;font-weight:600}
table.heat .s{display:block;font-size:.8rem}
table.heat td.flagged{outline:3px solid #000;outline-offset:-4px}
.flag,.bad{font-weight:700}
.ok{color:#1b5e20}.notok{color:#b71c1c;font-weight:600}
.legend{display:flex;flex-wrap:wrap;gap:0;margin:.25rem 0 1rem;font-size:.8rem}
.legend span{padding:.15rem .5rem;border:1px solid #bbb}
caption{caption-side:top;text-align:left;font-weight:600;padding:.25rem 0}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _iso(when: datetime | None) -> str:
    if when is None:
        return "never"
    return when.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# -- colours ------------------------------------------------------------------------------------


def scale_colour(t: float, scale: Sequence[Rgb]) -> Rgb:
    """Linear interpolation along `scale` for t in [0, 1] (clipped)."""
    t = min(1.0, max(0.0, t))
    pos = t * (len(scale) - 1)
    i = min(int(pos), len(scale) - 2)
    frac = pos - i
    lo, hi = scale[i], scale[i + 1]
    r, g, b = (round(lo[k] + (hi[k] - lo[k]) * frac) for k in range(3))
    return (r, g, b)


def _luminance(rgb: Rgb) -> float:
    """WCAG 2 relative luminance."""

    def channel(c: int) -> float:
        s = c / 255
        return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def text_colour(background: Rgb) -> str:
    """Black or white, whichever contrasts more with `background` (WCAG contrast ratio)."""
    lum = _luminance(background)
    on_black = (lum + 0.05) / 0.05
    on_white = 1.05 / (lum + 0.05)
    return "#000000" if on_black >= on_white else "#ffffff"


def _style(rgb: Rgb) -> str:
    return f"background:#{rgb[0]:02x}{rgb[1]:02x}{rgb[2]:02x};color:{text_colour(rgb)}"


def _legend(label: str, scale: Sequence[Rgb], ticks: Sequence[str]) -> str:
    steps = len(ticks)
    swatches = "".join(
        f'<span style="{_style(scale_colour(i / (steps - 1), scale))}">{_e(tick)}</span>'
        for i, tick in enumerate(ticks)
    )
    return f'<div class="legend" role="note"><span>{_e(label)}</span>{swatches}</div>'


# -- the east-west heatmaps -------------------------------------------------------------------


def _max_latency_ms(obj: Mapping[str, Any]) -> float:
    spec = obj.get("spec")
    checks = spec.get("checks") if isinstance(spec, Mapping) else None
    peers = checks.get("peers") if isinstance(checks, Mapping) else None
    value = peers.get("maxLatencyMs") if isinstance(peers, Mapping) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return PeerChecks().max_latency_ms


def _latency_cell(cell: Cell | None, limit: float) -> str:
    if cell is None or cell.latency_p50_ms is None:
        return '<td class="none">not measured</td>' if cell is None else _no_latency(cell)
    p50 = cell.latency_p50_ms
    parts = [f'<span class="v">{_e(fmt_ms(p50))} ms</span>']
    if p50 > limit:
        parts.append(f'<span class="s bad">above max {_e(f"{limit:g}")} ms</span>')
    parts.append(
        f'<span class="s">p99 {_e(fmt_ms(cell.latency_p99_ms))} ms · loss '
        f"{_e(fmt_percent(cell.loss_percent))}%</span>"
    )
    if cell.path_mtu is not None:
        parts.append(f'<span class="s">path MTU {cell.path_mtu}</span>')
    parts.append(_pairs_line(cell))
    return f'<td style="{_style(scale_colour(p50 / limit, LATENCY_SCALE))}">{"".join(parts)}</td>'


def _no_latency(cell: Cell) -> str:
    return f'<td class="none">no latency measured{_pairs_line(cell)}</td>'


def _pairs_line(cell: Cell) -> str:
    text = f"{cell.pairs} node pair(s)"
    if cell.failing:
        text += f' · <span class="bad">{cell.failing} failing</span>'
    return f'<span class="s">{text}</span>'


def _throughput_cell(cell: Cell | None, best: float) -> str:
    if cell is None:
        return '<td class="none">not measured</td>'
    if cell.throughput_mbps is None:
        return f'<td class="none">no throughput sample<span class="s">{cell.pairs} node pair(s)</span></td>'
    mbps = cell.throughput_mbps
    parts = [
        f'<span class="v">{_e(fmt_mbps(mbps))} Mbit/s</span>',
        f'<span class="s">{cell.throughput_samples} sample(s)</span>',
    ]
    if cell.intra:
        parts.append('<span class="s">intra-domain</span>')
    elif cell.throughput_ratio is not None:
        parts.append(
            f'<span class="s">ratio {_e(f"{cell.throughput_ratio:g}")} · '
            f"{_e(fmt_ratio(cell.oversubscription))}</span>"
        )
    else:
        parts.append('<span class="s">no intra-domain baseline</span>')
    classes = ""
    if cell.flagged:
        parts.append('<span class="s flag">FLAGGED: oversubscribed</span>')
        classes = ' class="flagged"'
    style = _style(scale_colour(mbps / best if best > 0 else 0.0, THROUGHPUT_SCALE))
    return f'<td{classes} style="{style}">{"".join(parts)}</td>'


def _heatmap(
    ew: EastWest,
    domains: list[str],
    caption: str,
    table_id: str,
    cell_html: Callable[[Cell | None], str],
) -> str:
    head = "".join(f'<th scope="col">{_e(d)}</th>' for d in domains)
    rows = []
    for a in domains:
        cells = "".join(cell_html(ew.cell(a, b)) for b in domains)
        rows.append(f'<tr><th scope="row">{_e(a)}</th>{cells}</tr>')
    return (
        f'<div class="scroll"><table class="heat" id="{table_id}">'
        f"<caption>{_e(caption)}</caption>"
        f'<thead><tr><th scope="col">domain</th>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _east_west_section(obj: Mapping[str, Any]) -> str:
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
        out.append(f"<p>{_e(message)}</p></section>")
        return "".join(out)
    out.append(
        f'<p class="meta">{ew.domains} domain(s), {ew.nodes} node(s); pairs flagged when '
        "cross-domain throughput is below "
        f"{_e(f'{ew.min_throughput_ratio:g}')} of the intra-domain median "
        "(minThroughputRatio).</p>"
    )
    if not peers_enabled(obj):
        out.append(
            "<p>spec.checks.peers.enabled is not true: this summary may be left from before.</p>"
        )
    domains = east_west_domains(ew)
    if not domains:
        out.append(f"<p>{_e(NO_MEASUREMENTS)}</p></section>")
        return "".join(out)
    limit = _max_latency_ms(obj)
    out.append("<h3>Latency per domain pair</h3>")
    out.append(
        "<p>Median over the node pairs of their p50 round trip, coloured against "
        f"peers.maxLatencyMs ({_e(f'{limit:g}')} ms).</p>"
    )
    ticks = [f"{fmt_ms(limit * i / (_LEGEND_STEPS - 1))} ms" for i in range(_LEGEND_STEPS)]
    ticks[-1] = f"≥ {ticks[-1]}"
    out.append(_legend("p50 round trip:", LATENCY_SCALE, ticks))
    out.append(
        _heatmap(
            ew,
            domains,
            "Latency heatmap: median p50 round trip (ms), p99, loss (%), path MTU",
            "latency-heatmap",
            lambda c: _latency_cell(c, limit),
        )
    )
    best = max((c.throughput_mbps or 0.0 for c in ew.cells), default=0.0)
    out.append("<h3>Throughput per domain pair</h3>")
    out.append(
        "<p>Median of the TCP samples between the two domains (Mbit/s), coloured against the "
        "best cell; for cross-domain pairs the ratio to the intra-domain median and the "
        "oversubscription it means (4.0:1: a quarter of the intra-domain throughput).</p>"
    )
    ticks = [f"{fmt_mbps(best * i / (_LEGEND_STEPS - 1))} Mbit/s" for i in range(_LEGEND_STEPS)]
    out.append(_legend("throughput:", THROUGHPUT_SCALE, ticks))
    out.append(
        _heatmap(
            ew,
            domains,
            "Throughput heatmap: median throughput (Mbit/s), cross/intra ratio, oversubscription",
            "throughput-heatmap",
            lambda c: _throughput_cell(c, best),
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
    title = "<h3>Flagged pairs (oversubscription)</h3>"
    if not ew.flagged:
        return f"{title}<p>None.</p>"
    rows = []
    for f in ew.flagged:
        cell = ew.cell(f.a, f.b)
        cross = fmt_mbps(cell.throughput_mbps) if cell is not None else "-"
        rows.append(
            f"<tr><td>{_e(f.a)}</td><td>{_e(f.b)}</td><td class='num'>{_e(cross)}</td>"
            f"<td class='num'>{_e(f'{f.throughput_ratio:g}')}</td>"
            f"<td class='num'>{_e(fmt_ratio(f.oversubscription))}</td></tr>"
        )
    return (
        f"{title}<table><thead><tr><th scope='col'>domain</th><th scope='col'>domain</th>"
        "<th scope='col'>cross Mbit/s</th><th scope='col'>cross/intra ratio</th>"
        f"<th scope='col'>oversubscription</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _suspects_table(ew: EastWest) -> str:
    title = "<h3>Suspect nodes</h3>"
    intro = "<p>Nodes whose probes fail to many peers while those peers pass with others.</p>"
    summary = (
        f"<p>Failing node pairs: {ew.failing_pairs}, of which "
        f"{ew.unexplained_failing_pairs} not explained by a suspect.</p>"
    )
    if not ew.suspects:
        return f"{title}{intro}<p>None.</p>{summary}"
    rows = "".join(
        f"<tr><td>{_e(s.node)}</td><td>{_e(s.domain)}</td>"
        f"<td class='num'>{s.failing_peers} of {s.peers}</td>"
        f"<td>{_e(', '.join(s.checks))}</td></tr>"
        for s in ew.suspects
    )
    return (
        f"{title}{intro}<table><thead><tr><th scope='col'>node</th><th scope='col'>domain</th>"
        "<th scope='col'>failing peers</th><th scope='col'>checks</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>{summary}"
    )


# -- conditions, counts, failures -------------------------------------------------------------


def _conditions_section(status: NetworkValidationStatus) -> str:
    rows = []
    for kind in ConditionType:
        c = status.condition(kind)
        if c is None:
            if kind is not ConditionType.GATING:
                rows.append(f"<tr><th scope='row'>{_e(kind.value)}</th><td colspan='4'>-</td></tr>")
            continue
        css = "ok" if c.status == "True" else "notok"
        rows.append(
            f"<tr><th scope='row'>{_e(c.type.value)}</th><td class='{css}'>{_e(c.status)}</td>"
            f"<td>{_e(c.reason)}</td><td>{_e(c.message)}</td>"
            f"<td>{_e(_iso(c.last_transition_time))}</td></tr>"
        )
    return (
        '<section id="conditions"><h2>Conditions</h2><table><thead><tr>'
        "<th scope='col'>type</th><th scope='col'>status</th><th scope='col'>reason</th>"
        "<th scope='col'>message</th><th scope='col'>since</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></section>"
    )


def _counts_section(status: NetworkValidationStatus) -> str:
    n = status.nodes
    nodes = "".join(
        f"<td class='num'>{value}</td>"
        for value in (n.targeted, n.reporting, n.passing, n.warning, n.failing, n.stale)
    )
    heads = "".join(
        f"<th scope='col'>{h}</th>"
        for h in ("targeted", "reporting", "passing", "warning", "failing", "stale")
    )
    checks = sorted(status.checks.items(), key=lambda item: (-item[1].fail, -item[1].warn, item[0]))
    check_rows = "".join(
        f"<tr><th scope='row'>{_e(check)}</th><td class='num'>{c.pass_}</td>"
        f"<td class='num'>{c.warn}</td>"
        f"<td class='num{' notok' if c.fail else ''}'>{c.fail}</td></tr>"
        for check, c in checks
    )
    checks_table = (
        "<table><caption>Nodes per check and result</caption><thead><tr>"
        "<th scope='col'>check</th><th scope='col'>pass</th><th scope='col'>warn</th>"
        f"<th scope='col'>fail</th></tr></thead><tbody>{check_rows}</tbody></table>"
        if checks
        else "<p>No check results yet.</p>"
    )
    return (
        '<section id="counts"><h2>Nodes and checks</h2>'
        f"<table><caption>Nodes</caption><thead><tr>{heads}</tr></thead>"
        f"<tbody><tr>{nodes}</tr></tbody></table>{checks_table}</section>"
    )


def _failures_section(status: NetworkValidationStatus) -> str:
    out = ['<section id="failures"><h2>Failing nodes and checks</h2>']
    if not status.failures:
        out.append("<p>No failures.</p></section>")
        return "".join(out)
    by_node: dict[str, list[str]] = defaultdict(list)
    for f in status.failures:
        by_node[f.node].append(f.check)
    items = "".join(
        f"<li><strong>{_e(node)}</strong>: {_e(', '.join(dict.fromkeys(checks)))}</li>"
        for node, checks in sorted(by_node.items())
    )
    out.append(f"<h3>Failing nodes</h3><ul>{items}</ul>")
    rows = "".join(
        f"<tr><td>{_e(f.node)}</td><td>{_e(f.check)}</td><td>{_e(f.subject)}</td>"
        f"<td>{_e(_iso(f.since))}</td><td>{_e(f.message)}</td></tr>"
        for f in status.failures
    )
    out.append(
        "<h3>Failures (longest-standing first)</h3><div class='scroll'><table><thead><tr>"
        "<th scope='col'>node</th><th scope='col'>check</th><th scope='col'>subject</th>"
        "<th scope='col'>since</th><th scope='col'>message</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div></section>"
    )
    return "".join(out)


# -- the page ---------------------------------------------------------------------------------


def render_html(obj: Mapping[str, Any], *, now: datetime | None = None) -> str:
    """The report page of one NetworkValidation object (as the API returns it)."""
    now = now or datetime.now(UTC)
    metadata = obj.get("metadata")
    meta: Mapping[str, Any] = metadata if isinstance(metadata, Mapping) else {}
    name = str(meta.get("name", "?"))
    generation = meta.get("generation")
    status = parse_status(obj)
    body = [
        f"<header><h1>NetworkValidation {_e(name)}</h1>",
        f'<p class="meta">generation {_e(generation if generation is not None else "?")} · '
        f"report written {_e(_iso(now))}",
    ]
    if status is None:
        body.append("</p></header>")
        body.append(
            '<section id="conditions"><h2>Conditions</h2>'
            "<p>No status yet (is the operator running?)</p></section>"
        )
    else:
        body.append(
            f" · status for generation {status.observed_generation} · last report "
            f"{_e(_iso(status.last_report_time))}</p>"
        )
        if status.observed_generation != generation:
            body.append(
                "<p><strong>The operator has not caught up with this generation.</strong></p>"
            )
        body.append("</header>")
        body.append(_conditions_section(status))
        body.append(_counts_section(status))
    body.append(_east_west_section(obj))
    if status is not None:
        body.append(_failures_section(status))
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>netval: {_e(name)}</title><style>{_CSS}</style></head>\n"
        f"<body>{''.join(body)}</body></html>\n"
    )
