"""Where the cached Workloads are placed, and which of them sit on each node: the index that
lets a node's verdict change requeue only the Workloads assigned to it.

The nodes are indexed by hostname and topology level (`topology.NodeIndex`) once per change
of the Nodes' kept labels, not scanned per Workload; each Workload's placement is found by
lookups in that index when it is reconciled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from netval.operator.kueue.topology import NodeIndex, Placement, placement, pods_per_node

Key = tuple[str, str]  # (namespace, name)


class Assignments:
    def __init__(self) -> None:
        self.index: NodeIndex | None = None
        self.placed: dict[Key, frozenset[str]] = {}  # the nodes of each Workload's placement
        self.on_node: dict[str, set[Key]] = {}
        # the label dicts the index was built from, and their sizes: the store replaces a
        # Node's dict when its kept labels change and fills missing keys in place
        self._seen: dict[str, tuple[Mapping[str, str], int]] = {}

    def labels_changed(self, node_labels: Mapping[str, Mapping[str, str]]) -> bool:
        seen = self._seen
        if self.index is None or len(seen) != len(node_labels):
            return True
        for node, labels in node_labels.items():
            known = seen.get(node)
            if known is None or known[0] is not labels or known[1] != len(labels):
                return True
        return False

    def reindex(self, node_labels: Mapping[str, Mapping[str, str]]) -> list[Key]:
        """Index the Nodes' labels again; the Workloads placed so far (their placements are
        to be found again)."""
        self.index = NodeIndex(node_labels)
        self._seen = {node: (labels, len(labels)) for node, labels in node_labels.items()}
        return list(self.placed)

    def place(
        self, key: Key, workload: Mapping[str, Any], node_labels: Mapping[str, Mapping[str, str]]
    ) -> Placement:
        """The Workload's placement, remembered for `on_nodes`."""
        if self.index is None:
            self.reindex(node_labels)
        assert self.index is not None
        status = workload.get("status") or {}
        found = placement(status.get("admission"), self.index, pods_per_node(workload))
        self._remember(key, found.nodes)
        return found

    def forget(self, key: Key) -> None:
        self._remember(key, frozenset())

    def on_nodes(self, nodes: Iterable[str]) -> set[Key]:
        """The Workloads placed on (or among) any of `nodes`."""
        out: set[Key] = set()
        for node in nodes:
            out |= self.on_node.get(node, set())
        return out

    def _remember(self, key: Key, nodes: frozenset[str]) -> None:
        before = self.placed.get(key, frozenset())
        if before == nodes:
            if not nodes:
                self.placed.pop(key, None)
            return
        for node in before - nodes:
            keys = self.on_node.get(node)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self.on_node[node]
        for node in nodes - before:
            self.on_node.setdefault(node, set()).add(key)
        if nodes:
            self.placed[key] = nodes
        else:
            self.placed.pop(key, None)
