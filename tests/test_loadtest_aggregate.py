"""NetworkLoadTest aggregation (pure): per-node results -> oversubscription per domain pair,
storage per node and alone, latency under load, refused flows, breaches; and the status
rendered from it."""

from __future__ import annotations

import math
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from loadtest_fabric import NOW, VALIDATION, Fabric, answer, leaf_spine, make_plan
from netval.model.loadplan import CLOCK_TOLERANCE_SECONDS, FlowResult, latency_bucket
from netval.model.loadtest import (
    MAX_LOAD_CELLS,
    Expectations,
    LoadConditionType,
    LoadReason,
    LoadRun,
    NetworkLoadTestStatus,
    RunPhase,
    SkipReason,
)
from netval.operator.loadtest import status as st
from netval.operator.loadtest.aggregate import Aggregator, Received, aggregate, jain
from netval.operator.loadtest.figures import Hist
from netval.operator.loadtest.validate import SpecProblem, settle

NO_EXPECTATIONS = Expectations()


def run(fabric: Fabric, expect: Expectations = NO_EXPECTATIONS, **kw: Any) -> LoadRun:
    plan = make_plan(fabric, kw.pop("spec", None))
    return aggregate(plan, answer(fabric, plan, **kw), expect=expect, finished_at=plan.finished_by)


# -- east-west ------------------------------------------------------------------------------


def test_a_3_to_1_fabric_reads_3_across_and_1_inside() -> None:
    """3 leaves x 3 nodes, node ports = uplink rate: every node alone gets the full rate, all
    three of a leaf sending across share one uplink."""
    fabric = leaf_spine(3, 3, port_mbps=200_000, uplink_mbps=200_000)
    result = run(fabric, spec={"phases": ["eastWest"]})
    assert result.east_west is not None
    cells = {(c.a, c.b): c for c in result.east_west.cells}
    assert len(cells) == 6  # 3 intra + 3 cross
    for leaf in ("leaf-0", "leaf-1", "leaf-2"):
        intra = cells[(leaf, leaf)]
        assert intra.oversubscription == 1.0
        assert intra.per_node_mbps == pytest.approx(200_000, rel=1e-3)
        assert intra.flows == 3
    for pair in [("leaf-0", "leaf-1"), ("leaf-0", "leaf-2"), ("leaf-1", "leaf-2")]:
        cross = cells[pair]
        assert cross.oversubscription == pytest.approx(3.0, rel=1e-3)
        assert cross.per_node_mbps == pytest.approx(200_000 / 3, rel=1e-3)
        assert cross.flows == 6  # 3 each way
        assert cross.aggregate_mbps == pytest.approx(400_000, rel=1e-3)  # the uplink, both ways
        assert cross.loss_percent == 1.0
        assert cross.idle_latency_p99_ms is not None and cross.loaded_latency_p99_ms is not None
        assert cross.loaded_latency_p99_ms > cross.idle_latency_p99_ms
    assert result.max_oversubscription == pytest.approx(3.0, rel=1e-3)
    assert (result.nodes, result.refused_flows, result.skipped_count) == (9, 0, 0)


def test_a_non_blocking_fabric_reads_1_everywhere() -> None:
    fabric = leaf_spine(2, 4, port_mbps=100_000, uplink_mbps=400_000)
    result = run(fabric, spec={"phases": ["eastWest"]})
    assert result.max_oversubscription == pytest.approx(1.0, rel=1e-3)


def test_expectations_breached_name_the_cell_and_the_figure() -> None:
    fabric = leaf_spine(2, 3)
    expect = Expectations(max_oversubscription=1.5, max_latency_inflation=2.0)
    result = run(fabric, expect, spec={"phases": ["eastWest"]})
    over = [b for b in result.breaches if b.expectation == "maxOversubscription"]
    assert [(b.subject, b.expected) for b in over] == [("leaf-0/leaf-1", 1.5)]
    assert over[0].observed == pytest.approx(3.0, rel=1e-3)
    # intra flows at the full port rate inflate the echo most (the synthetic queueing model)
    assert {b.subject for b in result.breaches if b.expectation == "maxLatencyInflation"}


# -- acceptance: windows, clocks, duplicates, strangers ---------------------------------------


