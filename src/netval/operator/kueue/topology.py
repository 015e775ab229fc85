"""The nodes a Workload's admission places it on (Topology-Aware Scheduling)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from netval.model.keys import LabelKey


def topology_domains(assignment: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(levels, [values per level] per domain) of a podSetAssignment's topologyAssignment,
    in Kueue v1beta1 (`domains`) or v1beta2 (`slices`, with prefix/suffix/roots or
    universalValue) form."""
    ta = assignment.get("topologyAssignment") or {}
    levels = [str(level) for level in ta.get("levels") or []]
    domains: list[list[str]] = []
    for domain in ta.get("domains") or []:
        domains.append([str(v) for v in domain.get("values") or []])
    for piece in ta.get("slices") or []:
        count = int(piece.get("domainCount") or 0)
        per_level: list[list[str]] = []
        for lv in piece.get("valuesPerLevel") or []:
            if lv.get("universalValue") is not None:
                per_level.append([str(lv["universalValue"])] * count)
            else:
                prefix, suffix = lv.get("prefix") or "", lv.get("suffix") or ""
                per_level.append([f"{prefix}{root}{suffix}" for root in lv.get("roots") or []])
        for i in range(count):
            domains.append([values[i] if i < len(values) else "" for values in per_level])
    return levels, domains


def assigned_nodes(
    admission: Mapping[str, Any] | None, node_labels: Mapping[str, Mapping[str, str]]
) -> list[str]:
    """The nodes a Workload's admission places it on, where it says (Topology-Aware
    Scheduling); [] when it names flavors only (a flavor is a pool: the validation's Healthy
    condition judges the pool)."""
    nodes: set[str] = set()
    for psa in (admission or {}).get("podSetAssignments") or []:
        levels, domains = topology_domains(psa)
        if not levels:
            continue
        for values in domains:
            selector = dict(zip(levels, values, strict=False))
            if LabelKey.HOSTNAME in selector:
                host = selector[LabelKey.HOSTNAME]
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
