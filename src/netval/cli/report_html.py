"""`netval report NAME --html FILE`: one NetworkValidation as a self-contained HTML page.

Read top-down, most actionable first: a verdict banner (Healthy or not, why, which nodes,
what to do), the failing nodes and checks (`status.failures`), the conditions and counts,
then the east-west detail: a latency and a throughput heatmap per domain pair (from
`status.eastWest`), the flagged (oversubscribed) pairs and the suspect nodes.

- Heatmap colours show structure: latency on a log2 scale relative to the intra-domain median
  (1x, 2x, 4x, ... the median), throughput relative to the intra-domain median; each has a
  legend with the reference value. Units are human (µs/ms, Mbit/s/Gbit/s) and times relative
  to the report (the absolute UTC time on hover).

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
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from netval.cli.status_view import (
    NO_MEASUREMENTS,
    NOT_ENABLED,
    east_west_domains,
    fmt_percent,
    fmt_ratio,
    parse_east_west,
    parse_status,
    peers_enabled,
    stale_reasons,
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
LATENCY_OCTAVES: Final = 4  # the latency scale spans 1x .. 2**4 = 16x the intra-domain median
_LEGEND_STEPS: Final = 5
MAX_NODES_IN_BANNER: Final = 12

_CSS: Final = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5rem;
color:#1a1a1a;background:#fff;line-height:1.4;max-width:110rem}
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
time{text-decoration:underline dotted;cursor:help}
td.nw{white-space:nowrap}
details summary{cursor:pointer;margin:.5rem 0}
#verdict{border-radius:6px;padding:1rem 1.25rem;margin:1rem 0 1.5rem;border:2px solid}
#verdict h2{margin:0 0 .4rem;border:0;font-size:1.4rem}
#verdict p,#verdict ul{margin:.3rem 0}
#verdict.healthy{background:#e8f5e9;border-color:#2e7d32;color:#1b3d1f}
#verdict.unhealthy{background:#fdecea;border-color:#c62828;color:#4a1010}
#verdict.unknown{background:#fff8e1;border-color:#f9a825;color:#3d3000}
#verdict code{background:rgba(0,0,0,.06);padding:0 .25rem;border-radius:3px}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _iso(when: datetime | None) -> str:
    if when is None:
        return "never"
    return when.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def relative(when: datetime, now: datetime) -> str:
    """ "12 s ago", "7 min ago", "3 h ago", "2 d ago" ("in ..." for a time after now)."""
    seconds = int((now - when).total_seconds())
    future, seconds = seconds < 0, abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            text = f"{seconds // size} {unit}"
            break
    else:
        text = f"{seconds} s"
    return f"in {text}" if future else f"{text} ago"


def _when(when: datetime | None, now: datetime) -> str:
    """A relative time with the absolute UTC one on hover (and machine-readable)."""
    if when is None:
        return "never"
    iso = _iso(when)
    return f'<time datetime="{iso}" title="{iso}">{_e(relative(when, now))}</time>'


# -- units ----------------------------------------------------------------------------------------


def fmt_latency(ms: float | None) -> str:
    """A latency as people read it: 12 µs, 250 µs, 1.25 ms, 14.2 ms."""
    if ms is None:
        return "-"
    if ms < 1:
        us = ms * 1000
        return f"{us:.1f} µs" if us < 10 else f"{us:.0f} µs"
    return f"{ms:.2f} ms" if ms < 10 else f"{ms:.1f} ms"


def fmt_rate(mbps: float | None) -> str:
    """A throughput as people read it: 940 Mbit/s, 377.1 Gbit/s."""
    if mbps is None:
        return "-"
    if mbps >= 1000:
        gbps = mbps / 1000
        return f"{gbps:.1f} Gbit/s" if gbps < 100 else f"{gbps:.0f} Gbit/s"
    return f"{mbps:.1f} Mbit/s" if mbps < 10 else f"{mbps:.0f} Mbit/s"


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


def latency_position(p50: float, reference: float) -> float:
    """Where a latency sits on the log2 scale: 0 at (or below) the reference (the intra-domain
    median), 1 at 2**LATENCY_OCTAVES times it; 0.012 ms and 0.036 ms are 0.4 apart."""
    if reference <= 0 or p50 <= reference:
        return 0.0
    return min(1.0, math.log2(p50 / reference) / LATENCY_OCTAVES)


def _legend(label: str, scale: Sequence[Rgb], ticks: Sequence[str], note: str = "") -> str:
    steps = len(ticks)
    swatches = "".join(
        f'<span style="{_style(scale_colour(i / (steps - 1), scale))}">{_e(tick)}</span>'
        for i, tick in enumerate(ticks)
    )
    extra = f"<span>{_e(note)}</span>" if note else ""
    return f'<div class="legend" role="note"><span>{_e(label)}</span>{swatches}{extra}</div>'


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
    parts = [f'<span class="v">{_e(fmt_latency(p50))}</span>']
    if reference > 0 and not cell.intra:
        parts.append(f'<span class="s">{_e(f"{p50 / reference:.1f}")}x intra median</span>')
    if p50 > limit:
        parts.append(f'<span class="s bad">above max {_e(fmt_latency(limit))}</span>')
    parts.append(
        f'<span class="s">p99 {_e(fmt_latency(cell.latency_p99_ms))} · loss '
        f"{_e(fmt_percent(cell.loss_percent))}%</span>"
    )
    if cell.path_mtu is not None:
        parts.append(f'<span class="s">path MTU {cell.path_mtu}</span>')
    parts.append(_pairs_line(cell))
    style = _style(scale_colour(latency_position(p50, reference), LATENCY_SCALE))
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
        f'<span class="v">{_e(fmt_rate(mbps))}</span>',
        f'<span class="s">{cell.throughput_samples} sample(s)</span>',
    ]
    if cell.intra:
        parts.append('<span class="s">intra-domain</span>')
    elif cell.throughput_ratio is not None:
        parts.append(
            f'<span class="s">ratio {_e(f"{cell.throughput_ratio:.2f}")} · '
            f"{_e(fmt_ratio(cell.oversubscription))}</span>"
        )
    else:
        parts.append('<span class="s">no intra-domain baseline</span>')
    classes = ""
    if cell.flagged:
        parts.append('<span class="s flag">FLAGGED: oversubscribed</span>')
        classes = ' class="flagged"'
    style = _style(scale_colour(mbps / reference if reference > 0 else 0.0, THROUGHPUT_SCALE))
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
    lat_ref = intra_median(ew, lambda c: c.latency_p50_ms) or limit
    out.append("<h3>Latency per domain pair</h3>")
    out.append(
        "<p>Median over the node pairs of their p50 round trip. Coloured on a log scale "
        f"against the intra-domain median ({_e(fmt_latency(lat_ref))}): each step doubles it. "
        f"Cells above peers.maxLatencyMs ({_e(fmt_latency(limit))}) say so.</p>"
    )
    ticks = [f"{2**i:g}x · {fmt_latency(lat_ref * 2**i)}" for i in range(_LEGEND_STEPS)]
    ticks[0] = f"≤ {ticks[0]}"
    ticks[-1] = f"≥ {ticks[-1]}"
    out.append(_legend("p50 vs intra-domain median:", LATENCY_SCALE, ticks))
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
        f"intra-domain median ({_e(fmt_rate(tp_ref))}); for cross-domain pairs the ratio to it "
        "and the oversubscription it means (4.0:1: a quarter of the intra-domain "
        "throughput).</p>"
    )
    ticks = [f"{25 * i}% · {fmt_rate(tp_ref * i / 4)}" for i in range(_LEGEND_STEPS)]
    ticks[0] = "0%"
    ticks[-1] = f"≥ {ticks[-1]}"
    out.append(_legend("throughput vs intra-domain median:", THROUGHPUT_SCALE, ticks))
    out.append(
        _heatmap(
            ew,
            domains,
            "Throughput heatmap: median throughput, cross/intra ratio, oversubscription",
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
    title = "<h3>Flagged pairs (oversubscription)</h3>"
    if not ew.flagged:
        return f"{title}<p>None.</p>"
    rows = []
    for f in ew.flagged:
        cell = ew.cell(f.a, f.b)
        cross = fmt_rate(cell.throughput_mbps) if cell is not None else "-"
        rows.append(
            f"<tr><td>{_e(f.a)}</td><td>{_e(f.b)}</td><td class='num'>{_e(cross)}</td>"
            f"<td class='num'>{_e(f'{f.throughput_ratio:g}')}</td>"
            f"<td class='num'>{_e(fmt_ratio(f.oversubscription))}</td></tr>"
        )
    return (
        f"{title}<table><thead><tr><th scope='col'>domain</th><th scope='col'>domain</th>"
        "<th scope='col'>cross throughput</th><th scope='col'>cross/intra ratio</th>"
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


# -- the verdict ----------------------------------------------------------------------------------

# What to do about a failing check family (the first part of the check id).
ADVICE: Final[Mapping[str, str]] = {
    "link": "check the cable, transceiver and switch port (ethtool IF; link.flaps counts "
    "carrier changes)",
    "mtu": "make the interface MTU and the RoCE MTU match the fabric (ip link set dev IF "
    "mtu 9000; the switch ports too)",
    "rdma": "check the RDMA device, port state, rate and RoCE v2 GIDs (ibv_devinfo, rdma link)",
    "pfc": "enable PFC on exactly the lossless priority and DSCP trust (mlnx_qos / dcb), and "
    "look for pause storms from a stuck receiver",
    "ecn": "enable ECN notification and reaction points on the lossless priority "
    "(/sys/class/net/IF/ecn/roce_np|roce_rp/enable/N)",
    "ib": "InfiniBand port errors grew: check the rail's cable or optic and its switch port "
    "(perfquery -x, mlxlink -c, ibqueryerrors)",
    "storage": "check the path from the nodes to the storage endpoint (reachability, "
    "latency, throughput)",
    "peer": "east-west: look at the suspect nodes and the flagged pairs below; a flagged pair "
    "of domains points at the uplinks between them",
}


def _verdict(obj: Mapping[str, Any], status: NetworkValidationStatus | None, name: str) -> str:
    if status is None:
        return (
            '<section id="verdict" class="unknown" role="status" data-verdict="unknown">'
            "<h2>No verdict yet</h2><p>The validation has no status: is the operator running? "
            "<code>netval doctor</code> checks the installation.</p></section>"
        )
    healthy = status.condition(ConditionType.HEALTHY)
    ready = status.condition(ConditionType.READY)
    is_ok = healthy is not None and healthy.status == "True"
    verdict = "healthy" if is_ok else ("unknown" if healthy is None else "unhealthy")
    title = {"healthy": "Healthy", "unhealthy": "Not healthy", "unknown": "No verdict yet"}
    why = healthy.message if healthy is not None else "the Healthy condition is not set yet"
    parts = [
        f'<section id="verdict" class="{verdict}" role="status" data-verdict="{verdict}">',
        f"<h2>{title[verdict]}</h2>",
        f"<p><strong>Why:</strong> {_e(healthy.reason if healthy else 'NoCondition')}: "
        f"{_e(why)}</p>",
    ]
    by_node: dict[str, list[str]] = defaultdict(list)
    for f in status.failures:
        if f.check not in by_node[f.node]:
            by_node[f.node].append(f.check)
    stale = stale_reasons(status)
    if by_node:
        ordered = sorted(by_node.items(), key=lambda item: (-len(item[1]), item[0]))
        shown = ", ".join(
            f"<strong>{_e(n)}</strong> ({_e(', '.join(c))})"
            for n, c in ordered[:MAX_NODES_IN_BANNER]
        )
        more = (
            f" and {len(ordered) - MAX_NODES_IN_BANNER} more"
            if len(ordered) > MAX_NODES_IN_BANNER
            else ""
        )
        parts.append(f"<p><strong>Failing nodes ({len(ordered)}):</strong> {shown}{more}</p>")
    if ready is not None and ready.status != "True":
        detail = ", ".join(f"{_e(n)} ({_e(w)})" for n, w in sorted(stale.items()))
        parts.append(
            f"<p><strong>Not ready:</strong> {_e(ready.reason)}: {detail or _e(ready.message)}</p>"
        )
    ew, _ = parse_east_west(obj)
    if ew is not None and ew.flagged:
        pairs = ", ".join(
            f"{_e(f.a)} ↔ {_e(f.b)} ({_e(fmt_ratio(f.oversubscription))})" for f in ew.flagged[:6]
        )
        parts.append(
            f"<p><strong>Oversubscribed domain pairs ({len(ew.flagged)}):</strong> {pairs}: "
            "cross-domain throughput below "
            f"{_e(f'{ew.min_throughput_ratio:g}')} of the intra-domain median</p>"
        )
    if ew is not None and ew.suspects:
        names = ", ".join(_e(x.node) for x in ew.suspects)
        parts.append(f"<p><strong>Suspect nodes (east-west):</strong> {names}</p>")
    advice: list[str] = []
    if ew is not None and ew.flagged:
        advice.append(
            "<li><strong>oversubscription</strong>: check the uplinks and spine capacity "
            "between the flagged domains (see the throughput heatmap)</li>"
        )
    families = dict.fromkeys(c.partition(".")[0] for checks in by_node.values() for c in checks)
    for family in families:
        if family in ADVICE:
            advice.append(f"<li><strong>{_e(family)}</strong>: {_e(ADVICE[family])}</li>")
    if stale:
        advice.append(
            "<li><strong>stale nodes</strong>: is the agent pod running on them? "
            "(<code>kubectl -n netval-system get pods -o wide</code>, <code>netval doctor</code>)</li>"
        )
    if not is_ok or advice:
        advice.append(
            f"<li>per node: <code>netval status {_e(name)} --nodes --failing</code>; every check "
            "and its fix: docs/checks.md</li>"
        )
        parts.append(f"<p><strong>What to do:</strong></p><ul>{''.join(advice)}</ul>")
    parts.append("</section>")
    return "".join(parts)


# -- conditions, counts, failures -------------------------------------------------------------


def _conditions_section(status: NetworkValidationStatus, now: datetime) -> str:
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
            f"<td>{_when(c.last_transition_time, now)}</td></tr>"
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

    def rows(items: list[tuple[str, Any]]) -> str:
        return "".join(
            f"<tr><th scope='row'>{_e(check)}</th><td class='num'>{c.pass_}</td>"
            f"<td class='num'>{c.warn}</td>"
            f"<td class='num{' notok' if c.fail else ''}'>{c.fail}</td></tr>"
            for check, c in items
        )

    head = (
        "<thead><tr><th scope='col'>check</th><th scope='col'>pass</th>"
        "<th scope='col'>warn</th><th scope='col'>fail</th></tr></thead>"
    )
    bad = [(k, c) for k, c in checks if c.fail or c.warn]
    good = [(k, c) for k, c in checks if not (c.fail or c.warn)]
    parts = []
    if bad:
        parts.append(
            f"<table><caption>Checks failing or warning</caption>{head}"
            f"<tbody>{rows(bad)}</tbody></table>"
        )
    if good:
        table = f"<table>{head}<tbody>{rows(good)}</tbody></table>"
        parts.append(
            f"<details{'' if bad else ' open'}><summary>{len(good)} check(s) passing on every "
            f"node that reports them</summary>{table}</details>"
        )
    checks_table = "".join(parts) or "<p>No check results yet.</p>"
    return (
        '<section id="counts"><h2>Nodes and checks</h2>'
        f"<table><caption>Nodes</caption><thead><tr>{heads}</tr></thead>"
        f"<tbody><tr>{nodes}</tr></tbody></table>{checks_table}</section>"
    )


def _failures_section(status: NetworkValidationStatus, now: datetime) -> str:
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
        f"<tr><td class='nw'>{_e(f.node)}</td><td class='nw'>{_e(f.check)}</td>"
        f"<td class='nw'>{_e(f.subject)}</td><td class='nw'>{_when(f.since, now)}</td>"
        f"<td>{_e(f.message)}</td></tr>"
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
    """The report page of one NetworkValidation object (as the API returns it): the verdict,
    the failures, the conditions and counts, then the east-west detail."""
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
        body.append(_verdict(obj, None, name))
        body.append(
            '<section id="conditions"><h2>Conditions</h2>'
            "<p>No status yet (is the operator running?)</p></section>"
        )
    else:
        body.append(
            f" · status for generation {status.observed_generation} · last report "
            f"{_when(status.last_report_time, now)}</p>"
        )
        if status.observed_generation != generation:
            body.append(
                "<p><strong>The operator has not caught up with this generation.</strong></p>"
            )
        body.append("</header>")
        body.append(_verdict(obj, status, name))
        body.append(_failures_section(status, now))
        body.append(_conditions_section(status, now))
        body.append(_counts_section(status))
    body.append(_east_west_section(obj))
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>netval: {_e(name)}</title><style>{_CSS}</style></head>\n"
        f"<body>{''.join(body)}</body></html>\n"
    )
