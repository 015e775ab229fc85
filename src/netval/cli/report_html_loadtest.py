"""The load-test part of the HTML report: the last run of each NetworkLoadTest of the
validation (shown only when the report's input has any).

- An oversubscription heatmap per domain pair, coloured on a log2 scale from 1:1 (light) to
  8:1 and more (dark), every cell also showing its figure and "breached", so nothing is said
  by colour alone; intra-domain cells are the reference and show their per-node rate.
- Latency idle vs loaded (p99) and loss under load per domain pair, with the inflation.
- Storage per endpoint as CSS bars (no image, no script): one node alone, the median and the
  slowest node while every node reads at once, on one scale per endpoint, plus the aggregate
  and the fairness index.
- Breaches, skipped nodes and the history of earlier runs.

Everything comes from the status the operator wrote, through the API: strings are escaped,
numbers are formatted to a bounded width (`loadtest_view.figure`) and bar widths clipped to
0..100 %.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from netval.cli.loadtest_format import (
    aware,
    breach_line,
    breached_subjects,
    cell_map,
    cell_text,
    domains_of,
    figure,
    inflation,
    latest_run_time,
    millis,
    name_of,
    pair_name,
    parse_loadtest,
    passed,
    rate,
    ratio,
    validation_of,
)
from netval.cli.report_html_format import (
    LATENCY_SCALE,
    cell_style,
    escape,
    fmt_rate,
    legend,
    scale_colour,
    when_html,
)
from netval.model.loadtest import CellReason, LoadRun, LoadStorage, NetworkLoadTestStatus

OVERSUB_OCTAVES: Final = 3  # the colour scale spans 1:1 .. 2**3 = 8:1
CSS: Final = """
.bars{display:grid;grid-template-columns:max-content 20rem max-content;gap:.2rem .5rem;
align-items:center;margin:.25rem 0 1rem}
.bar{background:#eee;height:.9rem;border:1px solid #bbb}
.bar span{display:block;height:100%;background:#2171b5}
"""


def oversub_position(value: float | None) -> float:
    """0 at (or below) 1:1, 1 at 2**OVERSUB_OCTAVES:1 and above."""
    if value is None or math.isnan(value) or value <= 1:
        return 0.0
    if math.isinf(value):
        return 1.0
    return min(1.0, math.log2(value) / OVERSUB_OCTAVES)


def _when(moment: datetime | None, now: datetime) -> str:
    return when_html(aware(moment) if moment is not None else None, now)


def _safe_rate(value: float | None) -> str:
    if value is None or not math.isfinite(value) or not -1e6 < value < 1e9:
        return figure(value) + " Mbit/s" if value is not None else "-"
    return fmt_rate(value)


def _heatmap(run: LoadRun, index: int) -> str:
    cells = run.east_west.cells if run.east_west else []
    domains = domains_of(cells)
    if not domains:
        return "<p>No domain pair measured.</p>"
    by_pair = cell_map(cells)
    breached = breached_subjects(run)
    head = "".join(f"<th scope='col'>{escape(d)}</th>" for d in domains)
    rows = []
    for row in domains:
        tds = []
        for col in domains:
            c = by_pair.get((row, col))
            if c is None:
                tds.append('<td class="none">not planned</td>')
            elif c.reason in (CellReason.NOT_MEASURED, CellReason.SENDER_LIMITED):
                tds.append(
                    f'<td class="none flagged"><span class="v">{escape(c.reason.value)}'
                    f'</span><span class="s">{escape(c.note)}</span></td>'
                )
            elif c.a == c.b:
                tds.append(
                    f'<td class="none"><span class="v">reference</span><span class="s">'
                    f"{escape(_safe_rate(c.per_node_mbps))} per node</span></td>"
                )
            else:
                bad = pair_name(c) in breached
                style = cell_style(
                    scale_colour(oversub_position(c.oversubscription), LATENCY_SCALE)
                )
                flagged = ' class="flagged"' if bad else ""
                tds.append(
                    f'<td style="{style}"{flagged}>'
                    f'<span class="v">{escape(cell_text(c))}</span>'
                    f'<span class="s">{escape(_safe_rate(c.per_node_mbps))} per node · '
                    f"{c.flows} flows</span>"
                    + ('<span class="s bad">breached</span>' if bad else "")
                    + (f'<span class="s">partial: {escape(c.note)}</span>' if c.reason else "")
                    + "</td>"
                )
        rows.append(f"<tr><th scope='row'>{escape(row)}</th>{''.join(tds)}</tr>")
    ticks = [f"{2 ** (OVERSUB_OCTAVES * i / 4):.1f}:1" for i in range(5)]
    return (
        legend("oversubscription", LATENCY_SCALE, ticks, "8:1 and above: darkest")
        + f'<div class="scroll"><table class="heat" id="loadtest-{index}-oversubscription">'
        "<caption>Oversubscription per domain pair (its worst rail plane): median per-node "
        "intra-domain rate / per-node rate across, every node sending at once; ~: partial, a "
        "lower bound kept out of the maximum</caption>"
        f"<thead><tr><th></th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def _latency(run: LoadRun, index: int) -> str:
    cells = run.east_west.cells if run.east_west else []
    if not cells:
        return ""
    rows = "".join(
        f"<tr><td>{escape(c.a)}{' (intra)' if c.a == c.b else ' ↔ ' + escape(c.b)}</td>"
        f"<td class='num'>{c.rail}</td><td class='num'>{c.flows}/{c.planned}</td>"
        f"<td>{escape(c.reason.value + ': ' + c.note if c.reason else '')}</td>"
        f"<td class='num'>{escape(millis(c.idle_latency_p99_ms))}</td>"
        f"<td class='num'>{escape(millis(c.loaded_latency_p99_ms))}</td>"
        f"<td class='num'>{escape(figure(inflation(c), lambda v: f'{v:.1f}x'))}</td>"
        f"<td class='num'>{escape(figure(c.loss_percent, lambda v: f'{v:.2f}'))}</td>"
        f"<td class='num'>{escape(_safe_rate(c.aggregate_mbps))}</td></tr>"
        for c in cells
    )
    return (
        f'<div class="scroll"><table id="loadtest-{index}-latency"><caption>Latency idle vs '
        "loaded: p99 round trip of the pairs' echoes before and during the load</caption>"
        "<thead><tr><th scope='col'>domain pair</th><th scope='col'>rail</th>"
        "<th scope='col'>flows counted/planned</th><th scope='col'>why no figure</th>"
        "<th scope='col'>idle p99 ms</th>"
        "<th scope='col'>loaded p99 ms</th><th scope='col'>inflation</th>"
        "<th scope='col'>loss % under load</th><th scope='col'>aggregate rate</th></tr>"
        f"</thead><tbody>{rows}</tbody></table></div>"
    )


def _bar(label: str, value: float | None, top: float) -> str:
    share = 0.0
    if value is not None and math.isfinite(value) and top > 0:
        share = min(100.0, max(0.0, value / top * 100))
    return (
        f"<span>{escape(label)}</span><div class='bar' role='img' aria-label='{escape(label)}'>"
        f"<span style='width:{share:.1f}%'></span></div>"
        f"<span class='num'>{escape(rate(value))} MB/s</span>"
    )


def _storage_one(s: LoadStorage) -> str:
    figures = (s.single_node_m_bps, s.per_node_m_bps_median, s.per_node_m_bps_min)
    top = max((v for v in figures if v is not None and math.isfinite(v)), default=0.0)
    return (
        f"<p><strong>{escape(s.endpoint)}</strong>: {s.nodes} of {s.readers} reader(s) read at "
        "once (the others count as 0 MB/s), aggregate "
        f"<strong>{escape(rate(s.aggregate_m_bps))} MB/s</strong>, fairness (Jain) "
        f"{escape(figure(s.fairness, lambda v: f'{v:.2f}'))}</p><div class='bars'>"
        + _bar("one node alone", s.single_node_m_bps, top)
        + _bar("per node, median (all at once)", s.per_node_m_bps_median, top)
        + _bar("per node, slowest (all at once)", s.per_node_m_bps_min, top)
        + "</div>"
    )


def _storage(run: LoadRun) -> str:
    if not run.storage:
        return ""
    return "<h4>Storage (MB/s = 10<sup>6</sup> B/s)</h4>" + "".join(
        _storage_one(s) for s in run.storage
    )


def _breaches(run: LoadRun) -> str:
    if not run.breaches:
        return "<p>Breaches: none.</p>"
    items = "".join(
        f"<li>{escape(breach_line(b.expectation, b.subject, b.observed, b.expected))}</li>"
        for b in run.breaches
    )
    return f"<p><strong>Breaches ({len(run.breaches)}, worst first):</strong></p><ul>{items}</ul>"


def _history(status: NetworkLoadTestStatus, now: datetime) -> str:
    if not status.history:
        return ""
    rows = "".join(
        f"<tr><td>{escape(h.id)}</td><td>{_when(h.started_at, now)}</td>"
        f"<td>{escape(h.phase.value)}</td><td>{escape(h.reason.value)}</td>"
        f"<td class='num'>{h.nodes}</td><td class='num'>{escape(ratio(h.max_oversubscription))}</td>"
        f"<td class='num'>{escape(rate(h.min_storage_m_bps_per_node))}</td>"
        f"<td class='num'>{h.breaches}</td></tr>"
        for h in status.history
    )
    return (
        "<details><summary>Earlier runs</summary><table><thead><tr><th scope='col'>run</th>"
        "<th scope='col'>started</th><th scope='col'>phase</th><th scope='col'>reason</th>"
        "<th scope='col'>nodes</th><th scope='col'>max oversubscription</th>"
        "<th scope='col'>min storage MB/s per node</th><th scope='col'>breaches</th></tr>"
        f"</thead><tbody>{rows}</tbody></table></details>"
    )


def _one(obj: Mapping[str, Any], index: int, now: datetime) -> str:
    head = f"<h3>NetworkLoadTest {escape(name_of(obj))}</h3>"
    status, problem = parse_loadtest(obj)
    if status is None:
        return head + f"<p>{escape(problem or 'No status yet (is the operator running?)')}</p>"
    run = status.last_run
    summary = (
        f"<p>Phase <strong>{escape(status.phase.value)}</strong> · Passed "
        f"{escape(passed(status))}"
        + (f" · next run {_when(status.next_run_at, now)}" if status.next_run_at else "")
        + "</p>"
    )
    if run is None:
        return head + summary + "<p>No run yet.</p>" + _history(status, now)
    skipped = Counter(s.reason.value for s in run.skipped_nodes)
    detail = ", ".join(f"{n} {escape(r)}" for r, n in sorted(skipped.items()))
    facts = (
        f"<p>Run <code>{escape(run.id)}</code> started {_when(run.started_at, now)}, "
        + (f"finished {_when(run.finished_at, now)}" if run.finished_at else "running")
        + f" · {run.nodes} node(s) · {run.skipped_count} skipped"
        + (f" ({detail})" if detail else "")
        + f" · {run.refused_flows} flow(s) refused · max oversubscription "
        f"<strong>{escape(ratio(run.max_oversubscription))}</strong> · counted "
        f"{run.counted_flows} of {run.planned_flows} planned flows and reads · engines "
        f"{escape(', '.join(run.engines) or 'none reported')}</p>"
    )
    omitted = run.east_west.omitted_cells if run.east_west else 0
    more = (
        f"<p>{omitted} more domain pair(s) not in the status (breached and most "
        "oversubscribed first are kept).</p>"
        if omitted
        else ""
    )
    return (
        head
        + summary
        + facts
        + _breaches(run)
        + _heatmap(run, index)
        + more
        + _latency(run, index)
        + _storage(run)
        + _history(status, now)
    )


def loadtest_section(loadtests: Sequence[Mapping[str, Any]], now: datetime) -> str:
    """The report's "Load tests" section: the last run of each test, newest run first."""

    def newest(obj: Mapping[str, Any]) -> float:
        status, _ = parse_loadtest(obj)
        moment = latest_run_time(status)
        return -aware(moment).timestamp() if moment is not None else math.inf

    ordered = sorted(loadtests, key=lambda o: (newest(o), name_of(o)))
    parts = [_one(obj, i, now) for i, obj in enumerate(ordered)]
    validation = validation_of(ordered[0]) if ordered else "?"
    return (
        f'<section id="load-tests"><h2>Load tests</h2><p>NetworkLoadTests of '
        f"{escape(validation)}: concurrent load on the fabric and storage. Oversubscription "
        "is measured with every node sending at once; the capacity ratio above uses lone "
        f"flows.</p>{''.join(parts)}</section>"
    )
