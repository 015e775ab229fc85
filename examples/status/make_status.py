"""Regenerate the example status: a 32-node, 4-rack RoCE validation with one bad node and a
narrow link between two racks (a 4:1 capacity ratio), as `kubectl get netval roce-pool -o yaml` shows it.

The east-west summary is computed by the operator's own aggregation (netval.operator.state.east_west_matrix)
from peer results as agents publish them, so it is exactly what a cluster would write.

    python examples/status/make_status.py     # writes roce-pool.yaml, roce-pool-nodes.yaml, roce-pool.html
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from netval.cli.report_html import render_html
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.operator.state.east_west_matrix import east_west

HERE = Path(__file__).resolve().parent
NAME = "roce-pool"
REPORTED = datetime(2025, 6, 12, 8, 30, 0, tzinfo=UTC)
RACKS = [f"rack-{r}" for r in range(1, 5)]
NODES = {f"gpu-r{r}-{i:02d}": f"rack-{r}" for r in range(1, 5) for i in range(1, 9)}
BAD_NODE = "gpu-r3-05"  # PFC off on priority 3 and ECN notification point disabled
NARROW = frozenset({"rack-2", "rack-4"})  # the path between them gives a quarter: 4:1
INTRA_MBPS, CROSS_MBPS, SLOW_MBPS = 381_000.0, 362_000.0, 94_000.0
INTRA_MS, CROSS_MS, SLOW_MS = 0.012, 0.036, 0.094


def _iso(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


def peer_results(prober: str, peer: str) -> list[CheckResult]:
    a, b = NODES[prober], NODES[peer]
    slow = {a, b} == NARROW
    same = a == b
    p50 = INTRA_MS if same else (SLOW_MS if slow else CROSS_MS)
    mbps = INTRA_MBPS if same else (SLOW_MBPS if slow else CROSS_MBPS)
    base: dict[str, Any] = {"domain": b, "address": f"10.{RACKS.index(b) + 1}.0.{peer[-2:]}"}
    return [
        CheckResult(check=CheckId.PEER_LATENCY, subject=peer, status=Status.PASS, message="",
                    observed={**base, "p50Ms": p50, "p99Ms": p50 * 2.5, "jitterMs": p50 / 10,
                              "minMs": p50 * 0.8, "maxMs": p50 * 4, "samples": 50},
                    expected={"maxLatencyMs": 1.0}),
        CheckResult(check=CheckId.PEER_LOSS, subject=peer, status=Status.PASS, message="",
                    observed={**base, "lossPercent": 0.0, "sent": 50, "received": 50},
                    expected={"maxLossPercent": 0.1}),
        CheckResult(check=CheckId.PEER_PATH_MTU, subject=peer, status=Status.PASS, message="",
                    observed={**base, "pathMTU": 9000, "method": "echo"},
                    expected={"pathMTU": 9000}),
        CheckResult(check=CheckId.PEER_THROUGHPUT, subject=peer, status=Status.PASS, message="",
                    observed={**base, "mbps": mbps, "bytes": int(mbps * 125_000), "seconds": 1.0,
                              "ageSeconds": 40.0},
                    expected={"minThroughputRatio": 0.5}),
    ]  # fmt: skip


def condition(kind: str, status: str, reason: str, message: str, since: datetime) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": _iso(since), "observedGeneration": 2}  # fmt: skip


def validation() -> dict[str, Any]:
    results: dict[str, list[CheckResult]] = {n: [] for n in NODES}
    for prober, peer in itertools.permutations(NODES, 2):
        results[prober] += peer_results(prober, peer)
    ew = east_west(results, dict(NODES), min_throughput_ratio=0.5)
    n = len(NODES)
    node_checks = ["link.carrier", "link.flaps", "mtu.interface", "mtu.roce", "rdma.devices",
                   "rdma.port_state", "rdma.rate", "rdma.gid_roce_v2", "pfc.priorities",
                   "pfc.trust", "pfc.pause_storm", "pfc.discards", "ecn.np_enabled",
                   "ecn.rp_enabled", "ecn.cnp_flow"]  # fmt: skip
    failing_checks = {"pfc.priorities", "ecn.np_enabled"}
    checks = {c: {"pass": n - (c in failing_checks), "warn": 0, "fail": int(c in failing_checks)}
              for c in node_checks}  # fmt: skip
    for c in ("peer.latency", "peer.loss", "peer.path_mtu", "peer.throughput"):
        checks[c] = {"pass": n, "warn": 0, "fail": 0}
    return {
        "apiVersion": "netval.io/v1alpha1",
        "kind": "NetworkValidation",
        "metadata": {"name": NAME, "generation": 2, "uid": "5b0e6c2a-8f7e-4a53-9d1e-2f9a4c1e7b10",
                     "creationTimestamp": _iso(REPORTED - timedelta(days=3)),
                     "resourceVersion": "482113"},
        "spec": {
            "nodeSelector": {"netval.io/pool": NAME},
            "interval": "30s",
            "checks": {
                "mtu": {"interfaceMTU": 9000, "roceMTU": 4096},
                "rdma": {"minRateGbps": 400, "requireRoCEv2": True},
                "pfc": {"priorities": [3], "trust": "dscp"},
                "ecn": {},
                "peers": {"enabled": True, "topologyKey": "netval.io/rack",
                          "maxLatencyMs": 1.0, "minThroughputRatio": 0.5},
            },
            "gating": {"nodeLabel": True, "taint": True, "maxUnhealthyPercent": 10},
        },
        "status": {
            "observedGeneration": 2,
            "conditions": [
                condition("Ready", "True", "AgentsReporting", f"all {n} targeted nodes reporting",
                          REPORTED - timedelta(days=2, hours=5)),
                condition("Healthy", "False", "ChecksFailing",
                          f"1 of {n} nodes failing: {BAD_NODE} (ecn.np_enabled, pfc.priorities)",
                          REPORTED - timedelta(minutes=47)),
                condition("Usable", "True", "CapacityAvailable",
                          f"{n - 1} of {n} targeted nodes healthy, 1 failing "
                          f"(maxUnhealthyPercent 10% allows {n // 10}); workloads are kept off the "
                          "failing nodes",
                          REPORTED - timedelta(days=2, hours=5)),
                condition("Gating", "True", "GatingActive", f"1 node tainted ({BAD_NODE})",
                          REPORTED - timedelta(minutes=46)),
            ],
            "nodes": {"targeted": n, "reporting": n, "passing": n - 1, "warning": 0,
                      "failing": 1, "stale": 0},
            "checks": checks,
            "failures": [
                {"node": BAD_NODE, "check": "pfc.priorities", "subject": "ens1np0",
                 "message": "PFC enabled on no priority, expected exactly [3]",
                 "since": _iso(REPORTED - timedelta(minutes=47))},
                {"node": BAD_NODE, "check": "ecn.np_enabled", "subject": "ens1np0/prio3",
                 "message": "ECN notification point disabled on priority 3 "
                            "(/sys/class/net/ens1np0/ecn/roce_np/enable/3 = 0)",
                 "since": _iso(REPORTED - timedelta(minutes=47))},
            ],
            "lastReportTime": _iso(REPORTED),
            "eastWest": ew.to_status(),
        },
    }  # fmt: skip


def nodes() -> list[dict[str, Any]]:
    out = []
    for name, rack in NODES.items():
        node: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "netval.io/pool": NAME, "netval.io/rack": rack,
                "netval.io/fabric": "unhealthy" if name == BAD_NODE else "healthy"}},
        }  # fmt: skip
        if name == BAD_NODE:
            node["spec"] = {"taints": [{"key": "netval.io/fabric-unhealthy", "value": "true",
                                        "effect": "NoSchedule"}]}  # fmt: skip
        out.append(node)
    return out


def main() -> None:
    obj = validation()
    header = "# Generated by examples/status/make_status.py (as `kubectl get netval {} -o yaml`).\n"
    (HERE / f"{NAME}.yaml").write_text(
        header.format(NAME) + yaml.safe_dump(obj, sort_keys=False, width=100)
    )
    listing = {"apiVersion": "v1", "kind": "List", "items": [obj, *nodes()]}
    (HERE / f"{NAME}-nodes.yaml").write_text(
        "# Generated by examples/status/make_status.py (as `kubectl get netval/roce-pool "
        "nodes -l netval.io/pool=roce-pool -o yaml`).\n"
        + yaml.safe_dump(listing, sort_keys=False, width=100)
    )
    (HERE / f"{NAME}.html").write_text(
        render_html(obj, now=REPORTED + timedelta(seconds=20)), encoding="utf-8"
    )


if __name__ == "__main__":
    main()
