"""What one node-gating round's decisions cost with the breaker covering labels.

    python bench/gating_round.py [--rounds 20]

For 1,000 and 10,000 targeted nodes with 1 %, 9 % and 30 % failing (taints on, the default
maxUnhealthyPercent 10 %), it prints the median wall time of one round of the node writer's
pure decisions (`decide_taints`, `decide_labels`, `merge_labels`, `plan_changes`) on a
previously healthy pool, the Node writes that round plans, and the writes of the round after
(0: the breaker's choice is stable). Pure CPU: no broker, no Kubernetes.
"""

from __future__ import annotations

import argparse
import statistics
import time

from netval.model.keys import FabricHealth
from netval.operator.gating import decisions as gating


def one_round(
    v: gating.GatingInput, nodes: dict[str, tuple[str | None, bool]]
) -> list[gating.NodeChange]:
    taints = gating.decide_taints(v, [n for n, (_, t) in nodes.items() if t])
    labels = gating.decide_labels(v, {n: label for n, (label, _) in nodes.items()}, taints.tainted)
    return gating.plan_changes(nodes, gating.merge_labels([(v, labels)]), taints.tainted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(f"{'nodes':>6} {'failing':>7} {'median ms':>9} {'writes':>6} {'then':>4}")
    for size in (1_000, 10_000):
        names = [f"node-{i:05d}" for i in range(size)]
        for percent in (1, 9, 30):
            count = size * percent // 100
            bad = {names[i * size // count] for i in range(count)}
            v = gating.GatingInput(
                name="pool", targeted=frozenset(names), node_label=True, taint=True,
                max_unhealthy_percent=10.0, recovery_reports=3,
                health={n: FabricHealth.UNHEALTHY if n in bad else FabricHealth.HEALTHY
                        for n in names},
                ok_streak={},
            )  # fmt: skip
            times = []
            for _ in range(args.rounds):
                nodes: dict[str, tuple[str | None, bool]] = {n: ("healthy", False) for n in names}
                start = time.perf_counter()
                changes = one_round(v, nodes)
                times.append(time.perf_counter() - start)
            for c in changes:
                nodes[c.node] = (c.label.value if c.label is not None else None, c.taint)
            then = len(one_round(v, nodes))
            ms = statistics.median(times) * 1000
            print(f"{size:>6} {percent:>6}% {ms:>9.1f} {len(changes):>6} {then:>4}")


if __name__ == "__main__":
    main()