def test_a_node_whose_clock_is_off_is_skipped_and_its_flows_refused() -> None:
    fabric = leaf_spine(3, 3)
    result = run(
        fabric,
        clock_offset={"node-1-01": 3 * CLOCK_TOLERANCE_SECONDS},
        spec={"phases": ["eastWest"]},
    )
    assert {(s.node, s.reason) for s in result.skipped_nodes} == {
        ("node-1-01", SkipReason.CLOCK_OFFSET)
    }
    assert result.refused_flows == 3  # its intra flow and one to each other leaf
    assert result.nodes == 8
    # within the tolerance: counted
    ok = run(
        fabric,
        clock_offset={"node-1-01": CLOCK_TOLERANCE_SECONDS / 2},
        spec={"phases": ["eastWest"]},
    )
    assert (ok.refused_flows, ok.skipped_count) == (0, 0)


def _edit_flows(received: list[Received], node: str, change: Any) -> list[Received]:
    out = []
    for r in received:
        if r.result.node == node and r.result.flows:
            flows = [change(f) for f in r.result.flows]
            r = Received(r.result.model_copy(update={"flows": flows}), r.received_at)
        out.append(r)
    return out


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda f: f.model_copy(update={"start": f.start + timedelta(seconds=5)}), id="late"),
        pytest.param(
            lambda f: f.model_copy(update={"start": f.start - timedelta(days=3650), "end": f.end - timedelta(days=3650)}),
            id="far-past",
        ),
        pytest.param(
            lambda f: f.model_copy(update={"start": datetime(9999, 1, 1, tzinfo=UTC), "end": datetime(9999, 1, 2, tzinfo=UTC)}),
            id="far-future",
        ),
        pytest.param(lambda f: f.model_copy(update={"window": "r9:cross"}), id="unknown-window"),
        pytest.param(lambda f: f.model_copy(update={"peer": "node-0-00"}), id="unplanned-peer"),
        pytest.param(lambda f: f.model_copy(update={"error": "connection reset"}), id="failed"),
    ],
)  # fmt: skip
def test_flows_outside_their_plan_are_refused_not_counted(change: Any) -> None:
    fabric = leaf_spine(2, 3)
    plan = make_plan(fabric, {"phases": ["eastWest"]})
    received = _edit_flows(answer(fabric, plan), "node-1-02", change)
    result = aggregate(plan, received, expect=NO_EXPECTATIONS, finished_at=NOW)
    assert result.refused_flows == 2
    assert result.east_west is not None
    assert sum(c.flows for c in result.east_west.cells) == 12 - 2


def test_duplicates_and_other_runs_count_once_or_not_at_all() -> None:
    fabric = leaf_spine(2, 3)
    plan = make_plan(fabric, {"phases": ["eastWest"]})
    received = answer(fabric, plan)
    base = aggregate(plan, received, expect=NO_EXPECTATIONS, finished_at=NOW)
    stranger = Received(
        received[0].result.model_copy(update={"run": "run-0", "node": "node-0-01"}), NOW
    )
    outsider = Received(received[0].result.model_copy(update={"node": "not-planned"}), NOW)
    again = aggregate(
        plan, [*received, *received, stranger, outsider], expect=NO_EXPECTATIONS, finished_at=NOW
    )
    assert again == base


def test_a_silent_participant_is_no_result() -> None:
    fabric = leaf_spine(2, 3)
    plan = make_plan(fabric, {"phases": ["eastWest"]})
    received = [r for r in answer(fabric, plan) if r.result.node != "node-0-02"]
    result = aggregate(plan, received, expect=NO_EXPECTATIONS, finished_at=NOW)
    assert [(s.node, s.reason) for s in result.skipped_nodes] == [
        ("node-0-02", SkipReason.NO_RESULT)
    ]
    assert result.nodes == 5


def test_huge_but_valid_numbers_stay_finite() -> None:
    fabric = leaf_spine(2, 2)
    plan = make_plan(fabric, {"phases": ["eastWest"]})

    def huge(f: FlowResult) -> FlowResult:
        return f.model_copy(update={"bytes": 2**62})

    received = _edit_flows(answer(fabric, plan), "node-0-00", huge)
    result = aggregate(
        plan, received, expect=Expectations(max_oversubscription=1.0), finished_at=NOW
    )
    assert result.east_west is not None
    NetworkLoadTestStatus(last_run=result).model_dump_json()  # serialisable: no inf/nan


