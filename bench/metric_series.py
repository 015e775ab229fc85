"""Series one agent exposes for its check statuses: peer names as labels vs peer domains.

Run from the repository root:

    python bench/metric_series.py [--nodes 1000] [--domains 10] [--samples 2] [--cycles 120]

One agent of a fleet of `--nodes` nodes in `--domains` topology domains probes, every cycle,
the peers the real selection (`netval.model.peer_selection`) picks: `--samples` per domain
(the spec's default is 2), four peer checks each. The same results go through

  (a) the old labelling: `netval_check_status{check, subject=<peer node>, status}`, value 1
      for the current status only (what the agent exposed before);
  (b) today's `AgentMetrics`: `netval_check_status` (node and storage checks only) and
      `netval_peer_check_status` / `netval_peer_results` by `peer_domain`, as state sets;

and counts, over `--cycles` cycles (an hour at a 30 s interval by default), the series per
scrape and the distinct series Prometheus would have ingested (each one a head series with its
own index entry until it is compacted away), and how many started after the first scrape (churn: each a new head series).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from netval.agent.metrics import AgentMetrics
from netval.agent.peers.target import PeerTarget, peer_result
from netval.model import CheckId, CheckResult, Report, Status
from netval.model.peer_selection import peers_for_cycle, plan_peers
from netval.model.results import node_status

PEER_CHECKS = (CheckId.PEER_LATENCY, CheckId.PEER_LOSS, CheckId.PEER_PATH_MTU)
NODE_RESULTS = [
    CheckResult(check=c, subject=s, status=Status.PASS, message="ok")
    for c in (CheckId.LINK_CARRIER, CheckId.MTU_INTERFACE, CheckId.PFC_PRIORITIES)
    for s in (f"ens{i}np0" for i in range(8))
]
STATUS_FAMILIES = ("netval_check_status", "netval_peer_check_status", "netval_peer_results")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--domains", type=int, default=10)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--cycles", type=int, default=120)
    args = parser.parse_args()

    domain_of = {f"gpu-{i:05d}": f"block-{i % args.domains}" for i in range(args.nodes)}
    me = "gpu-00000"
    plan = plan_peers(me, domain_of[me], domain_of)
    metrics = AgentMetrics(interval_seconds=30)
    old_seen: Counter[tuple[str, ...]] = Counter()
    new_seen: Counter[str] = Counter()
    old_per_scrape, new_per_scrape = [], []
    old_started = new_started = 0  # series present in a scrape but not in the one before
    old_before: set[tuple[str, ...]] = set()
    new_before: set[str] = set()
    for cycle in range(args.cycles):
        results = list(NODE_RESULTS)
        for peer in peers_for_cycle(plan, args.samples, cycle):
            target = PeerTarget(node=peer, address="10.0.0.1", port=7480, domain=domain_of[peer])
            # 1 in 200 probes fails, so statuses change too
            failing = hash((peer, cycle)) % 200 == 0
            for check in PEER_CHECKS:
                results.append(
                    peer_result(check, target, Status.FAIL if failing else Status.PASS, "x")
                )
            results.append(peer_result(CheckId.PEER_THROUGHPUT, target, Status.SKIP, "x"))
        # (a) the old labelling: one series per (check, subject, current status)
        old = {(r.check.value, r.subject, r.status.value) for r in results}
        old_per_scrape.append(len(old))
        old_seen.update(old)
        old_started += len(old - old_before) if cycle else 0
        old_before = old
        # (b) today's metrics, collected as a scrape would
        report = Report(
            validation="v",
            generation=1,
            node=me,
            started_at=datetime.now(UTC),
            duration_ms=1.0,
            status=node_status(results),
            results=results,
        )
        metrics.observe(report, "interval")
        new = {
            str((s.name, *sorted(s.labels.items())))
            for family in metrics.registry.collect()
            if family.name in STATUS_FAMILIES
            for s in family.samples
        }
        new_per_scrape.append(len(new))
        new_seen.update(new)
        new_started += len(new - new_before) if cycle else 0
        new_before = new

    print(
        f"fleet {args.nodes} nodes in {args.domains} domains, {args.samples} peers per domain "
        f"per cycle, {len(PEER_CHECKS) + 1} peer checks, {args.cycles} cycles"
    )
    print(f"{'':38} {'peer names (old)':>18} {'peer domains (now)':>20}")
    print(
        f"{'series per scrape (median)':38} {statistics.median(old_per_scrape):>18.0f} "
        f"{statistics.median(new_per_scrape):>20.0f}"
    )
    print(f"{'distinct series over the run':38} {len(old_seen):>18} {len(new_seen):>20}")
    print(f"{'series started after the first scrape':38} {old_started:>18} {new_started:>20}")
    print(f"ratio of distinct series, old / now: {len(old_seen) / len(new_seen):.1f}x")


if __name__ == "__main__":
    main()
