"""NetworkLoadTest verdicts need evidence (pure: the synthetic fabric's results folded by the
aggregator, then the status verdict):

- nothing reported, or too little counted: Failed, InsufficientData;
- a planned cell or endpoint with nothing counted: a NotMeasured breach, Failed;
- failed readers count as 0 MB/s in the minimum and the fairness;
- flows the hosts' CPU limited below the port rate: SenderLimited cells, Inconclusive; flows
  a slow fabric limited (engines idle on the network) are measured;
- unequal domains: the larger side loaded, a ratio at the smaller side's fan-in is Partial
  and kept out of maxOversubscription;
- every rail plane has its own cells;
- a node left out mid-stage takes its flows out of the planned count.
"""

from __future__ import annotations

from typing import Any

import pytest

from loadtest_fabric import NOW, Fabric, answer, leaf_spine, make_plan
from netval.model.loadtest import (
    CellReason,
    Expectations,
    LoadReason,
    LoadRun,
    NetworkLoadTestStatus,
    RunPhase,
    SkipReason,
)
from netval.operator.loadtest import status as st
from netval.operator.loadtest.aggregate import Aggregator, aggregate
from netval.operator.loadtest.plan import RunPlan, WindowKind
from netval.operator.loadtest.rails import NodeRails


def finish(
    plan: RunPlan, expect: Expectations | None = None, **kw: Any
) -> tuple[LoadRun, NetworkLoadTestStatus]:
    fabric = kw.pop("fabric")
    run = aggregate(plan, answer(fabric, plan, **kw), expect=expect or Expectations(),
                    finished_at=plan.finished_by)  # fmt: skip
    status = st.finished(run, generation=1, now=NOW, previous=None, history_limit=3,
                         min_coverage_percent=plan.settings.min_coverage_percent)  # fmt: skip
    NetworkLoadTestStatus.model_validate(status.to_patch())  # what the API server takes
    return run, status


def passed(status: NetworkLoadTestStatus) -> tuple[str, LoadReason]:
    cond = next(c for c in status.conditions if c.type == "Passed")
    return cond.status, cond.reason


def test_a_run_where_no_node_reported_fails_with_insufficient_data() -> None:
    fabric = leaf_spine(2, 3)
    plan = make_plan(fabric)
    run, status = finish(plan, fabric=fabric, silent=frozenset(fabric.leaf_of))
    assert (run.counted_flows, run.nodes) == (0, 0) and run.planned_flows > 0
    assert status.phase is RunPhase.FAILED
    assert passed(status) == ("False", LoadReason.INSUFFICIENT_DATA)
    assert {s.reason for s in run.skipped_nodes} == {SkipReason.NO_RESULT}


def test_a_partitioned_spine_is_not_measured_and_the_run_fails() -> None:
    """Every cross-domain flow fails (nft drops them between leaves): no ratio at all, a
    NotMeasured breach per cross cell, and the run counted too little."""
    fabric = leaf_spine(2, 3)
    plan = make_plan(fabric, {"phases": ["eastWest"]})
    leaf = fabric.leaf_of
    run, status = finish(plan, fabric=fabric, dropped=lambda _w, a, b: leaf[a] != leaf[b])
    assert run.east_west is not None
    cross = next(c for c in run.east_west.cells if c.a != c.b)
    assert (cross.flows, cross.planned, cross.reason) == (0, 6, CellReason.NOT_MEASURED)
    assert cross.oversubscription is None and run.max_oversubscription is None
    assert run.breaches[0].expectation == "NotMeasured"
    assert (run.breaches[0].subject, run.breaches[0].observed) == ("leaf-0/leaf-1", 0.0)
    assert status.phase is RunPhase.FAILED
    assert run.coverage_percent == 50.0  # the intra half counted
    assert passed(status) == ("False", LoadReason.INSUFFICIENT_DATA)
    # with a lower bar for coverage, the breach alone fails it
    lenient = make_plan(fabric, {"phases": ["eastWest"], "minCoveragePercent": 10})
    _run2, status2 = finish(lenient, fabric=fabric, dropped=lambda _w, a, b: leaf[a] != leaf[b])
    assert passed(status2) == ("False", LoadReason.EXPECTATIONS_BREACHED)
    assert "NotMeasured leaf-0/leaf-1" in next(
        c.message for c in status2.conditions if c.type == "Passed"
    )


def test_failed_readers_count_as_zero_in_the_minimum_and_the_fairness() -> None:
    fabric = leaf_spine(2, 3, storage_mbps=6 * 8 * 100)  # 600 MB/s shared
    plan = make_plan(fabric, {"phases": ["storage"]})
    half = {"node-0-00", "node-0-02", "node-1-01"}
    run, status = finish(
        plan,
        Expectations(min_storage_m_bps_per_node=50),
        fabric=fabric,
        failed_readers=lambda w, n: w.kind is WindowKind.STORAGE and n in half,
    )
    (s,) = run.storage
    assert (s.nodes, s.readers) == (3, 6)
    assert s.per_node_m_bps_min == 0.0
    assert s.fairness is not None and s.fairness == pytest.approx(0.5, rel=1e-3)
    assert s.aggregate_m_bps == pytest.approx(300, rel=1e-3)  # the three that read
    (breach,) = run.breaches
    assert (breach.expectation, breach.subject, breach.observed) == (
        "minStorageMBpsPerNode", "datasets", 0.0,
    )  # fmt: skip
    assert status.phase is RunPhase.FAILED


def test_an_endpoint_nobody_could_read_is_not_measured() -> None:
    fabric = leaf_spine(2, 3)
    plan = make_plan(fabric, {"phases": ["storage"]})
    run, status = finish(plan, fabric=fabric, failed_readers=lambda _w, _n: True)
    assert [(b.expectation, b.subject) for b in run.breaches] == [("NotMeasured", "datasets")]
    assert run.storage[0].per_node_m_bps_min == 0.0 and status.phase is RunPhase.FAILED