def test_cells_are_bounded_worst_first() -> None:
    fabric = leaf_spine(18, 1)  # 18 intra-less domains: 153 cross cells
    plan = make_plan(fabric, {"phases": ["eastWest"], "duration": "5s"})
    result = aggregate(plan, answer(fabric, plan), expect=NO_EXPECTATIONS, finished_at=NOW)
    assert result.east_west is not None
    assert len(result.east_west.cells) == MAX_LOAD_CELLS
    assert result.east_west.omitted_cells == 153 - MAX_LOAD_CELLS


# -- storage --------------------------------------------------------------------------------


def test_storage_all_at_once_shares_the_link_and_alone_gets_it() -> None:
    """6 nodes behind ports of 10 Gb/s read a store behind a 12 Gb/s link: at once each gets
    a sixth of it, alone each gets its port."""
    fabric = leaf_spine(2, 3, port_mbps=10_000, storage_mbps=12_000)
    result = run(fabric, Expectations(min_storage_m_bps_per_node=500), spec={"phases": ["storage"]})
    (s,) = result.storage
    assert (s.endpoint, s.nodes) == ("datasets", 6)
    assert s.aggregate_m_bps == pytest.approx(1500, rel=1e-3)  # 12 Gb/s = 1500 MB/s
    assert s.per_node_m_bps_min == s.per_node_m_bps_median == pytest.approx(250, rel=1e-3)
    assert s.single_node_m_bps == pytest.approx(1250, rel=1e-3)  # a 10 Gb/s port
    assert s.fairness == pytest.approx(1.0)
    assert [(b.expectation, b.subject, b.expected) for b in result.breaches] == [
        ("minStorageMBpsPerNode", "datasets", 500)
    ]
    assert result.east_west is None


def test_jain_index() -> None:
    assert jain([5, 5, 5, 5]) == 1.0
    assert jain([1, 0, 0, 0]) == 0.25
    assert jain([]) is None and jain([0, 0]) is None


# -- status ---------------------------------------------------------------------------------


def test_status_through_a_run_and_a_scheduled_second_one() -> None:
    fabric = leaf_spine(2, 3)
    first = run(fabric, Expectations(max_oversubscription=1.5), spec={"phases": ["eastWest"]})
    s0 = st.waiting(
        "waiting for the first run", generation=1, now=NOW, previous=None, history_limit=2
    )
    assert s0.phase is RunPhase.PENDING
    started = LoadRun(id=first.id, started_at=first.started_at, nodes=first.nodes)
    s1 = st.running(started, generation=1, now=NOW, previous=s0, history_limit=2)
    assert s1.phase is RunPhase.RUNNING and s1.history == []
    s2 = st.finished(
        first, generation=1, now=NOW + timedelta(minutes=1), previous=s1, history_limit=2
    )
    complete, passed = (
        s2.condition(LoadConditionType.COMPLETE),
        s2.condition(LoadConditionType.PASSED),
    )
    assert s2.phase is RunPhase.FAILED
    assert complete is not None and (complete.status, complete.reason) == (
        "True",
        LoadReason.RUN_FINISHED,
    )
    assert passed is not None and (passed.status, passed.reason) == (
        "False",
        LoadReason.EXPECTATIONS_BREACHED,
    )
    assert "maxOversubscription leaf-0/leaf-1 observed 3" in passed.message
    # between scheduled runs the verdict stays and nextRunAt says when
    later = NOW + timedelta(days=1)
    s3 = st.waiting("next", generation=1, now=NOW, previous=s2, history_limit=2, next_run_at=later)
    assert (s3.phase, s3.next_run_at, s3.last_run) == (RunPhase.FAILED, later, first)
    # the next run pushes the first into the history; history stays within its limit
    status = s3
    pushed = st.running(
        LoadRun(id="run-1b", started_at=later, nodes=6),
        generation=1,
        now=later,
        previous=s3,
        history_limit=2,
    )
    # a history row says why the run failed, not only that it finished
    assert (pushed.history[0].phase, pushed.history[0].reason) == (
        RunPhase.FAILED,
        LoadReason.EXPECTATIONS_BREACHED,
    )
    for i in range(3):
        nxt = LoadRun(id=f"run-{i + 2}", started_at=later, nodes=6, planned_flows=12,
                      counted_flows=12, coverage_percent=100.0)  # fmt: skip
        status = st.running(nxt, generation=1, now=later, previous=status, history_limit=2)
        status = st.finished(nxt, generation=1, now=later, previous=status, history_limit=2)
    assert [h.id for h in status.history] == ["run-3", "run-2"]
    assert status.phase is RunPhase.SUCCEEDED
    # the API server takes it (the CRD's schema: see test_crd_loadtest)
    NetworkLoadTestStatus.model_validate(status.to_patch())


