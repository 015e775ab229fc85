"""`netval status NAME --topology`: the levels and domains of `status.topology`, the nodes
that discovered nothing, the disagreements with the labels, and what was measured between
domains (`topology_pairs`). Pure: a NetworkValidation object in, text out; every string is
from the cluster (and, through LLDP, from switches), so each is made printable and cut to its
column."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pydantic import ValidationError

from netval.cli.status_view import printable
from netval.cli.topology_pairs import pair_lines
from netval.model.topology import TopologyStatus

_DOMAINS_SHOWN: Final = 12


def parse_topology(obj: Mapping[str, Any]) -> tuple[TopologyStatus | None, str | None]:
    """(the section, None), (None, why it is absent or unreadable)."""
    raw = (obj.get("status") or {}).get("topology")
    if raw is None:
        return None, "no status.topology: set spec.topology.lldp or spec.topology.levels"
    try:
        return TopologyStatus.model_validate(raw), None
    except ValidationError as exc:
        return None, f"status.topology is unreadable ({exc.error_count()} errors)"


def render_topology(obj: Mapping[str, Any]) -> str:
    name = printable(str((obj.get("metadata") or {}).get("name", "?")), 63)
    topo, problem = parse_topology(obj)
    lines = [f"topology of {name}"]
    if topo is None:
        return "\n".join([*lines, f"  {problem}", ""])
    lines.append(f"  levels ({topo.levels_source}), top first:")
    if not topo.levels:
        lines.append("    none declared or detected (docs/topology.md, Levels)")
    for depth, level in enumerate(topo.levels):
        indent = "    " + "  " * depth
        lines.append(
            f"{indent}{printable(level.key, 80)}: {level.domains} domains, "
            f"{level.min_nodes}-{level.max_nodes} nodes each"
            + (f", {level.unlabelled} nodes unlabelled" if level.unlabelled else "")
        )
        shown = level.listed[:_DOMAINS_SHOWN]
        if shown:
            names = ", ".join(f"{printable(d.name, 40)} ({d.nodes})" for d in shown)
            more = level.domains - len(shown)
            lines.append(f"{indent}  {names}" + (f", … {more} more" if more > 0 else ""))
    lines.append(f"  LLDP: {topo.discovered} nodes see a neighbour on every fabric netdev")
    missing = topo.undiscovered
    if missing.count:
        names = ", ".join(printable(n, 63) for n in missing.nodes)
        more = missing.count - len(missing.nodes)
        lines.append(
            f"  undiscovered: {missing.count} nodes ({names}"
            + (f", … {more} more" if more > 0 else "")
            + ")"
        )
        if missing.example:
            lines.append(f"    e.g. {printable(missing.example, 300)}")
    lines.append(f"  disagreements with the labels: {topo.disagreements}")
    for d in topo.listed_disagreements:
        expected = f"; the domain's nodes see {printable(d.expected, 60)}" if d.expected else ""
        lines.append(
            f"    {printable(d.node, 63)} {printable(d.interface, 15)}: declared "
            f"{printable(d.declared, 60)}, sees {printable(d.seen, 60)}{expected}"
        )
    if topo.conflicts:
        lines.append(f"  domains whose nodes see several switches: {topo.conflicts}")
        for c in topo.listed_conflicts:
            seen = ", ".join(f"{printable(s, 60)} ({n})" for s, n in c.switches.items())
            lines.append(f"    {printable(c.domain, 60)} {printable(c.interface, 15)}: {seen}")
    lines += pair_lines(topo)
    return "\n".join([*lines, ""])


__all__ = ["parse_topology", "render_topology"]
