"""The Kueue `Topology` object netval generates from the levels in use (declared or
detected, `kubernetes.io/hostname` last), and what to do about the one the cluster holds.
Pure: the reconciler (`kueue_writer`) reads the cluster and applies the decision.

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
TOPOLOGY_PLURAL: Final = "topologies"


class TopologyAction(StrEnum):
    CREATE = "create"
    REPLACE = "replace"  # levels changed: delete, then create (levels are immutable)
    NONE = "none"


def topology_version(served: Iterable[str]) -> str | None:
    """The version to write, from the versions the cluster serves for kueue.x-k8s.io."""
    offered = set(served)
    return next((v for v in SERVED_PREFERENCE if v in offered), None)


def serves_topologies(resources: Iterable[str]) -> bool:
    """Whether a version's resources (its APIResourceList's names) include `topologies`:
    a Kueue older than the Topology beta serves Workloads in versions without it."""
    return TOPOLOGY_PLURAL in set(resources)


def topology_name(validation: str, name: str | None) -> str:
    """The Topology's name: spec.topology.publishKueueTopology.name, else netval-<validation>
    (cut to a valid object name)."""
    return name or f"netval-{validation}"[:253].rstrip("-.")


def kueue_levels(levels: Sequence[str]) -> list[str]:
    """`levels` with kubernetes.io/hostname last (Kueue allows it only there)."""
    keys = [k for k in dict.fromkeys(levels) if k != LabelKey.HOSTNAME.value]
    return [*keys, LabelKey.HOSTNAME.value]


def topology_object(
    name: str,
    validation: str,
    levels: Sequence[str],
    version: str,
    owner: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The Topology; with `owner` (the NetworkValidation's {apiVersion, kind, metadata: {name,
    uid}}) an ownerReference, so the garbage collector deletes it with the validation even
    when no operator runs."""
    keys = kueue_levels(levels)[-MAX_LEVELS[version] :]
    obj: dict[str, Any] = {
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
    meta = (owner or {}).get("metadata") or {}
    if owner is not None and meta.get("uid"):
        obj["metadata"]["ownerReferences"] = [
            {
                "apiVersion": owner.get("apiVersion"),
                "kind": owner.get("kind"),
                "name": meta.get("name"),
                "uid": meta["uid"],
            }
        ]
    return obj


def levels_of(obj: Mapping[str, Any]) -> tuple[str, ...]:
    """The nodeLabel keys of a Topology object, top first."""
    return tuple(
        str(level.get("nodeLabel"))
        for level in ((obj.get("spec") or {}).get("levels") or [])
        if isinstance(level, Mapping)
    )


def topology_action(
    existing: Mapping[str, Any] | None, desired: Mapping[str, Any]
) -> TopologyAction:
    if existing is None:
        return TopologyAction.CREATE
    return (
        TopologyAction.NONE if levels_of(existing) == levels_of(desired) else TopologyAction.REPLACE
    )


__all__ = [
    "TOPOLOGY_PLURAL",
    "TopologyAction",
    "kueue_levels",
    "levels_of",
    "serves_topologies",
    "topology_action",
    "topology_name",
    "topology_object",
    "topology_version",
]