def test_host_limited_reference_flows_are_sender_limited_and_the_run_inconclusive() -> None:
    """Ports of 10 Gb/s (what a veth reports), flows far below and CPU-bound engines: the
    cells carry no ratio, say why with the numbers, and the run is not passed."""
    slow = leaf_spine(2, 3, port_mbps=3_000, uplink_mbps=3_000)  # the hosts' pace
    plan = make_plan(slow, {"phases": ["eastWest"]})
    received = answer(slow, plan, cpu_demand=99.0, port_report=10_000)
    run = aggregate(plan, received, expect=Expectations(max_oversubscription=1.5),
                    finished_at=NOW)  # fmt: skip
    assert run.east_west is not None
    for c in run.east_west.cells:
        assert c.reason is CellReason.SENDER_LIMITED, c
        assert c.oversubscription is None
    intra = next(c for c in run.east_west.cells if c.a == c.b)
    assert "3000 Mbit/s per node, port 10000" in intra.note
    assert intra.cpu_bound_percent == 100.0
    assert run.max_oversubscription is None and run.breaches == []
    status = st.finished(run, generation=1, now=NOW, previous=None, history_limit=3)
    assert status.phase is RunPhase.INCONCLUSIVE
    assert passed(status) == ("Unknown", LoadReason.INCONCLUSIVE)


def test_a_shaped_fabric_is_measured_not_called_sender_limited() -> None:
    """The same low rates with engines waiting on the network (low CPU demand): measured."""
    fabric = leaf_spine(2, 3, port_mbps=40, uplink_mbps=40)
    plan = make_plan(fabric, {"phases": ["eastWest"]})
    run, status = finish(plan, fabric=fabric, cpu_demand=3.0)
    assert run.max_oversubscription == pytest.approx(3.0, rel=1e-3)
    assert status.phase is RunPhase.SUCCEEDED
    # a port rate alone is no evidence: no CPU figures either, and the run is measured
    run2, status2 = finish(plan, fabric=fabric)
    assert run2.max_oversubscription == pytest.approx(3.0, rel=1e-3)
    assert status2.phase is RunPhase.SUCCEEDED


def test_a_ratio_at_the_smaller_side_s_fan_in_is_partial_and_kept_out_of_the_maximum() -> None:
    """A 6-node leaf against a 2-node leaf: every node of the big leaf sends (3 flows per
    receiver of the small one). With a non-blocking uplink the small leaf's ports set the
    pace: the ratio reads 3.0, the fan-in, so the cell is Partial, not a breach."""
    fabric = Fabric(leaves={"big": [f"b{i}" for i in range(6)], "small": ["s0", "s1"]},
                    port_mbps=100, uplink_mbps=10_000)  # fmt: skip
    plan = make_plan(fabric, {"phases": ["eastWest"]})
    run, status = finish(plan, Expectations(max_oversubscription=2.0), fabric=fabric)
    assert run.east_west is not None
    cross = next(c for c in run.east_west.cells if c.a != c.b)
    assert cross.reason is CellReason.PARTIAL and "3 flows each" in cross.note
    assert cross.oversubscription == pytest.approx(3.0, rel=1e-3)
    assert run.max_oversubscription is None and run.breaches == []
    assert status.phase is RunPhase.SUCCEEDED
    # an uplink tighter than the receivers' ports is measured as it is: 6 x 100 Mbit/s
    # through 150, 4:1
    tight = Fabric(leaves=fabric.leaves, port_mbps=100, uplink_mbps=150)
    run2, _ = finish(plan, fabric=tight)
    assert run2.max_oversubscription == pytest.approx(4.0, rel=1e-3)


def test_every_rail_plane_has_its_own_cells() -> None:
    fabric = leaf_spine(2, 3)
    rails = dict.fromkeys(fabric.leaf_of, NodeRails(mask=0b11, rdma=0))
    plan = make_plan(fabric, {"phases": ["eastWest"]}, rails=rails)
    run, status = finish(plan, fabric=fabric)
    assert run.east_west is not None
    keys = sorted((c.a, c.b, c.rail) for c in run.east_west.cells)
    assert keys == [(a, b, r) for a, b in (("leaf-0", "leaf-0"), ("leaf-0", "leaf-1"),
                                            ("leaf-1", "leaf-1")) for r in (0, 1)]  # fmt: skip
    assert all(c.flows == c.planned for c in run.east_west.cells)
    assert run.planned_flows == run.counted_flows == 2 * (6 + 6)
    assert status.phase is RunPhase.SUCCEEDED


def test_a_node_left_out_mid_stage_is_not_expected_in_it() -> None:
    fabric = leaf_spine(2, 3)
    plan = make_plan(fabric, {"phases": ["eastWest"]})
    received = answer(fabric, plan, silent=frozenset({"node-1-02"}))
    agg = Aggregator(plan)
    # the operator re-checks during the stage; its results come after the stage's deadline
    plan.exclude("node-1-02", SkipReason.BUSY, from_stage=1)
    agg.withdraw("node-1-02", 0)
    for r in received:
        if r.result.stage == 0:
            agg.add(r)
    # stage 1 (cross) is planned without it from the start: results of the others come
    later = answer(fabric, plan)
    for r in later:
        if r.result.stage == 1:
            agg.add(r)
    run = agg.finish(expect=Expectations(), finished_at=NOW)
    assert run.coverage_percent == 100.0, run
    assert ("node-1-02", SkipReason.BUSY, 1) in {
        (s.node, s.reason, s.stage) for s in run.skipped_nodes
    }
