"""The HTML report's topology section (`status.topology`): the levels as a tree of domains,
nodes that discovered nothing, disagreements with the labels, and what was measured between
domains (`domainPairs`: a table, ratios coloured, the worst of each figure outlined). Empty
when the validation has no such section, so pages of validations without spec.topology are
unchanged. Every string is escaped (switch names arrive through LLDP)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from netval.cli.loadtest_format import millis, ratio
from netval.cli.report_html_format import (
    LATENCY_OCTAVES,
    LATENCY_SCALE,
    cell_style,
    escape,
    scale_colour,
)
from netval.cli.topology_pairs import load_sentence, percent, severity, worst_index
from netval.cli.topology_view import parse_topology
from netval.model.topology import LevelSummary, TopologyStatus

# the worst value of a column, outlined as the east-west heatmaps outline a flagged pair
_WORST: Final = "outline:3px solid #000;outline-offset:-4px;font-weight:700"


def _levels_tree(levels: list[LevelSummary]) -> str:
    """Levels nested top to bottom, each with its domains (the first ones by name)."""
    out = ""
    for level in reversed(levels):
        domains = "".join(
            f"<li>{escape(d.name)} <small>({d.nodes} nodes)</small></li>" for d in level.listed
        )
        more = level.domains - len(level.listed)
        if more > 0:
            domains += f"<li>… {more} more</li>"
        unlabelled = f", {level.unlabelled} nodes unlabelled" if level.unlabelled else ""
        out = (
            f"<li><code>{escape(level.key)}</code>: {level.domains} domains, "
            f"{level.min_nodes}-{level.max_nodes} nodes each{unlabelled}"
            f'<ul class="domains">{domains}</ul><ul>{out}</ul></li>'
        )
    return f'<ul class="levels">{out}</ul>' if out else "<p>No levels declared or detected.</p>"


def _disagreements(topo: TopologyStatus) -> str:
    if not topo.disagreements:
        return "<p>Every node sees the switch its domain sees.</p>"
    rows = "".join(
        f"<tr><td>{escape(d.node)}</td><td>{escape(d.interface)}</td>"
        f"<td>{escape(d.declared)}</td><td>{escape(d.seen)}</td>"
        f"<td>{escape(d.expected or '(a tie)')}</td></tr>"
        for d in topo.listed_disagreements
    )
    more = topo.disagreements - len(topo.listed_disagreements)
    tail = f"<p>… and {more} more.</p>" if more > 0 else ""
    return (
        f"<p>{topo.disagreements} fabric netdevs see another switch than their domain "
        "(<code>topology.agreement</code>).</p><table><thead><tr><th>node</th><th>netdev</th>"
        "<th>declared domain</th><th>sees</th><th>the domain's switch</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>{tail}"
    )


def _ratio_td(value: float | None, worst: bool) -> str:
    """A ratio cell coloured 1:1 (light) .. 16:1 (dark) on the latency scale's octaves."""
    if value is None or math.isnan(value):
        return f'<td class="num">{escape(ratio(value))}</td>'
    position = math.log2(value) / LATENCY_OCTAVES if 1 < value < math.inf else float(value > 1)
    style = cell_style(scale_colour(position, LATENCY_SCALE)) + (f";{_WORST}" if worst else "")
    title = ' title="the worst"' if worst else ""
    return f'<td class="num" style="{style}"{title}>{escape(ratio(value))}</td>'


def _domain_td(name: str, worst: bool) -> str:
    return f"<td><strong>{escape(name)}</strong></td>" if worst else f"<td>{escape(name)}</td>"


def _plain_td(text: str, worst: bool) -> str:
    if worst:
        return f'<td class="num" style="{_WORST}" title="the worst">{escape(text)}</td>'
    return f'<td class="num">{escape(text)}</td>'


