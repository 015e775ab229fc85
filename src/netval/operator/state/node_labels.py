"""Which Node label keys the operator keeps in memory (pure).

A GPU node carries ~200 labels (node-feature-discovery, GPU feature discovery, the cloud's);
10,000 of them held whole are hundreds of MiB of strings. The operator reads only the keys
a validation references (its `nodeSelector` keys, `checks.peers.topologyKey` and
`consistency.cohortLabel`) and those a
Kueue topology level may name (`kubernetes.io/hostname` and every key with `topology` in
it: Kueue's levels are conventionally `*/topology-block`, `*/topology-rack`,
`topology.kubernetes.io/zone`...), so the rest of each Node event is dropped at once.

A validation that references a key the operator did not keep yet makes the runtime list the
Nodes' metadata once (`KubeApi.list_node_labels`) to fill that key in
(`Store.fill_labels`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from netval.model.keys import LabelKey
from netval.model.spec import NetworkValidationSpec

ALWAYS_KEPT: Final = frozenset({LabelKey.HOSTNAME.value})
TOPOLOGY_MARK: Final = "topology"


def referenced_keys(specs: Iterable[NetworkValidationSpec]) -> frozenset[str]:
    """The label keys these specs select on, group peers by or split cohorts by."""
    keys: set[str] = set(ALWAYS_KEPT)
    for spec in specs:
        keys.update(spec.node_selector)
        if spec.checks.peers.enabled:
            keys.add(spec.checks.peers.topology_key)
        if spec.consistency.cohort_label is not None:
            keys.add(spec.consistency.cohort_label)
    return frozenset(keys)


def keeps(key: str, referenced: frozenset[str]) -> bool:
    return key in referenced or TOPOLOGY_MARK in key


def kept_labels(labels: Mapping[str, str], referenced: frozenset[str]) -> dict[str, str]:
    """The labels of a Node the operator keeps (netval's own `netval.io/fabric` never: it is
    read apart, and our writes of it must not look like a selector change)."""
    return {k: v for k, v in labels.items() if k != LabelKey.FABRIC and keeps(k, referenced)}
