"""`netval report NAME --html FILE`: one NetworkValidation as a self-contained HTML page.

Read top-down, most actionable first: a verdict banner (Healthy or not, why, which nodes,
what to do), the failing nodes and checks (`status.failures`), the conditions and counts,
then the east-west detail: a latency and a throughput heatmap per domain pair (from
`status.eastWest`), the flagged pairs (low capacity ratio) and the suspect nodes.

- Heatmap colours show structure: latency on a log2 scale relative to the intra-domain median
  (1x, 2x, 4x, ... the median), throughput relative to the intra-domain median; each has a
  legend with the reference value. Units are human (µs/ms, Mbit/s/Gbit/s) and times relative
  to the report (the absolute UTC time on hover).

- Self-contained: inline CSS, no script, no external asset; a Content-Security-Policy meta
  tag forbids loading anything, so the file can be mailed or archived by CI as it is.
- Colours are computed here, and every coloured cell also shows its numbers (and words such
  as "FLAGGED" or "above max"), so nothing is said by colour alone; text colour is black or
  white, whichever contrasts more with the cell.
- The NetworkLoadTests of the validation, when the input has any, close the page
  (`report_html_loadtest`): oversubscription heatmap, latency idle vs loaded, storage bars.
- Every string taken from the object (names, reasons, messages, domains, check ids) is
  escaped with `html.escape`: they come from users, node labels and agents.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from netval.cli.consistency_view import consistency_section
from netval.cli.report_html_east_west import east_west_section
from netval.cli.report_html_format import escape, iso_time, when_html
from netval.cli.report_html_loadtest import CSS as LOADTEST_CSS
from netval.cli.report_html_loadtest import loadtest_section
from netval.cli.report_html_nics import nics_section
from netval.cli.report_html_topology import topology_section
from netval.cli.status_view import fmt_ratio, parse_east_west, parse_status, stale_reasons
from netval.model.status import ConditionType, NetworkValidationStatus

MAX_NODES_IN_BANNER: Final = 12

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
        f"<p><strong>Why:</strong> {escape(healthy.reason if healthy else 'NoCondition')}: "
        f"{escape(why)}</p>",
    ]
    by_node: dict[str, list[str]] = defaultdict(list)
    for f in status.failures:
        if f.check not in by_node[f.node]:
            by_node[f.node].append(f.check)
    stale = stale_reasons(status)
    if by_node:
        ordered = sorted(by_node.items(), key=lambda item: (-len(item[1]), item[0]))
        shown = ", ".join(
            f"<strong>{escape(n)}</strong> ({escape(', '.join(c))})"
            for n, c in ordered[:MAX_NODES_IN_BANNER]
        )
        more = (
            f" and {len(ordered) - MAX_NODES_IN_BANNER} more"
            if len(ordered) > MAX_NODES_IN_BANNER
            else ""
        )
        parts.append(f"<p><strong>Failing nodes ({len(ordered)}):</strong> {shown}{more}</p>")
    if ready is not None and ready.status != "True":
        detail = ", ".join(f"{escape(n)} ({escape(w)})" for n, w in sorted(stale.items()))
        parts.append(
            f"<p><strong>Not ready:</strong> {escape(ready.reason)}: {detail or escape(ready.message)}</p>"
        )
    ew, _ = parse_east_west(obj)
    if ew is not None and ew.flagged:
        pairs = ", ".join(
            f"{escape(f.a)} ↔ {escape(f.b)} ({escape(fmt_ratio(f.capacity_ratio))})"
            for f in ew.flagged[:6]
        )
        parts.append(
            f"<p><strong>Low-capacity domain pairs ({len(ew.flagged)}):</strong> {pairs}: "
            "cross-domain throughput below "
            f"{escape(f'{ew.min_throughput_ratio:g}')} of the intra-domain median</p>"
        )
    if ew is not None and ew.suspects:
        names = ", ".join(escape(x.node) for x in ew.suspects)
        parts.append(f"<p><strong>Suspect nodes (east-west):</strong> {names}</p>")
    advice: list[str] = []
    if ew is not None and ew.flagged:
        advice.append(
            "<li><strong>low capacity ratio</strong>: check the uplinks and spine links "
            "between the flagged domains (see the throughput heatmap)</li>"
        )
    families = dict.fromkeys(c.partition(".")[0] for checks in by_node.values() for c in checks)
    for family in families:
        if family in ADVICE:
            advice.append(f"<li><strong>{escape(family)}</strong>: {escape(ADVICE[family])}</li>")
    if stale:
        advice.append(
            "<li><strong>stale nodes</strong>: is the agent pod running on them? "
            "(<code>kubectl -n netval-system get pods -o wide</code>, <code>netval doctor</code>)</li>"
        )
    if not is_ok or advice:
        advice.append(
            f"<li>per node: <code>netval status {escape(name)} --nodes --failing</code>; every check "
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
            # Usable and Gating are absent from a status an older operator wrote
            if kind in (ConditionType.READY, ConditionType.HEALTHY):
                rows.append(
                    f"<tr><th scope='row'>{escape(kind.value)}</th><td colspan='4'>-</td></tr>"
                )
            continue
        css = "ok" if c.status == "True" else "notok"
        rows.append(
            f"<tr><th scope='row'>{escape(c.type.value)}</th><td class='{css}'>{escape(c.status)}</td>"
            f"<td>{escape(c.reason)}</td><td>{escape(c.message)}</td>"
            f"<td>{when_html(c.last_transition_time, now)}</td></tr>"
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
            f"<tr><th scope='row'>{escape(check)}</th><td class='num'>{c.pass_}</td>"
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
        f"<li><strong>{escape(node)}</strong>: {escape(', '.join(dict.fromkeys(checks)))}</li>"
        for node, checks in sorted(by_node.items())
    )
    out.append(f"<h3>Failing nodes</h3><ul>{items}</ul>")
    rows = "".join(
        f"<tr><td class='nw'>{escape(f.node)}</td><td class='nw'>{escape(f.check)}</td>"
        f"<td class='nw'>{escape(f.subject)}</td><td class='nw'>{when_html(f.since, now)}</td>"
        f"<td>{escape(f.message)}</td></tr>"
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


def render_html(
    obj: Mapping[str, Any],
    *,
    now: datetime | None = None,
    loadtests: Sequence[Mapping[str, Any]] = (),
) -> str:
    """The report page of one NetworkValidation object (as the API returns it): the verdict,
    the failures, the conditions and counts, then the east-west detail and, when given, the
    last run of its NetworkLoadTests."""
    now = now or datetime.now(UTC)
    metadata = obj.get("metadata")
    meta: Mapping[str, Any] = metadata if isinstance(metadata, Mapping) else {}
    name = str(meta.get("name", "?"))
    generation = meta.get("generation")
    status = parse_status(obj)
    body = [
        f"<header><h1>NetworkValidation {escape(name)}</h1>",
        f'<p class="meta">generation {escape(generation if generation is not None else "?")} · '
        f"report written {escape(iso_time(now))}",
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
            f"{when_html(status.last_report_time, now)}</p>"
        )
        if status.observed_generation != generation:
            body.append(
                "<p><strong>The operator has not caught up with this generation.</strong></p>"
            )
        body.append("</header>")
        body.append(_verdict(obj, status, name))
        body.append(_failures_section(status, now))
        body.append(nics_section(status))
        body.append(_conditions_section(status, now))
        body.append(_counts_section(status))
    body.append(east_west_section(obj))
    body.append(consistency_section(obj))
    body.append(topology_section(obj))
    css = _CSS
    if loadtests:
        body.append(loadtest_section(loadtests, now))
        css += LOADTEST_CSS
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>netval: {escape(name)}</title><style>{css}</style></head>\n"
        f"<body>{''.join(body)}</body></html>\n"
    )
