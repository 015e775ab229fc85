"""The nodes a Workload's admission places it on (Topology-Aware Scheduling).

A `status.admission.podSetAssignments[].topologyAssignment` comes in two shapes, as Kueue
defines them (apis/kueue/v1beta1 and v1beta2, workload_types.go):

- v1beta1: `{levels: [...], domains: [{values: [one per level], count}]}`;
- v1beta2 (served from Kueue v0.15): `{levels: [...], slices: [{domainCount,
  valuesPerLevel: [one per level: {universal: v} | {individual: {prefix?, suffix?, roots}}],
  podCounts: {universal: n} | {individual: [one per domain]}}]}`. Domain i of a slice has,
  at each level, the universal value or prefix + roots[i] + suffix, and universal or
  individual[i] pods -- Kueue's own expansion (pkg/util/tas, `InternalSeqFrom`).

A Workload read in either version is the same object (Kueue converts between them); each
shape is read in full, whichever the object carries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from netval.model.keys import LabelKey


@dataclass(frozen=True, slots=True)
class Domain:
    """One topology domain of an assignment: a value per level, and how many pods it gets."""

    values: tuple[str, ...]
    count: int


def topology_domains(assignment: Mapping[str, Any]) -> tuple[list[str], list[Domain]]:
    """(levels, domains) of a podSetAssignment's topologyAssignment (([], []) without one)."""
    ta = assignment.get("topologyAssignment") or {}
    levels = [str(level) for level in ta.get("levels") or []]
    domains = [
        Domain(tuple(str(v) for v in d.get("values") or []), _int(d.get("count")))
        for d in ta.get("domains") or []
        if isinstance(d, Mapping)
    ]
    for piece in ta.get("slices") or []:
        if isinstance(piece, Mapping):
            domains.extend(_slice_domains(piece))
    return levels, domains


def _slice_domains(piece: Mapping[str, Any]) -> list[Domain]:
    count = _int(piece.get("domainCount"))
    per_level = [_level_values(lv, count) for lv in piece.get("valuesPerLevel") or []]
    pods = _pod_counts(piece.get("podCounts"), count)
    return [Domain(tuple(values[i] for values in per_level), pods[i]) for i in range(count)]


def _level_values(level: Any, count: int) -> list[str]:
    """The value at one level of each of a slice's `count` domains. The API server refuses
    roots of another length than domainCount; a missing one reads as "" (matches no node)."""
    level = level if isinstance(level, Mapping) else {}
    if level.get("universal") is not None:
        return [str(level["universal"])] * count
    individual = level.get("individual") or {}
    prefix, suffix = individual.get("prefix") or "", individual.get("suffix") or ""
    roots = [str(root) for root in individual.get("roots") or []]
    return [f"{prefix}{roots[i]}{suffix}" if i < len(roots) else "" for i in range(count)]


def _pod_counts(counts: Any, domains: int) -> list[int]:
    counts = counts if isinstance(counts, Mapping) else {}
    if counts.get("universal") is not None:
        return [_int(counts["universal"])] * domains
    individual: Sequence[Any] = counts.get("individual") or []
    return [_int(individual[i]) if i < len(individual) else 0 for i in range(domains)]


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


# Kueue's annotations (and the Workload's podSets[].topologyRequest fields they become) that
# say how a pod set is cut into slices, each placed in one domain of a level
# (apis/kueue/v1beta2/workload_types.go PodSetTopologyRequest; the KEP-2724 annotations)
SLICE_TOPOLOGY: Final = "kueue.x-k8s.io/podset-slice-required-topology"
SLICE_SIZE: Final = "kueue.x-k8s.io/podset-slice-size"
SLICE_ANNOTATIONS: Final = (SLICE_TOPOLOGY, SLICE_SIZE)


@dataclass(frozen=True, slots=True)
class DomainNeed:
    """A domain above nodes (a rack, a block) and how many healthy nodes it must have."""

    selector: tuple[tuple[str, str], ...]  # (level, value) per level of the assignment
    nodes: tuple[str, ...]  # the nodes whose labels match every level
    needed: int  # ceil(pods / pods per node), summed over the pod sets placed there

    def describe(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.selector)


