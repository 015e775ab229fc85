"""The Kueue `Topology` object netval generates from the levels in use (declared or
detected, `kubernetes.io/hostname` last), and what to do about the one the cluster holds.
Pure: the reconciler (not written yet) reads the cluster and applies the decision.

Kueue serves `kueue.x-k8s.io/v1beta2` (from v0.15) and `v1beta1`; the object is written in
the newest version the cluster serves. `spec.levels` is immutable (Kueue v0.19), so a change
of levels replaces the object (delete, then create); the same levels leave it alone. A
ResourceFlavor is the user's: it points at the Topology by `spec.topologyName`
(docs/topology.md, "Kueue").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any, Final

from netval.model.keys import MANAGED_BY_OPERATOR, LabelKey

KUEUE_GROUP: Final = "kueue.x-k8s.io"
SERVED_PREFERENCE: Final = ("v1beta2", "v1beta1")
MAX_LEVELS: Final = {"v1beta2": 16, "v1beta1": 8}


class TopologyAction(StrEnum):
    CREATE = "create"
    REPLACE = "replace"  # levels changed: delete, then create (levels are immutable)
    NONE = "none"


def topology_version(served: Iterable[str]) -> str | None:
    """The version to write, from the versions the cluster serves for kueue.x-k8s.io."""
    offered = set(served)
    return next((v for v in SERVED_PREFERENCE if v in offered), None)


def kueue_levels(levels: Sequence[str]) -> list[str]:
    """`levels` with kubernetes.io/hostname last (Kueue allows it only there)."""
    keys = [k for k in dict.fromkeys(levels) if k != LabelKey.HOSTNAME.value]
    return [*keys, LabelKey.HOSTNAME.value]


def topology_object(
    name: str, validation: str, levels: Sequence[str], version: str
) -> dict[str, Any]:
    keys = kueue_levels(levels)[-MAX_LEVELS[version] :]
    return {
        "apiVersion": f"{KUEUE_GROUP}/{version}",
        "kind": "Topology",
        "metadata": {
            "name": name,
            "labels": {
                LabelKey.MANAGED_BY.value: MANAGED_BY_OPERATOR,
                LabelKey.VALIDATION.value: validation,
            },
        },
        "spec": {"levels": [{"nodeLabel": k} for k in keys]},
    }


def topology_action(
    existing: Mapping[str, Any] | None, desired: Mapping[str, Any]
) -> TopologyAction:
    if existing is None:
        return TopologyAction.CREATE
    have = [
        level.get("nodeLabel")
        for level in ((existing.get("spec") or {}).get("levels") or [])
        if isinstance(level, Mapping)
    ]
    want = [level["nodeLabel"] for level in desired["spec"]["levels"]]
    return TopologyAction.NONE if have == want else TopologyAction.REPLACE


__all__ = [
    "TopologyAction",
    "kueue_levels",
    "topology_action",
    "topology_object",
    "topology_version",
]
