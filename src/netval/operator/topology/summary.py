"""`status.topology` (pure): the levels in use with their domains, which nodes discovered
nothing (and one reason why), and the disagreements of `topology.agreement`.

Aggregates only, each list capped (netval.model.topology), so the status stays small at any
fleet size: bench/topology_fold.py measures it at 10,000 nodes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from netval.model.spec import TopologySpec
from netval.model.topology import (
    MAX_DOMAINS_PER_LEVEL,
    MAX_LISTED_DISAGREEMENTS,
    MAX_NAMED_NODES,
    ConflictEntry,
    DisagreementEntry,
    LevelDomain,
    LevelSummary,
    TopologyStatus,
    Undiscovered,
)
from netval.operator.topology.agreement import (
    Agreement,
    NetdevView,
    judge_agreement,
    levels_in_use,
)


@dataclass(frozen=True, slots=True)
class TopologyFold:
    status: TopologyStatus
    agreement: Agreement


def fold_topology(
    spec: TopologySpec,
    targeted: Iterable[str],
    labels: Mapping[str, Mapping[str, str]],
    seen: Mapping[str, Sequence[NetdevView]],
) -> TopologyFold:
    """`seen`: the `netdev_views` of the fresh targeted nodes' topology sections."""
    nodes = sorted(targeted)
    levels = levels_in_use(spec, (labels.get(n, {}) for n in nodes))
    agreement = judge_agreement(labels, seen, levels[-1] if levels else None, spec.agreement)
    summaries = [_level(key, nodes, labels) for key in levels]
    missing = sorted(n for n, views in seen.items() if any(v[1] is None for v in views))
    example = next((v[3] for v in seen[missing[0]] if v[3]), None) if missing else None
    status = TopologyStatus(
        levels=summaries,
        levels_source="declared" if spec.levels else ("detected" if levels else "none"),
        discovered=sum(1 for vs in seen.values() if vs and all(v[1] is not None for v in vs)),
        undiscovered=Undiscovered(
            count=len(missing), nodes=missing[:MAX_NAMED_NODES], example=example
        ),
        disagreements=len(agreement.disagreements),
        listed_disagreements=[
            DisagreementEntry(
                node=d.node, interface=d.interface, declared=d.declared, seen=d.seen,
                expected=d.expected,
            )
            for d in agreement.disagreements[:MAX_LISTED_DISAGREEMENTS]
        ],
        conflicts=len(agreement.conflicts),
        listed_conflicts=[
            ConflictEntry(domain=c.domain, interface=c.interface, switches=dict(c.switches[:8]))
            for c in agreement.conflicts[:MAX_LISTED_DISAGREEMENTS]
        ],
    )  # fmt: skip
    return TopologyFold(status, agreement)


def _level(key: str, nodes: list[str], labels: Mapping[str, Mapping[str, str]]) -> LevelSummary:
    sizes: Counter[str] = Counter()
    unlabelled = 0
    for node in nodes:
        value = labels.get(node, {}).get(key)
        if value is None:
            unlabelled += 1
        else:
            sizes[value] += 1
    return LevelSummary(
        key=key,
        domains=len(sizes),
        min_nodes=min(sizes.values(), default=0),
        max_nodes=max(sizes.values(), default=0),
        unlabelled=unlabelled,
        listed=[LevelDomain(name=d, nodes=sizes[d]) for d in sorted(sizes)[:MAX_DOMAINS_PER_LEVEL]],
    )


__all__ = ["TopologyFold", "fold_topology"]