@dataclass(frozen=True, slots=True)
class Placement:
    named: tuple[str, ...] = ()  # nodes a hostname level names, sorted
    domains: tuple[DomainNeed, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.named and not self.domains

    @property
    def nodes(self) -> frozenset[str]:
        """Every node it names or places it among."""
        return frozenset({*self.named, *(n for d in self.domains for n in d.nodes)})


def pods_per_node(workload: Mapping[str, Any]) -> dict[str, int]:
    """Per pod set name, the pods Kueue packs on one node, where the Workload says so: a
    slice required at the hostname level (`topologyRequest.podSetSliceRequiredTopology:
    kubernetes.io/hostname` and its `podSetSliceSize`, or the pod template's annotations
    they come from) puts a slice's pods on one node. Otherwise one pod per node (the
    conservative reading: it needs the most nodes)."""
    out: dict[str, int] = {}
    for ps in ((workload.get("spec") or {}).get("podSets")) or []:
        if not isinstance(ps, Mapping):
            continue
        request = ps.get("topologyRequest") or {}
        level = request.get("podSetSliceRequiredTopology")
        size = request.get("podSetSliceSize")
        annotations = ps.get("annotations") or {}
        if level is None:
            level, size = annotations.get(SLICE_TOPOLOGY), annotations.get(SLICE_SIZE)
        if level == LabelKey.HOSTNAME and _int(size) > 0:
            out[str(ps.get("name"))] = _int(size)
    return out


class NodeIndex:
    """The nodes by the label values an assignment names: by `kubernetes.io/hostname` and
    by (level, value) of every label kept (hostname and topology levels), built once per
    change of the Nodes' labels, so a placement is found by lookups, not by scanning every
    node per domain."""

    __slots__ = ("by_label",)

    def __init__(self, node_labels: Mapping[str, Mapping[str, str]]) -> None:
        self.by_label: dict[tuple[str, str], list[str]] = {}
        for node, labels in node_labels.items():
            for item in labels.items():
                found = self.by_label.get(item)
                if found is None:
                    self.by_label[item] = [node]
                else:
                    found.append(node)

    def matching(self, selector: Sequence[tuple[str, str]]) -> list[str]:
        """The nodes whose labels carry every (key, value) of `selector`."""
        if not selector:
            return []
        sets = sorted((self.by_label.get(item, []) for item in selector), key=len)
        if len(sets) == 1:
            return list(sets[0])
        rest = [set(s) for s in sets[1:]]
        return [n for n in sets[0] if all(n in s for s in rest)]


def placement(
    admission: Mapping[str, Any] | None,
    node_labels: Mapping[str, Mapping[str, str]] | NodeIndex,
    per_node: Mapping[str, int] | None = None,
) -> Placement:
    """Where a Workload's admission places it (Topology-Aware Scheduling); empty when it
    names flavors only (a flavor is a pool: the validation judges the pool).

    A domain with a `kubernetes.io/hostname` level names its node: the node with that
    hostname label, else the node of that name (Kueue takes the value as the node name). A
    domain of other levels only (a rack, a block) needs, of the nodes whose labels match all
    its levels, as many healthy ones as its pods take nodes (`per_node`, `pods_per_node`).
    Domains without pods are skipped, as Kueue skips them. `node_labels`: the Nodes' kept
    labels, or a `NodeIndex` of them (the controller keeps one)."""
    index = node_labels if isinstance(node_labels, NodeIndex) else NodeIndex(node_labels)
    named: set[str] = set()
    needs: dict[tuple[tuple[str, str], ...], int] = {}
    for psa in (admission or {}).get("podSetAssignments") or []:
        levels, domains = topology_domains(psa)
        pack = max(1, (per_node or {}).get(str(psa.get("name")), 1))
        for domain in domains:
            if not levels or domain.count <= 0:
                continue
            selector = dict(zip(levels, domain.values, strict=False))
            host = selector.get(LabelKey.HOSTNAME)
            if host is not None:
                named.update(index.by_label.get((LabelKey.HOSTNAME, host)) or [host])
            else:
                key = tuple(sorted(selector.items()))
                needs[key] = needs.get(key, 0) + -(-domain.count // pack)
    wanted = [
        DomainNeed(key, tuple(sorted(index.matching(key))), needed)
        for key, needed in sorted(needs.items())
    ]
    return Placement(tuple(sorted(named)), tuple(wanted))


def assigned_nodes(
    admission: Mapping[str, Any] | None, node_labels: Mapping[str, Mapping[str, str]]
) -> list[str]:
    """Every node a Workload's admission names or places it among (`placement`)."""
    return sorted(placement(admission, node_labels).nodes)


def admission_pods(admission: Mapping[str, Any] | None) -> int:
    """The pods a Workload's admission places (the sum of its podSetAssignments' counts)."""
    return sum(
        _int(psa.get("count"))
        for psa in (admission or {}).get("podSetAssignments") or []
        if isinstance(psa, Mapping)
    )
