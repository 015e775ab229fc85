"""What fleet consistency costs the operator at 10,000 nodes: the first fold, a steady round
of unchanged fingerprints, and one node changing firmware.

Run from the repository root:

    python bench/consistency_fold.py                 # 10,000 nodes, 4 cohorts: times
    python bench/consistency_fold.py --memory        # the same, tracemalloc peaks
    python bench/consistency_fold.py --nodes 1000

Each node reports the 22 facts a ConnectX-7 RoCE node gives (examples/snapshots/healthy-roce
plus a kernel release), 1 % of them on another firmware; four NIC models make four cohorts of
2,500. The reports are built before the clock starts (decoding is bench/ingest.py's business);
what is timed is the operator's path after `ingest_report` accepted a report: `fold_report`
(digest, compare, and on change the cohort's re-judgement and the records' update), then the
bounded `status.consistency` a status write carries. Memory: tracemalloc's peak over each
phase, and what the fleet keeps (current after the first fold).
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

from netval.agent.collect.snapshot_dir import load_snapshot
from netval.agent.facts import node_facts
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult, Report
from netval.model.spec import NetworkValidationSpec
from netval.operator.consistency.ingest import apply_changes, configure_spec, fold_report
from netval.operator.consistency.status import consistency_status
from netval.operator.state import validation as vs

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("15B3:1021", "15B3:101D", "14E4:1760", "8086:1592")
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def reports(n: int, base: dict[str, str], at: datetime, odd_fw: set[int]) -> list[Report]:
    result = CheckResult(
        check=CheckId.MTU_INTERFACE, subject="eth0", status=Status.PASS, message="ok"
    )
    out = []
    for i in range(n):
        facts = dict(base, nic_model=MODELS[i % len(MODELS)])
        if i in odd_fw:
            facts["fw_ver"] = "28.38.1000"
        out.append(
            Report(validation="v", generation=1, node=f"node-{i:05d}", started_at=at,
                   duration_ms=1.0, status=Status.PASS, results=[result], facts=facts)
        )  # fmt: skip
    return out


def timed(label: str, fn: object, per: int | None = None) -> None:
    """Wall time with tracemalloc off (it slows allocation several-fold); the peak is
    measured by the --memory run."""
    traced = tracemalloc.is_tracing()
    if traced:
        tracemalloc.reset_peak()
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    elapsed = time.perf_counter() - t0
    if traced:
        current, peak = tracemalloc.get_traced_memory()
        print(f"{label:<48} peak {peak / 2**20:6.1f} MiB, after {current / 2**20:6.1f} MiB")
        return
    each = f", {elapsed / per * 1e6:.2f} us per report" if per else ""
    print(f"{label:<48} {elapsed * 1000:9.1f} ms{each}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--memory", action="store_true", help="tracemalloc peaks, not times")
    args = parser.parse_args()
    n = args.nodes
    base = node_facts(load_snapshot(ROOT / "examples/snapshots/healthy-roce").last,
                      kernel_release="6.8.0-1015-nvidia")  # fmt: skip
    odd = set(range(0, n, 100))  # 1 %
    first = reports(n, base, NOW, odd)
    later = NOW + timedelta(seconds=30)
    again = reports(n, base, later, odd)
    change_at = later + timedelta(seconds=30)
    (changed,) = reports(1, base, change_at, set())
    changed = changed.model_copy(update={"node": "node-00004", "facts": {**base,
        "nic_model": MODELS[0], "fw_ver": "28.38.1000"}})  # fmt: skip

    state = vs.ValidationState(name="v", generation=1, interval_seconds=30)
    vs.set_targeted(state, [r.node for r in first], NOW)
    spec = NetworkValidationSpec()
    configure_spec(state, spec, NOW)
    for r in first:
        vs.ingest_report(state, r, NOW)
    print(f"{n} nodes, {len(base)} facts each, {len(MODELS)} cohorts, {len(odd)} outliers")
    if args.memory:
        tracemalloc.start()

    def first_fold() -> None:
        for r in first:
            fold_report(state, r, spec, {}, NOW)
        apply_changes(state, NOW)  # what the next health read (gating, status) does

    timed("first fold (all fingerprints new, 4 judgements)", first_fold, n)
    assert sum(1 for v in state.fleet_verdicts.values() if v.status is Status.WARN) == len(odd)
    for r in again:
        vs.ingest_report(state, r, later)

    def steady() -> None:
        for r in again:
            fold_report(state, r, spec, {}, later)
        apply_changes(state, later)

    timed("steady round (all fingerprints unchanged)", steady, n)
    vs.ingest_report(state, changed, change_at)

    def one_change() -> None:
        fold_report(state, changed, spec, {}, change_at)
        apply_changes(state, change_at)

    timed("one node changes firmware (1 cohort re-judged)", one_change)
    assert state.fleet_verdicts["node-00004"].status is Status.WARN
    timed("status.consistency (bounded summary)",
          lambda: consistency_status(state.fleet, max_named=10))  # fmt: skip
    if args.memory:
        tracemalloc.stop()


if __name__ == "__main__":
    main()