def test_a_spec_problem_fails_at_once_and_keeps_its_transition_time() -> None:
    problem = settle({"validation": "pool", "storage": {"endpoints": ["nope"]}}, VALIDATION)
    assert isinstance(problem, SpecProblem)
    s1 = st.could_not_run(problem, generation=3, now=NOW, previous=None, history_limit=5)
    assert s1.phase is RunPhase.FAILED
    for c in s1.conditions:
        assert c.reason is LoadReason.INVALID_SPEC and "spec.storage.endpoints" in c.message
        assert c.observed_generation == 3
    s2 = st.could_not_run(
        problem, generation=3, now=NOW + timedelta(hours=1), previous=s1, history_limit=5
    )
    assert [c.last_transition_time for c in s2.conditions] == [NOW, NOW]


def test_abort_closes_the_running_run() -> None:
    started = LoadRun(id="run-1", started_at=NOW, nodes=4)
    running = st.running(started, generation=1, now=NOW, previous=None, history_limit=5)
    later = NOW + timedelta(seconds=30)
    s = st.aborted(
        "NetworkValidation pool deleted", generation=1, now=later, previous=running, history_limit=5
    )
    assert s.phase is RunPhase.FAILED and s.last_run is not None and s.last_run.finished_at == later
    assert {c.reason for c in s.conditions} == {LoadReason.ABORTED}


def test_status_is_aggregates_only_even_for_many_nodes() -> None:
    fabric = leaf_spine(4, 40)
    result = run(fabric, spec={"duration": "5s"})
    size = len(NetworkLoadTestStatus(last_run=result).model_dump_json())
    assert result.east_west is not None and len(result.east_west.cells) == 4 + 6
    assert size < 8_000, size


def test_latency_p99_from_the_histogram_is_within_half_a_percent() -> None:
    """Agents send every round trip as buckets; the operator's p99 is of all of them."""
    values = [0.01 * (1.003**i) for i in range(5000)]
    h = Hist()
    h.add(Counter(latency_bucket(v) for v in values).items())
    exact = sorted(values)[math.ceil(0.99 * len(values)) - 1]
    got = h.p99()
    assert got is not None and abs(got / exact - 1) <= 0.005
    zeros = Hist()
    zeros.add([(latency_bucket(0.0), 2)])
    tiny = zeros.p99()
    assert tiny is not None and tiny < 1e-5 and Hist().p99() is None
    # a whole window's echoes, not a sample: a rare slow echo sets the p99 when it is 1 %+
    slow = [(latency_bucket(0.05), 980), (latency_bucket(40.0), 20)]
    tail = Hist()
    tail.add(slow)
    assert tail.p99() == pytest.approx(40.0, rel=0.006)


def test_folding_stage_by_stage_gives_what_folding_all_at_once_gives() -> None:
    fabric = leaf_spine(3, 4)
    plan = make_plan(fabric)
    received = answer(fabric, plan)
    agg = Aggregator(plan)
    for r in sorted(received, key=lambda r: (r.result.stage, r.result.node), reverse=True):
        assert agg.add(r)
        assert not agg.add(r)  # a redelivery
    whole = aggregate(plan, received, expect=NO_EXPECTATIONS, finished_at=NOW)
    assert agg.finish(expect=NO_EXPECTATIONS, finished_at=NOW) == whole


def test_a_result_more_than_three_stages_late_is_refused() -> None:
    fabric = leaf_spine(4, 2)
    plan = make_plan(fabric)
    assert len(plan.stages) == 5
    received = answer(fabric, plan)
    late = next(r for r in received if r.result.stage == 0 and r.result.node == "node-0-00")
    agg = Aggregator(plan)
    for r in received:
        if r is not late:
            agg.add(r)
    assert agg.add(late)  # taken, not folded: stage 0 was sealed when stage 3 came
    result = agg.finish(expect=NO_EXPECTATIONS, finished_at=NOW)
    assert result.refused_flows == 1
    assert result.east_west is not None
    intra = next(c for c in result.east_west.cells if (c.a, c.b) == ("leaf-0", "leaf-0"))
    assert intra.flows == 1  # the other node of leaf-0
