"""NetworkLoadTest on a real fabric: the agents' side end to end, with the real engine.

The shaped fabric of tests/loadtest_netns.py: two leaves of three nodes, every node's port
and each direction of the uplink shaped by htb to 40 Mbit/s, so the fabric is 3:1 across
and 1:1 inside a leaf. Six real `netval agent` processes run iperf3 on it against a real
Mosquitto; the TEST plays the operator (plans with `plan_run`, folds with the Aggregator,
judges with the status verdict).

(b) cross-leaf oversubscription within 25 % of 3.0, intra 1.0, latency under load above
    idle, and not called sender-limited: the shaping, not the hosts, limited the flows;
(c) a LoadAbort mid-window stops the traffic: the uplink's byte counter stops within 2 s;
(d) the per-flow cap holds;
(e) nft dropping the load flows across the leaves: the cross cell is NotMeasured, the run
    Failed;
(f) a plan of an older leadership term than one the agent heard is dropped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from loadtest_netns import (
    LEAVES,
    NODES,
    RATE_MBIT,
    TERM,
    Fabric,
    collect,
    make_plan,
    plan_topic,
    publish_stage,
    run_all,
    running_fabric,
    stage_plans,
    wait_until,
)
from netval.model.loadplan import LatencyTask, LoadAbort, LoadPlan, encode
from netval.model.loadtest import CellReason, RunPhase
from netval.operator.loadtest.status import verdict
from test_peers_netns import run_in

pytestmark = [pytest.mark.netns, pytest.mark.timeout(200)]


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fabric]:
    with running_fabric(tmp_path_factory.mktemp("loadtest"), rate_mbit=RATE_MBIT) as f:
        yield f


def test_b_a_3_to_1_fabric_measures_3_across_1_inside_and_is_not_sender_limited(
    fabric: Fabric,
) -> None:
    plan = make_plan(fabric, "oversub", "5s", 0)
    assert len(plan.stages) == 2  # intra, then the one cross round
    run, results = run_all(fabric, plan)
    for result in results:
        assert result.error is None and result.unavailable is None, result
        assert all(f.error is None for f in result.flows), result.flows
        assert result.engines == {"iperf3": "3.12"}
    assert run.refused_flows == 0, run
    assert run.engines == ["iperf3 3.12"] and run.coverage_percent == 100.0
    assert run.east_west is not None
    cells = {(c.a, c.b): c for c in run.east_west.cells}
    cross = cells[("leaf-a", "leaf-b")]
    assert cross.flows == 6 and cross.reason is None, cross
    assert cross.oversubscription is not None
    assert abs(cross.oversubscription / 3.0 - 1) <= 0.25, cross
    for leaf in LEAVES:
        intra = cells[(leaf, leaf)]
        assert intra.flows == 3 and intra.reason is None, intra
        assert intra.oversubscription == 1.0
        assert intra.per_node_mbps is not None
        assert 0.7 * RATE_MBIT <= intra.per_node_mbps <= 1.1 * RATE_MBIT, intra
        # the engines waited on the shaped ports: no CPU-bound flow
        assert intra.cpu_bound_percent == 0.0, intra
    for c in cells.values():
        assert c.idle_latency_p99_ms is not None and c.loaded_latency_p99_ms is not None
        assert c.loaded_latency_p99_ms > c.idle_latency_p99_ms, c
    assert verdict(run, 80.0)[0] is RunPhase.SUCCEEDED


def test_c_d_an_abort_stops_the_uplink_within_2s_and_the_cap_holds(fabric: Fabric) -> None:
    cap = 10.0  # below the cross share (40/3): the uplink carries 3 x 10 Mbit/s
    plan = make_plan(fabric, "abort", "60s", cap, skip_stages=1)  # the cross round, now
    stage = plan.stages[1]
    plans = stage_plans(fabric, plan, 1)
    publish_stage(fabric, plans)
    load_start = next(w.measure_start for w in plan.windows_of(stage) if w.id.endswith("cross"))
    wait_until(load_start + timedelta(seconds=2))
    before = fabric.uplink_tx_bytes()
    time.sleep(0.5)
    assert fabric.uplink_tx_bytes() - before > 0.5 * 3 * cap * 1e6 / 8 * 0.5  # loaded
    for node in plans:
        fabric.publish(plan_topic(node), encode(LoadAbort(term=TERM, run="abort",
                                                          reason="test deleted")))  # fmt: skip
    aborted = time.monotonic()
    # quiet: under 20 KB in 0.5 s (echo and control traffic only), reached within 2 s
    last = fabric.uplink_tx_bytes()
    quiet_at = None
    while time.monotonic() - aborted < 2.5:
        time.sleep(0.5)
        now_bytes = fabric.uplink_tx_bytes()
        if now_bytes - last < 20_000:
            quiet_at = time.monotonic() - 0.5
            break
        last = now_bytes
    assert quiet_at is not None and quiet_at - aborted <= 2.0, "the uplink kept sending"
    print(f"\nuplink quiet {quiet_at - aborted:.2f} s after the abort")
    results = collect(fabric, "abort", len(plans), 15)
    for result in results:
        for flow in result.flows:
            assert flow.error == "stopped early", flow
            seconds = (flow.end - flow.start).total_seconds()
            if seconds > 1.0 and flow.bytes:  # what was measured before the abort
                mbps = flow.bytes * 8 / seconds / 1e6
                assert mbps <= cap * 1.05, (result.node, mbps)


def test_e_load_flows_dropped_across_the_leaves_are_not_measured_and_the_run_fails(
    fabric: Fabric,
) -> None:
    """nft in leaf A's bridge drops the engines' TCP across the uplink (both directions),
    echoes and everything else pass: the cross cell has nothing counted."""
    leaf = fabric.leaves["leaf-a"]
    rules = [
        "add table bridge nvtest",
        "add chain bridge nvtest ltfwd { type filter hook forward priority 0 ; }",
        'add rule bridge nvtest ltfwd oifname "up0" meta l4proto tcp th dport 7490-7521 drop',
        'add rule bridge nvtest ltfwd iifname "up0" meta l4proto tcp th dport 7490-7521 drop',
    ]
    for rule in rules:
        run_in(leaf, "nft", *rule.split())
    try:
        plan = make_plan(fabric, "partitioned", "5s", 0)
        run, _results = run_all(fabric, plan)
    finally:
        run_in(leaf, "nft", "delete", "table", "bridge", "nvtest")
    assert run.east_west is not None
    cells = {(c.a, c.b): c for c in run.east_west.cells}
    cross = cells[("leaf-a", "leaf-b")]
    assert (cross.flows, cross.reason, cross.oversubscription) == (0, CellReason.NOT_MEASURED,
                                                                   None)  # fmt: skip
    assert cross.planned == 6
    assert all(cells[(leaf_, leaf_)].flows == 3 for leaf_ in LEAVES)  # intra went on
    assert run.breaches[0].expectation == "NotMeasured"
    assert run.max_oversubscription is None
    phase, _truth, reason, _text = verdict(run, 80.0)
    assert phase is RunPhase.FAILED, (reason, run)


def test_f_a_plan_of_an_older_term_is_dropped_by_the_agent(fabric: Fabric) -> None:
    node, peer = NODES[0], NODES[1]
    fabric.publish(plan_topic(node), encode(LoadAbort(term=TERM + 5, run="new-leader")))
    now = datetime.now(UTC)
    start = now + timedelta(seconds=1)

    def echo_plan(run: str, term: int) -> LoadPlan:
        where = stage_plans(fabric, make_plan(fabric, "x", "5s", 0), 0)[node].peers
        return LoadPlan(
            term=term, run=run, stage=0, validation="lt", node=node, issued_at=now,
            deadline=start + timedelta(seconds=4),
            tasks=[LatencyTask(window="r0:idle", peer=peer, start=start, seconds=1.0,
                               loaded=False)],
            peers={peer: where[peer]},
        )  # fmt: skip

    # the paused old leader's plan lands after the new leader's abort: dropped
    fabric.publish(plan_topic(node), encode(echo_plan("old-leader", TERM)))
    # a plan of the new term runs (its result proves the older one had its chance)
    time.sleep(0.5)
    fabric.publish(plan_topic(node), encode(echo_plan("new-plan", TERM + 5)))
    got = collect(fabric, "new-plan", 1, 15)
    assert got[0].latency[0].received > 0
    with pytest.raises(AssertionError, match="timed out"):
        collect(fabric, "old-leader", 1, 3)
    log = fabric.logs[node].read_text(errors="replace")
    assert "load plan ignored (old_term)" in log and "term 1000 (seen 1005)" in log
