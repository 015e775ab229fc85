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
from typing import Any

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


def assigned_nodes(
    admission: Mapping[str, Any] | None, node_labels: Mapping[str, Mapping[str, str]]
) -> list[str]:
    """The nodes a Workload's admission places it on, where it says (Topology-Aware
    Scheduling); [] when it names flavors only (a flavor is a pool: the validation's Healthy
    condition judges the pool).

    A domain with a `kubernetes.io/hostname` level names its node: the node with that
    hostname label, else the node of that name (Kueue takes the value as the node name). A
    domain of other levels only (a rack, a block) names every node whose labels match all its
    levels. Domains without pods are skipped, as Kueue skips them."""
    nodes: set[str] = set()
    for psa in (admission or {}).get("podSetAssignments") or []:
        levels, domains = topology_domains(psa)
        for domain in domains:
            if not levels or domain.count <= 0:
                continue
            selector = dict(zip(levels, domain.values, strict=False))
            host = selector.get(LabelKey.HOSTNAME)
            if host is not None:
                matched = [
                    n for n, labels in node_labels.items() if labels.get(LabelKey.HOSTNAME) == host
                ]
                nodes.update(matched or [host])
            else:
                nodes.update(
                    n
                    for n, labels in node_labels.items()
                    if all(labels.get(k) == v for k, v in selector.items())
                )
    return sorted(nodes)


def admission_pods(admission: Mapping[str, Any] | None) -> int:
    """The pods a Workload's admission places (the sum of its podSetAssignments' counts)."""
    return sum(
        _int(psa.get("count"))
        for psa in (admission or {}).get("podSetAssignments") or []
        if isinstance(psa, Mapping)
    )
