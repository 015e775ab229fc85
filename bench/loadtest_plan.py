"""What a NetworkLoadTest costs the operator: planning a run and aggregating its results,
for 1,000 and 10,000 simulated nodes.

    python bench/loadtest_plan.py [--runs 3] [--nodes 1000 10000] [--per-leaf 32]

Nodes sit in leaves of PER_LEAF (the topology domains); 1 % are gated, 1 % stale and 2 %
busy (skipped), the spec is the default (`crossDomain` pairs, both phases, one storage
endpoint, duration 20s). For each size, medians of RUNS runs (pure CPU, one process):

1. plan: `plan_run` (participants and every stage's timing) - time and tracemalloc peak.
2. publish one stage: `build_plans(plan, stage)` for a cross round (one `LoadPlan` per node,
   validated) and their JSON - time, peak, bytes per message and per stage.
3. fold one stage: decode every node's result message of that round (`decode_result`, as
   the subscriber will) and fold it (`Aggregator.add`) - time per stage and per message.
4. the whole run (WHOLE_RUNS passes, default 1): fold every stage's results (synthetic, built without validation: the
   decode cost is item 3's) and `Aggregator.finish` - time, the aggregator's retained memory
   (tracemalloc, one traced pass), the status JSON size.

It also prints what the run costs the fabric in time: stages and the run's wall time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from netval.model.loadplan import (
    FlowResult,
    LatencyResult,
    LoadResult,
    StorageResult,
    decode_result,
    encode,
    latency_bucket,
)
from netval.model.loadtest import Expectations, NetworkLoadTestStatus
from netval.model.spec import NetworkValidationSpec
from netval.operator.loadtest.aggregate import Aggregator, Received
from netval.operator.loadtest.plan import Candidate, RunPlan, Stage, WindowKind, plan_run
from netval.operator.loadtest.tasks import build_plans
from netval.operator.loadtest.validate import RunSettings, settle

NOW = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
T = TypeVar("T")

VALIDATION = NetworkValidationSpec.model_validate(
    {
        "checks": {
            "peers": {"enabled": True},
            "storage": {
                "endpoints": [{"name": "datasets", "protocol": "s3", "host": "s3", "path": "/b/o"}]
            },
        }
    }
)


def candidates(nodes: int, per_leaf: int) -> list[Candidate]:
    return [
        Candidate(
            node=f"gpu-{i:05d}",
            domain=f"leaf-{i // per_leaf:03d}",
            fresh=i % 100 != 1,
            busy=i % 50 == 2,
            gated=i % 100 == 3,
        )
        for i in range(nodes)
    ]


def settings() -> RunSettings:
    s = settle({"validation": "pool"}, VALIDATION)
    assert isinstance(s, RunSettings)
    return s


def make_plan(cands: list[Candidate]) -> RunPlan:
    plan = plan_run(settings(), cands, run_id="bench-1", now=NOW, seed=1)
    assert isinstance(plan, RunPlan)
    return plan


def results(plan: RunPlan, stage: Stage) -> Iterator[Received]:
    """Each node's result message for one stage, built without validation (synthetic)."""
    flows: dict[str, list[FlowResult]] = {}
    lat: dict[str, list[LatencyResult]] = {}
    reads: dict[str, list[StorageResult]] = {}
    # every round trip in 1%-wide buckets, as agents send them: ~50 buckets
    samples = sorted(Counter(latency_bucket(0.05 * 1.01**i) for i in range(50)).items())
    for w in plan.windows_of(stage):
        for a, b in w.flows:
            if w.kind is WindowKind.IDLE:
                lat.setdefault(a, []).append(
                    LatencyResult.model_construct(window=w.id, peer=b, loaded=False, sent=60,
                                                  received=60, histogram=samples, error=None)
                )  # fmt: skip
            elif w.kind in (WindowKind.INTRA, WindowKind.CROSS):
                flows.setdefault(a, []).append(
                    FlowResult.model_construct(window=w.id, peer=b, rail=0, bytes=10**11,
                                               start=w.measure_start, end=w.end, error=None,
                                               streams=4, port_mbps=400_000.0, cpu_percent=40.0,
                                               remote_cpu_percent=30.0, cpu_demand_percent=45.0,
                                               retransmits=12)
                )  # fmt: skip
                lat.setdefault(a, []).append(
                    LatencyResult.model_construct(window=w.id, peer=b, loaded=True, sent=200,
                                                  received=199, histogram=samples, error=None)
                )  # fmt: skip
            else:
                reads.setdefault(a, []).append(
                    StorageResult.model_construct(window=w.id, endpoint=b, bytes=10**10,
                                                  start=w.measure_start, end=w.end, error=None,
                                                  own_object=False, range_first=None,
                                                  range_last=None)
                )  # fmt: skip
    for node in flows.keys() | lat.keys() | reads.keys():
        yield Received(
            LoadResult.model_construct(
                schema_version=2, run=plan.run_id, stage=stage.index,
                validation=plan.settings.validation, node=node, sent_at=stage.deadline,
                engines={"iperf3": "3.12"}, flows=flows.get(node, []), serves=[],
                latency=lat.get(node, []), storage=reads.get(node, []), unavailable=None,
                error=None,
            ),
            stage.deadline,
        )  # fmt: skip


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def peak(fn: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def whole_run(plan: RunPlan) -> tuple[Aggregator, float]:
    agg = Aggregator(plan)
    elapsed = 0.0
    for stage in plan.stages:
        batch = list(results(plan, stage))
        t0 = time.perf_counter()
        for r in batch:
            agg.add(r)
        elapsed += time.perf_counter() - t0
    return agg, elapsed


def bench(nodes: int, per_leaf: int, runs: int, whole_runs: int) -> None:
    cands = candidates(nodes, per_leaf)
    plan = make_plan(cands)
    cross = next(s for s in plan.stages if s.kind is WindowKind.CROSS)
    run_seconds = (plan.finished_by - NOW).total_seconds()
    print(
        f"\n{nodes} nodes, {len(plan.members)} leaves of <= {per_leaf}: "
        f"{len(plan.domain_of)} take part, {len(plan.skipped)} skipped; {len(plan.stages)} stages "
        f"(1 intra, {sum(s.kind is WindowKind.CROSS for s in plan.stages)} cross, "
        f"{len(plan.settings.endpoints)} storage), the run takes {run_seconds / 60:.1f} min "
        "of fabric time at duration 20s"
    )
    plan_times = [timed(lambda: make_plan(cands))[1] for _ in range(runs)]
    plan_peak = peak(lambda: make_plan(cands))
    print(
        f"  plan:            {statistics.median(plan_times) * 1e3:8.1f} ms   peak {mib(plan_peak)}"
    )

    def publish() -> int:
        return sum(len(encode(p)) for p in build_plans(plan, cross, term=1).values())

    pub = [timed(publish) for _ in range(runs)]
    size = pub[0][0]
    pub_peak = peak(publish)
    per_msg = size / len(plan.domain_of)
    print(
        f"  publish a stage: {statistics.median(t for _, t in pub) * 1e3:8.1f} ms   peak "
        f"{mib(pub_peak)}; {len(plan.domain_of)} plans, {per_msg:.0f} B each, {mib(size)} in all"
    )
    wire = [encode(r.result) for r in results(plan, cross)]

    def fold_stage() -> None:
        agg = Aggregator(plan)
        for payload in wire:
            agg.add(Received(decode_result(payload), cross.deadline))

    folds = [timed(fold_stage)[1] for _ in range(runs)]
    fold = statistics.median(folds)
    print(
        f"  fold a stage:    {fold * 1e3:8.1f} ms   ({fold / len(wire) * 1e6:.0f} us per message "
        f"decoded and folded, {len(wire)} messages of ~{statistics.median(map(len, wire)):.0f} B)"
    )
    totals = []
    finishes = []
    for _ in range(whole_runs):
        agg, folding = whole_run(plan)
        status_run, finish = timed(
            lambda a=agg: a.finish(expect=Expectations(max_oversubscription=1.5), finished_at=NOW)
        )
        totals.append(folding)
        finishes.append(finish)
    size_status = len(NetworkLoadTestStatus(last_run=status_run).model_dump_json(by_alias=True))

    tracemalloc.start()
    agg, _ = whole_run(plan)
    kept = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del agg
    print(
        f"  whole run ({whole_runs}x):  fold {statistics.median(totals):.2f} s (every stage's messages, "
        f"undecoded), finish {statistics.median(finishes) * 1e3:.1f} ms; aggregator holds "
        f"{mib(kept)}; status {size_status / 1024:.1f} KiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--per-leaf", type=int, default=32)
    parser.add_argument(
        "--whole-runs", type=int, default=1, help="whole-run passes (slow at 10,000 nodes)"
    )
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, medians of {args.runs} runs")
    for n in args.nodes:
        bench(n, args.per_leaf, args.runs, args.whole_runs)


if __name__ == "__main__":
    main()
