"""East-west endpoints after a broker restart: messages delivered to agents, before and after
issue 24 (agents read every endpoint, against the operator's per-node peer sets).

    python bench/peer_endpoints.py [--nodes 1000 10000] [--per-domain 32]

A pure count, with the real payloads: the endpoint announcement as `PeerService._announce`
encodes it, the assignment as `netval.operator.ingest.assignments.assignments` builds it
from a real `Store` (nodes labelled with their rack, `per-domain` nodes per rack, the
default `samplesPerDomain` 2 and interval 30 s) and an `EndpointTable` holding every node's
announcement. After a broker restart (retained messages persisted, as the chart's broker
does) each agent resubscribes and the operator republishes its retained assignments once
per new session (`ReportIngest._sync_retained_once`), so an agent receives:

- before: every endpoint of its validation (N) + its assignment, retained + republished (2);
- after: its assignment, retained + republished (2); the operator also receives the N
  endpoints (it did not before).

Also printed: the assignment's size (median / max), what the epoch's republish costs (every
assignment, once per 40 intervals), and the operator's time to build all assignments (the
median of 3 runs; it runs once per status window in which an endpoint, a label or the epoch
changed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from netval.model.spec import NetworkValidationSpec
from netval.operator.ingest.assignments import assignments
from netval.operator.ingest.peer_sets import EPOCH_CYCLES, EndpointTable, coverage_epochs
from netval.operator.state.store import Store

GPU = {"nvidia.com/gpu.present": "true"}
RACK = "topology.kubernetes.io/rack"


def endpoint_payload(i: int, domain: str) -> bytes:
    address = f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"
    doc = {"address": address, "port": 7471, "domain": domain}
    return json.dumps(doc, separators=(",", ":")).encode()


def topic_bytes(validation: str, node: str, kind: str) -> int:
    return len(f"netval/v1/{validation}/{node}/{kind}")


def run(nodes: int, per_domain: int) -> None:
    validation = "roce-training-pool"
    names = [f"gpu-node-{i:05d}" for i in range(nodes)]
    domains = {n: f"rack-{i // per_domain:04d}" for i, n in enumerate(names)}
    store = Store(label_keys={**GPU, RACK: ""})
    for n in names:
        store.on_node(n, {**GPU, RACK: domains[n]})
    spec = NetworkValidationSpec.model_validate(
        {
            "nodeSelector": GPU,
            "interval": "30s",
            "checks": {"peers": {"enabled": True, "topologyKey": RACK}},
        }
    )
    store.upsert_validation(validation, generation=1, spec=spec, body={}, status=None)
    table = EndpointTable()
    endpoint_bytes = 0
    for i, n in enumerate(names):
        payload = endpoint_payload(i, domains[n])
        table.update(validation, n, payload)
        endpoint_bytes += len(payload) + topic_bytes(validation, n, "endpoint")
    now = time.time()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        out = assignments(store, table, now)
        times.append(time.perf_counter() - start)
    sizes = sorted(len(p) for p in out.values())
    assignment_bytes = sum(sizes) + sum(len(t) for t in out)
    # the old assignment: {"domain": ...} only
    old_assignment_bytes = sum(
        len(json.dumps({"domain": domains[n]}).encode()) + topic_bytes(validation, n, "assignment")
        for n in names
    )
    before_msgs = nodes * nodes + 2 * nodes
    before_bytes = nodes * endpoint_bytes + 2 * old_assignment_bytes
    after_msgs = 2 * nodes
    after_bytes = 2 * assignment_bytes
    racks = len(set(domains.values()))
    print(f"\n{nodes:,} nodes, {racks} racks of {per_domain}:")
    print(
        f"  after a broker restart, delivered to agents: before {before_msgs:,} messages "
        f"({before_bytes / 1e6:,.1f} MB); after {after_msgs:,} messages "
        f"({after_bytes / 1e6:,.1f} MB): {before_msgs / after_msgs:,.0f}x fewer messages, "
        f"{before_bytes / after_bytes:,.1f}x fewer bytes"
    )
    print(f"  the operator receives {nodes:,} endpoints ({endpoint_bytes / 1e6:.2f} MB) more")
    print(
        f"  assignment: median {statistics.median(sizes) / 1e3:.1f} kB, "
        f"max {sizes[-1] / 1e3:.1f} kB; built in {statistics.median(times):.2f} s (all nodes)"
    )
    epoch_seconds = EPOCH_CYCLES * spec.interval_seconds
    print(
        f"  epoch republish: {nodes:,} messages, {assignment_bytes / 1e6:,.1f} MB every "
        f"{epoch_seconds / 60:.0f} min ({assignment_bytes / epoch_seconds / 1e3:,.1f} kB/s); "
        f"every pair probed within {coverage_epochs(per_domain, 2, racks)} epochs"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--per-domain", type=int, default=32)
    args = parser.parse_args()
    for nodes in args.nodes:
        run(nodes, args.per_domain)


if __name__ == "__main__":
    main()
