"""Publication of discovered topology as Node labels (spec.topology.publishLabels), pure:
what each Node's `topology.netval.io/*` labels should be, and the changes from what they are.

Only where nothing is declared: a validation publishes when it opts in, declares no
`spec.topology.levels` and its targeted nodes carry no other known scheme (its own
`topology.netval.io/*` labels do not count as declared). The leaf is the switch LLDP sees on
every judged netdev of the node (rail-optimised nodes see one leaf per rail: the sorted set
of them is the node's leaf domain). LLDP never sees a spine: the spine block, and the leaf
where LLDP sees nothing, come from the L3 path (`routed`; docs/topology.md, "Publication").
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from netval.model.spec import NetworkValidationSpec
from netval.model.topology import NetvalTopologyLabel
from netval.operator.topology.agreement import NetdevView, detect_levels

MAX_LABEL_VALUE: Final = 63  # Kubernetes' bound on a label value
HASH_CHARS: Final = 8
_INVALID = re.compile(r"[^A-Za-z0-9_.-]+")
_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")
OWN_LEVEL_KEYS: Final = frozenset(key.value for key in NetvalTopologyLabel)

LabelPatch = dict[str, str | None]  # label key -> value (None removes it)
LEAF: Final = NetvalTopologyLabel.LEAF.value
SPINE: Final = NetvalTopologyLabel.SPINE.value


def current_values(current: Mapping[str, Mapping[str, str]], key: str) -> dict[str, str]:
    """node -> its label `key`, for the nodes that carry it."""
    return {node: labels[key] for node, labels in current.items() if key in labels}


def label_value(text: str) -> str:
    """`text` as a valid label value: other characters become '-', the ends alphanumeric, at
    most 63 characters; when anything was changed an 8-hex hash of `text` is appended, so two
    switches whose names sanitise alike keep distinct values."""
    clean = _EDGE.sub("", _INVALID.sub("-", text))
    if clean == text and len(clean) <= MAX_LABEL_VALUE:
        return clean
    digest = hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]
    head = _EDGE.sub("", clean[: MAX_LABEL_VALUE - HASH_CHARS - 1])
    return f"{head}-{digest}" if head else digest


def leaf_of(views: Sequence[NetdevView]) -> str | None:
    """The node's leaf domain: the switch (or the sorted set of rail switches) its netdevs
    see; None unless every netdev sees one (a partial view would flap the label)."""
    switches = [switch for _, switch, _, _ in views]
    if not switches or any(s is None for s in switches):
        return None
    return label_value("+".join(sorted({s for s in switches if s is not None})))


def publishes(spec: NetworkValidationSpec, label_sets: Iterable[Mapping[str, str]]) -> bool:
    """Whether this validation publishes: opted in, and no levels declared by spec or by a
    known scheme on its nodes other than netval's own."""
    topology = spec.topology
    if not topology.publish_labels or topology.levels:
        return False
    return set(detect_levels(label_sets)) <= OWN_LEVEL_KEYS


def desired_leaves(seen: Iterable[Mapping[str, Sequence[NetdevView]]]) -> dict[str, str]:
    """node -> its leaf value, from each publishing validation's views (a node two validations
    see differently gets the smallest value: deterministic, no flapping between them)."""
    out: dict[str, str] = {}
    for views in seen:
        for node, view in views.items():
            leaf = leaf_of(view)
            if leaf is not None and (node not in out or leaf < out[node]):
                out[node] = leaf
    return out


def plan_label_changes(
    current: Mapping[str, Mapping[str, str]],
    desired: Mapping[str, str],
    publishing: frozenset[str],
    spines: Mapping[str, str] | None = None,
) -> dict[str, LabelPatch]:
    """The label patch per Node (only Nodes with a change, one patch for both labels): the
    leaf (`desired`) and spine (`spines`) set where discovery gives one and it differs;
    removed from Nodes no publishing validation targets; left alone on a targeted node with
    no discovery (an unseen LLDP frame is no recabling)."""
    wanted = ((NetvalTopologyLabel.LEAF.value, desired), (NetvalTopologyLabel.SPINE.value, spines))
    changes: dict[str, LabelPatch] = {}
    for node, labels in current.items():
        patch: LabelPatch = {}
        for key, values in wanted:
            have = labels.get(key)
            want = (values or {}).get(node)
            if want is not None and have != want:
                patch[key] = want
            elif want is None and node not in publishing and have is not None:
                patch[key] = None
        if patch:
            changes[node] = patch
    return changes


__all__ = [
    "LEAF",
    "OWN_LEVEL_KEYS",
    "SPINE",
    "LabelPatch",
    "current_values",
    "desired_leaves",
    "label_value",
    "leaf_of",
    "plan_label_changes",
    "publishes",
]