def _domain_pairs(topo: TopologyStatus) -> str:
    """The measured figures per domain pair; "" when nothing was measured."""
    pairs = topo.domain_pairs
    if not pairs and not topo.omitted_pairs:
        return ""
    worst_capacity = worst_index(p.capacity_ratio for p in pairs)
    worst_load = worst_index(p.oversubscription for p in pairs)
    worst_loaded = worst_index(p.loaded_latency_p99_ms for p in pairs)
    worst_loss = worst_index(p.loss_percent for p in pairs)
    worst_pair = worst_index(severity(p) for p in pairs)
    rows = "".join(
        f"<tr>{_domain_td(p.a, i == worst_pair)}{_domain_td(p.b, i == worst_pair)}"
        f'<td class="num">{p.pairs}</td>'
        f"{_ratio_td(p.capacity_ratio, i == worst_capacity)}"
        f"{_ratio_td(p.oversubscription, i == worst_load)}"
        f"{_plain_td(millis(p.latency_p99_ms), False)}"
        f"{_plain_td(millis(p.loaded_latency_p99_ms), i == worst_loaded)}"
        f"{_plain_td(percent(p.loss_percent), i == worst_loss)}</tr>"
        for i, p in enumerate(pairs)
    )
    source = load_sentence(topo, limit=253)
    load = (
        f"Under load: {escape(source)} (every node sending at once)."
        if source is not None
        else "No NetworkLoadTest run yet: oversubscription needs one."
    )
    key = f" of <code>{escape(topo.pairs_key)}</code>" if topo.pairs_key else ""
    more = (
        f"<p>… and {topo.omitted_pairs} more pairs (omittedPairs).</p>"
        if topo.omitted_pairs
        else ""
    )
    table = (
        '<div class="scroll"><table id="topology-pairs"><thead><tr><th>domain</th>'
        "<th>domain</th><th>node pairs</th><th>capacity ratio (lone flows)</th>"
        "<th>oversubscription under load</th><th>p99 idle (ms)</th><th>p99 loaded (ms)</th>"
        f"<th>loss %</th></tr></thead><tbody>{rows}</tbody></table></div>"
        if pairs
        else ""
    )
    return (
        f"<h3>Measured between domains{key}</h3><p>Worst first; the worst of each figure "
        f"outlined. {load}</p>{table}{more}"
    )


def topology_section(obj: Mapping[str, Any]) -> str:
    raw = (obj.get("status") or {}).get("topology")
    if raw is None:
        return ""
    topo, problem = parse_topology(obj)
    if topo is None:
        return f'<section id="topology"><h2>Topology</h2><p>{escape(problem)}</p></section>'
    missing = topo.undiscovered
    undiscovered = ""
    if missing.count:
        names = ", ".join(escape(n) for n in missing.nodes)
        example = f" E.g. {escape(missing.example)}" if missing.example else ""
        undiscovered = (
            f"<p>{missing.count} nodes saw no LLDP neighbour on some fabric netdev ({names}"
            f"{', …' if missing.count > len(missing.nodes) else ''}).{example}</p>"
        )
    conflicts = "".join(
        f"<li>{escape(c.domain)} {escape(c.interface)}: "
        + ", ".join(f"{escape(s)} ({n})" for s, n in c.switches.items())
        + "</li>"
        for c in topo.listed_conflicts
    )
    conflicts_html = (
        f"<p>{topo.conflicts} domains whose nodes see several switches:</p><ul>{conflicts}</ul>"
        if topo.conflicts
        else ""
    )
    return (
        '<section id="topology"><h2>Topology</h2>'
        f"<p>Levels {escape(topo.levels_source)}; {topo.discovered} nodes see an LLDP "
        "neighbour on every fabric netdev.</p>"
        f"{_levels_tree(topo.levels)}{undiscovered}{_disagreements(topo)}{conflicts_html}"
        f"{_domain_pairs(topo)}"
        "</section>"
    )


__all__ = ["topology_section"]
