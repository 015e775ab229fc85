"""Node writes from the node verdict (pure): which Nodes need a change of the
`netval.io/fabric` label or netval's taint, and the taint list a write carries (taints of
other owners kept). What each node should carry is decided by `gating.verdict`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from netval.model.keys import TAINT_EFFECT, FabricHealth, TaintKey


@dataclass(frozen=True, slots=True)
class NodeChange:
    node: str
    label: FabricHealth | None  # None: remove our label
    taint: bool

    @property
    def excludes(self) -> bool:
        """The write keeps workloads off the node (label `unhealthy`, the taint): it goes
        before every write that lets them on (`gating.write_queue`)."""
        return self.taint or self.label is FabricHealth.UNHEALTHY


def plan_changes(
    current: Mapping[str, tuple[str | None, bool]],
    labels: Mapping[str, FabricHealth],
    taints: Iterable[str],
) -> list[NodeChange]:
    """Changes for nodes whose (label, tainted) differ from what gating wants.

    `current` maps every known node to (its netval.io/fabric label, has our taint). A node no
    validation labels or taints loses what netval put there.
    """
    tainted = set(taints)
    changes: list[NodeChange] = []
    for node in sorted(current):
        have_label, have_taint = current[node]
        want_label = labels.get(node)
        want_taint = node in tainted
        want_label_value = want_label.value if want_label is not None else None
        if have_label != want_label_value or have_taint != want_taint:
            changes.append(NodeChange(node, want_label, want_taint))
    return changes


def _is_ours(taint: Mapping[str, Any]) -> bool:
    return taint.get("key") == TaintKey.FABRIC_UNHEALTHY and taint.get("effect") == TAINT_EFFECT


def has_fabric_taint(taints: Iterable[Mapping[str, Any]] | None) -> bool:
    return any(_is_ours(t) for t in taints or ())


def with_fabric_taint(taints: list[dict[str, Any]] | None, present: bool) -> list[dict[str, Any]]:
    """The node's taint list with ours added or removed; taints of other owners untouched."""
    others = [t for t in taints or [] if not _is_ours(t)]
    if present:
        others.append(
            {"key": TaintKey.FABRIC_UNHEALTHY.value, "value": "true", "effect": TAINT_EFFECT}
        )
    return others
