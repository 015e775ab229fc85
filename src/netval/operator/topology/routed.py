"""Publication from the L3 path (routed fabrics), pure: a leaf from the next-hop router where
LLDP sees nothing, and the spine block from the router hops toward cross-leaf peers.

- **Leaf from the next hop.** When no judged netdev of a node sees an LLDP neighbour and
  every one has a next-hop router, the node's leaf is that router (the sorted set of them
  on a rail-optimised node). Published only when at least one other node has the same value:
  a ToR that is the gateway of a rack subnet answers every node of the rack from one
  address, but a fabric routed to the host over per-link /31s gives each node its own
  gateway address, which names no shared domain (docs/topology.md, "Publication").
- **Spine from the paths.** On a path that reached a peer across at least three routers
  (leaf, spine, far leaf, ...) the second hop is a spine. Flows are spread over the spines
  (ECMP), so a node's paths name several of them; the spines a leaf agrees on (each seen by
  at least two of its nodes) belong to one block. Blocks are the connected groups of spines
  (two spines are grouped when some leaf agrees on both), named by their smallest address,
  or by the value the block's nodes already carry when it names one of its spines (a spine
  seen later does not rename a block). A block is published only when its nodes span at
  least two leaves: a block of one leaf says nothing the leaf does not, and that is what
  spines answering from per-link addresses give.
- **One node cannot merge blocks.** A node's report is its own word: a hop it names that no
  other node of its leaf saw (a forged trace, or a path that left the fabric) joins
  nothing, so it cannot make Kueue's topology treat two pods as one block. A node's block
  is its leaf's; a node with no leaf value gets the block of a spine it saw that some leaf
  agreed on (it labels itself only).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from netval.model.topology import TopologyReport
from netval.operator.topology.agreement import NetdevView
from netval.operator.topology.labels import label_value

# (next hop of each judged netdev in the section's order, spines seen on cross-leaf paths):
# what publication reads of a report's L3 path; plain tuples like NetdevView.
RouteView = tuple[tuple[str | None, ...], tuple[str, ...]]
MIN_HOPS_ACROSS_A_SPINE: Final = 3
MAX_SPINES_PER_NODE: Final = 32  # remembered across reports (a node's paths rotate peers)


def route_view(report: TopologyReport) -> RouteView | None:
    next_hops = tuple(i.next_hop for i in report.interfaces)
    spines = {
        p.hops[1]
        for p in report.paths
        if p.reached and len(p.hops) >= MIN_HOPS_ACROSS_A_SPINE and p.hops[1]
    }
    if not any(next_hops) and not spines:
        return None
    return next_hops, tuple(sorted(s for s in spines if s is not None))


def next_hop_leaf(views: Sequence[NetdevView], route: RouteView | None) -> str | None:
    """The next-hop leaf value: when no netdev sees an LLDP neighbour and each has a next hop."""
    if route is None or not views or any(switch is not None for _, switch, _, _ in views):
        return None
    hops = route[0]
    if len(hops) != len(views) or any(h is None for h in hops):
        return None
    return label_value("+".join(sorted({h for h in hops if h is not None})))


def shared_only(values: Mapping[str, str]) -> dict[str, str]:
    """The node -> value entries whose value at least one other node has."""
    counts = Counter(values.values())
    return {node: value for node, value in values.items() if counts[value] >= 2}


MIN_NODES_AGREEING: Final = 2  # nodes of one leaf that must have seen a spine


def leaf_spines(
    seen: Mapping[str, Iterable[str]], leaves: Mapping[str, str]
) -> dict[str, set[str]]:
    """leaf -> the spines at least MIN_NODES_AGREEING of its nodes saw."""
    votes: dict[str, Counter[str]] = {}
    for node, spines in seen.items():
        leaf = leaves.get(node)
        if leaf is not None:
            votes.setdefault(leaf, Counter()).update(set(spines))
    return {
        leaf: agreed
        for leaf, counts in votes.items()
        if (agreed := {s for s, n in counts.items() if n >= MIN_NODES_AGREEING})
    }


def spine_blocks(
    seen: Mapping[str, Iterable[str]],
    leaves: Mapping[str, str],
    current: Mapping[str, str],
) -> dict[str, str]:
    """node -> its spine block's label value, from the spines each node saw (`seen`), the
    nodes' leaf values and their current spine labels (`current`)."""
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    # A leaf's uplinks all go to its block's spines: what a leaf agrees on is one block.
    agreed = leaf_spines(seen, leaves)
    for leaf_block in agreed.values():
        first, *rest = sorted(leaf_block)
        for spine in rest:
            parent[root(spine)] = root(first)
        root(first)
    members: dict[str, set[str]] = {}
    for spine in parent:
        members.setdefault(root(spine), set()).add(spine)
    nodes: dict[str, list[str]] = {}
    for node, saw in seen.items():
        leaf = leaves.get(node)
        own = sorted(agreed.get(leaf, ()) if leaf is not None else (s for s in saw if s in parent))
        if own:
            nodes.setdefault(root(own[0]), []).append(node)
    out: dict[str, str] = {}
    for block, block_nodes in nodes.items():
        if len({leaves[n] for n in block_nodes if n in leaves}) < 2:
            continue
        names = {label_value(s) for s in members[block]}
        kept = Counter(current[n] for n in block_nodes if current.get(n) in names)
        name = min(kept, key=lambda v: (-kept[v], v)) if kept else label_value(min(members[block]))
        out.update(dict.fromkeys(block_nodes, name))
    return out


__all__ = [
    "MAX_SPINES_PER_NODE",
    "MIN_NODES_AGREEING",
    "RouteView",
    "leaf_spines",
    "next_hop_leaf",
    "route_view",
    "shared_only",
    "spine_blocks",
]
