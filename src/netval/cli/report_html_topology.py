"""The HTML report's topology section (`status.topology`): the levels as a tree of domains,
nodes that discovered nothing, disagreements with the labels. Empty when the validation has
no such section, so pages of validations without spec.topology are unchanged. Every string
is escaped (switch names arrive through LLDP)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from netval.cli.report_html_format import escape
from netval.cli.topology_view import parse_topology
from netval.model.topology import LevelSummary, TopologyStatus


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
        "</section>"
    )


__all__ = ["topology_section"]
