"""NetworkLoadTest, the operator's pure stages before a run: the spec against its validation
(`validate`) and the plan (`plan`): who takes part, what runs when, each node's plan."""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from loadtest_fabric import leaf_spine
from netval.model.loadplan import (
    MAX_PLAN_SECONDS,
    MAX_TASKS,
    SERVE_LEAD_SECONDS,
    Engine,
    FlowTask,
    LatencyEngine,
    LatencyTask,
    ServeTask,
    StorageTask,
    decode_plan,
    encode,
)
from netval.model.loadtest import LoadPhase, LoadReason, PairScope, SkipReason
from netval.model.spec import NetworkValidationSpec
from netval.operator.loadtest.plan import (
    LEAD_SECONDS,
    MAX_LEAD_SECONDS,
    MAX_SINGLE_READS,
    RunPlan,
    WindowKind,
    fanout_of,
    make_run_id,
    max_fanout,
    plan_run,
    round_robin,
    stage_lead_seconds,
)
from netval.operator.loadtest.rails import NodeRails, addresses, node_rails, rails_of
from netval.operator.loadtest.tasks import LAT_PORT_OFFSET, build_plans
from netval.operator.loadtest.validate import RunSettings, SpecProblem, settle

NOW = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)

VALIDATION = NetworkValidationSpec.model_validate(
    {
        "checks": {
            "peers": {"enabled": True},
            "storage": {
                "endpoints": [
                    {"name": "datasets", "protocol": "s3", "host": "s3.local", "path": "/b/o"},
                    {"name": "ckpt", "protocol": "http", "host": "h.local", "path": "/x"},
                    {"name": "ceph-mon", "protocol": "ceph", "host": "10.0.0.1"},
                    {"name": "bare", "protocol": "http", "host": "h.local"},
                ]
            },
        }
    }
)
NO_PEERS = NetworkValidationSpec.model_validate({})


def settings(
    spec: dict[str, Any], validation: NetworkValidationSpec | None = VALIDATION, **kw: Any
) -> RunSettings:
    got = settle({"validation": "pool", **spec}, validation, **kw)
    assert isinstance(got, RunSettings), got
    return got


def problem(
    spec: dict[str, Any], validation: NetworkValidationSpec | None = VALIDATION, **kw: Any
) -> SpecProblem:
    got = settle({"validation": "pool", **spec}, validation, **kw)
    assert isinstance(got, SpecProblem), got
    return got


# -- validate -------------------------------------------------------------------------------


def test_defaults_run_every_phase_the_validation_can() -> None:
    s = settings({})
    assert s.phases == (LoadPhase.EAST_WEST, LoadPhase.STORAGE)
    assert s.endpoints == ("datasets", "ckpt")  # ceph and a pathless http cannot be read in bulk
    assert (s.duration_seconds, s.max_rate_mbps, s.pairs) == (20.0, 0.0, PairScope.CROSS_DOMAIN)
    assert settings({"phases": ["storage"]}).phases == (LoadPhase.STORAGE,)
    assert settings({"phases": ["eastWest"]}).endpoints == ()


@pytest.mark.parametrize(
    ("spec", "validation", "reason", "field", "text"),
    [
        ({}, None, LoadReason.VALIDATION_NOT_FOUND, "spec.validation", "'pool' not found"),
        ({"storage": {"endpoints": ["nope"]}}, VALIDATION, LoadReason.INVALID_SPEC,
         "spec.storage.endpoints", "'nope' not in checks.storage.endpoints of NetworkValidation 'pool'"),
        ({"storage": {"endpoints": ["ceph-mon"]}}, VALIDATION, LoadReason.INVALID_SPEC,
         "spec.storage.endpoints", "'ceph-mon' cannot be read in bulk"),
        ({"duration": "4s"}, VALIDATION, LoadReason.INVALID_SPEC, "spec.duration",
         "duration must be 5s..300s"),
        ({"duration": "10m"}, VALIDATION, LoadReason.INVALID_SPEC, "spec.duration", "5s..300s"),
        ({"phases": ["eastWest"]}, NO_PEERS, LoadReason.INVALID_SPEC, "spec.phases",
         "eastWest needs checks.peers.enabled"),
        ({"phases": ["storage"]}, NO_PEERS, LoadReason.INVALID_SPEC, "spec.phases",
         "storage needs an http or s3 endpoint"),
        ({}, NO_PEERS, LoadReason.INVALID_SPEC, "spec.phases", "can run no phase"),
        ({"schedule": "61 * * * *"}, VALIDATION, LoadReason.INVALID_SPEC, "spec.schedule",
         "minute field '61'"),
        ({"eastWest": {"pairs": "most"}}, VALIDATION, LoadReason.INVALID_SPEC,
         "spec.eastWest.pairs", "Input should be"),
        ({"surprise": 1}, VALIDATION, LoadReason.INVALID_SPEC, "spec.surprise", "Extra inputs"),
        ({"maxRateMbps": float("inf")}, VALIDATION, LoadReason.INVALID_SPEC, "spec.maxRateMbps",
         "finite number"),
    ],
)  # fmt: skip
def test_a_bad_spec_names_the_field(
    spec: dict[str, Any],
    validation: NetworkValidationSpec | None,
    reason: LoadReason,
    field: str,
    text: str,
) -> None:
    p = problem(spec, validation)
    assert (p.reason, p.field) == (reason, field)
    assert p.message.startswith(f"{field}: ") and text in p.message, p.message


def test_the_cluster_ceiling_caps_or_refuses() -> None:
    assert settings({}, max_rate_ceiling_mbps=10_000).max_rate_mbps == 10_000  # no own cap
    assert settings({"maxRateMbps": 5_000}, max_rate_ceiling_mbps=10_000).max_rate_mbps == 5_000
    p = problem({"maxRateMbps": 20_000}, max_rate_ceiling_mbps=10_000)
    assert p.field == "spec.maxRateMbps" and "above the cluster ceiling" in p.message
    assert settings({"maxRateMbps": 20_000}).max_rate_mbps == 20_000  # no ceiling set


def test_a_missing_spec_is_an_invalid_spec_not_a_crash() -> None:
    p = settle(None, VALIDATION)
    assert isinstance(p, SpecProblem) and p.field == "spec.validation"


# -- participants ---------------------------------------------------------------------------


def test_gated_stale_and_busy_nodes_are_left_out_with_their_reason() -> None:
    fabric = leaf_spine(2, 3)
    cands = fabric.candidates(**{
        "node-0-00": {"gated": True, "busy": True},
        "node-0-01": {"fresh": False},
        "node-1-02": {"busy": True},
    })  # fmt: skip
    plan = plan_run(settings({"phases": ["eastWest"]}), cands, run_id="r", now=NOW, seed=1)
    assert isinstance(plan, RunPlan)
    assert dict(plan.skipped) == {
        "node-0-00": SkipReason.GATED,  # gated wins over busy
        "node-0-01": SkipReason.STALE,
        "node-1-02": SkipReason.BUSY,
    }
    assert sorted(plan.domain_of) == ["node-0-02", "node-1-00", "node-1-01"]
    every = {n for w in plan.windows for f in w.flows for n in f}
    assert every <= plan.domain_of.keys()
    # skipBusyNodes: false loads busy nodes, never gated ones
    plan = plan_run(
        settings({"phases": ["eastWest"], "skipBusyNodes": False}),
        cands,
        run_id="r",
        now=NOW,
        seed=1,
    )
    assert isinstance(plan, RunPlan) and dict(plan.skipped).keys() == {"node-0-00", "node-0-01"}


def test_no_participants_is_said() -> None:
    fabric = leaf_spine(1, 2)
    cands = fabric.candidates(**{"node-0-00": {"fresh": False}})
    got = plan_run(settings({"phases": ["eastWest"]}), cands, run_id="r", now=NOW, seed=1)
    assert isinstance(got, SpecProblem) and got.reason is LoadReason.NO_PARTICIPANTS
    assert "east-west needs two" in got.message
    got = plan_run(settings({}), [], run_id="r", now=NOW, seed=1)
    assert isinstance(got, SpecProblem) and got.reason is LoadReason.NO_PARTICIPANTS


# -- the schedule of a run ------------------------------------------------------------------


def east_west_plan(leaves: int, per_leaf: int, seed: int = 7, **spec: Any) -> RunPlan:
    fabric = leaf_spine(leaves, per_leaf)
    plan = plan_run(
        settings({"phases": ["eastWest"], **spec}),
        fabric.candidates(),
        run_id="run-1",
        now=NOW,
        seed=seed,
    )
    assert isinstance(plan, RunPlan)
    return plan


def test_intra_every_node_sends_to_another_of_its_domain_at_once() -> None:
    plan = east_west_plan(3, 3)
    (intra,) = [w for w in plan.windows if w.kind is WindowKind.INTRA]
    senders = Counter(a for a, _ in intra.flows)
    receivers = Counter(b for _, b in intra.flows)
    assert set(senders) == set(receivers) == set(plan.domain_of)
    assert set(senders.values()) == set(receivers.values()) == {1}
    assert all(plan.domain_of[a] == plan.domain_of[b] and a != b for a, b in intra.flows)


def test_cross_every_domain_pair_once_each_node_in_one_flow_each_way_per_round() -> None:
    plan = east_west_plan(4, 3)
    cross = [w for w in plan.windows if w.kind is WindowKind.CROSS]
    assert len(cross) == 3  # round-robin of 4 domains: 3 rounds of 2 disjoint pairs
    seen: Counter[tuple[str, str]] = Counter()
    for w in cross:
        assert set(Counter(a for a, _ in w.flows).values()) == {1}
        assert set(Counter(b for _, b in w.flows).values()) == {1}
        pairs = {tuple(sorted((plan.domain_of[a], plan.domain_of[b]))) for a, b in w.flows}
        seen.update(pairs)
        # every node of A sends to a distinct node of B, and B back
        for da, db in pairs:
            a_to_b = [
                (a, b) for a, b in w.flows if plan.domain_of[a] == da and plan.domain_of[b] == db
            ]
            assert len(a_to_b) == 3 and len({b for _, b in a_to_b}) == 3
    assert len(seen) == 6 and set(seen.values()) == {1}


def test_all_pairs_gives_each_domain_pair_a_round_of_its_own() -> None:
    plan = east_west_plan(4, 2, eastWest={"pairs": "all"})
    assert len([w for w in plan.windows if w.kind is WindowKind.CROSS]) == 6


@pytest.mark.parametrize("domains", [2, 3, 5, 8, 16])
def test_round_robin_covers_every_pair_once_with_disjoint_rounds(domains: int) -> None:
    names = [f"d{i:02d}" for i in range(domains)]
    rounds = round_robin(names, PairScope.CROSS_DOMAIN)
    assert len(rounds) == (domains - 1 if domains % 2 == 0 else domains)
    pairs = [p for r in rounds for p in r]
    assert len(pairs) == len(set(pairs)) == domains * (domains - 1) // 2
    for r in rounds:
        flat = [d for p in r for d in p]
        assert len(flat) == len(set(flat))


def test_unequal_domains_load_the_larger_side_fully_and_one_node_domains_have_no_intra() -> None:
    fabric = leaf_spine(1, 1)
    fabric.leaves["leaf-big"] = ["big-1", "big-2", "big-3"]
    plan = plan_run(
        settings({"phases": ["eastWest"]}), fabric.candidates(), run_id="r", now=NOW, seed=3
    )
    assert isinstance(plan, RunPlan)
    (intra,) = [w for w in plan.windows if w.kind is WindowKind.INTRA]
    assert all(a.startswith("big") for a, _ in intra.flows)
    (cross,) = [w for w in plan.windows if w.kind is WindowKind.CROSS]
    # every node of the larger side sends one flow and receives one; the lone node takes 3
    sends = Counter(a for a, _ in cross.flows)
    takes = Counter(b for _, b in cross.flows)
    assert sends == takes == {"big-1": 1, "big-2": 1, "big-3": 1, "node-0-00": 3}
    fan = plan.fanout("leaf-0", "leaf-big", 1)
    assert fan is not None and (fan.big, fan.fan, fan.loaded, fan.partial) == (
        "leaf-big",
        3,
        3,
        False,
    )
    # the smaller side's servers of one window take one port each
    plans = build_plans(plan, plan.stages[1], term=1)
    ports = sorted(t.port for t in plans["node-0-00"].tasks if isinstance(t, ServeTask))
    assert ports == [7490, 7491, 7492]


def test_the_fan_out_is_bounded_so_a_plan_fits_and_the_rest_is_partial() -> None:
    assert max_fanout(1) == 16
    for rails in (1, 2, 4, 8, 16):
        fan = max_fanout(rails)
        assert 1 <= fan <= 16
        assert 2 * fan * rails + 4 * fan + 16 <= MAX_TASKS  # the busiest node's plan fits
    big = fanout_of("a", 100, "b", 2, 16)
    assert (big.big, big.fan, big.loaded, big.partial) == ("a", 16, 32, True)
    even = fanout_of("a", 4, "b", 4, 16)
    assert (even.fan, even.loaded, even.partial) == (1, 4, False)
    fabric = leaf_spine(1, 1)
    fabric.leaves["leaf-big"] = [f"big-{i}" for i in range(40)]
    plan = plan_run(settings({"phases": ["eastWest"]}), fabric.candidates(), run_id="r",
                    now=NOW, seed=3, rails=dict.fromkeys(fabric.leaf_of, NodeRails(0xFF, 0)))  # fmt: skip
    assert isinstance(plan, RunPlan)
    (cross,) = [w for w in plan.windows if w.kind is WindowKind.CROSS]
    assert Counter(b for _, b in cross.flows)["node-0-00"] == plan.max_fanout < 40
    for p in build_plans(plan, plan.stages[-1], term=1).values():
        assert len(p.tasks) <= MAX_TASKS
        assert decode_plan(encode(p)) == p


def test_every_rail_is_loaded_rail_to_rail_with_the_engine_it_calls_for() -> None:
    """Rail i faces rail i of the peer; with engine auto an RDMA rail runs perftest (and the
    first rail's latency probe is ib_write_lat), an Ethernet rail iperf3; each flow's server
    runs on the receiver from a moment before the flow, on the port the plan names."""
    fabric = leaf_spine(2, 2)
    rails = dict.fromkeys(fabric.leaf_of, NodeRails(mask=0b111, rdma=0b001))
    rails["node-1-01"] = NodeRails(mask=0b011, rdma=0b001)  # no rail 2
    plan = plan_run(settings({"phases": ["eastWest"], "eastWest": {"streams": 8, "dscp": 26}}),
                    fabric.candidates(), run_id="r", now=NOW, seed=3, rails=rails)  # fmt: skip
    assert isinstance(plan, RunPlan)
    for stage in plan.stages:
        plans = build_plans(plan, stage, term=42)
        load = next(w for w in plan.windows_of(stage) if w.kind is not WindowKind.IDLE)
        for a, b in load.flows:
            flows = [t for t in plans[a].tasks if isinstance(t, FlowTask) and t.peer == b]
            want = [0, 1] if "node-1-01" in (a, b) else [0, 1, 2]
            assert sorted(f.rail for f in flows) == want
            for f in flows:
                assert f.engine is (Engine.PERFTEST if f.rail == 0 else Engine.IPERF3)
                assert (f.streams, f.dscp) == (8, 26)
                (serve,) = [t for t in plans[b].tasks if isinstance(t, ServeTask)
                            and t.peer == a and t.rail == f.rail and t.test == "bw"]  # fmt: skip
                assert (serve.port, serve.engine) == (f.port, f.engine)
                assert serve.start == f.start - timedelta(seconds=SERVE_LEAD_SECONDS)
                assert serve.end >= f.end
            lat = [t for t in plans[a].tasks if isinstance(t, LatencyTask) and t.peer == b]
            assert {t.engine for t in lat} == {LatencyEngine.PERFTEST}
            assert all(t.port is not None and t.port >= 7490 + LAT_PORT_OFFSET for t in lat)
        for p in plans.values():
            assert p.term == 42
            assert decode_plan(encode(p)) == p


def test_rails_come_from_the_announcements_by_index_or_by_the_named_interfaces() -> None:
    announced = ((("ens1", "10.1.0.1", True), ("ens2", "10.2.0.1", True)),
                 (("eth9", "10.9.0.1", False),))  # fmt: skip
    assert addresses((), announced, ("10.1.0.1", 7471)) == [("10.1.0.1", True), ("10.2.0.1", True)]
    assert addresses(("ens2", "eth9", "nope"), announced, None) == [
        ("10.2.0.1", True), ("10.9.0.1", False), None,
    ]  # fmt: skip
    # an agent that announced no rails: one rail, its responder's address
    assert addresses((), None, ("10.1.0.1", 7471)) == [("10.1.0.1", False)]
    assert node_rails([("a", True), None, ("c", False)]) == NodeRails(mask=0b101, rdma=0b001)
    found = rails_of(["n1", "n2"], (), {"n1": announced}, {"n2": ("10.0.0.2", 7471)})
    assert found == {"n1": NodeRails(0b11, 0b11), "n2": NodeRails(0b1, 0)}


def test_a_node_left_out_mid_run_is_in_no_later_stage_and_earlier_stages_do_not_change() -> None:
    plan = east_west_plan(2, 3)
    before = [plan.windows_of(s) for s in plan.stages]
    assert plan.exclude("node-0-01", SkipReason.BUSY, from_stage=1)
    assert not plan.exclude("node-0-01", SkipReason.GATED, from_stage=1)
    assert plan.windows_of(plan.stages[0]) == before[0]
    for stage in plan.stages[1:]:
        assert all("node-0-01" not in pair for w in plan.windows_of(stage) for pair in w.flows)
        assert "node-0-01" not in build_plans(plan, stage, term=1)


def test_times_are_absolute_ahead_and_stages_do_not_overlap() -> None:
    plan = east_west_plan(3, 3, duration="10s")
    first = plan.stages[0]
    assert first.start == NOW + timedelta(seconds=LEAD_SECONDS) and first.issued_at == NOW
    for stage in plan.stages:
        idle, load = plan.windows_of(stage)
        assert idle.kind is WindowKind.IDLE and idle.end < load.start < load.measure_start
        assert load.measured_seconds == 10.0 and load.end < stage.deadline
        assert 0 < (stage.deadline - stage.issued_at).total_seconds() <= MAX_PLAN_SECONDS
    for before, after in zip(plan.stages, plan.stages[1:], strict=False):
        assert before.deadline <= after.start


def test_the_lead_grows_with_the_nodes_beyond_5000_up_to_a_minute() -> None:
    """A stage's plans take ~0.25-0.45 ms per node to build and publish
    (bench/loadtest_publish.py): the lead stays 5 s up to 5,000 nodes and leaves about three
    times that beyond."""
    assert stage_lead_seconds(1) == stage_lead_seconds(5_000) == LEAD_SECONDS == 5.0
    assert stage_lead_seconds(10_000) == 10.0
    assert stage_lead_seconds(10**6) == MAX_LEAD_SECONDS == 60.0
    leads = [stage_lead_seconds(n) for n in range(0, 200_000, 997)]
    assert leads == sorted(leads)


@pytest.mark.parametrize(("nodes", "lead"), [(6, 5.0), (30_000, 30.0), (130_000, 60.0)])
def test_every_stage_is_issued_its_lead_ahead_and_within_the_plan_span(
    nodes: int, lead: float
) -> None:
    """With the longest duration and both phases, the longest lead keeps every stage within
    MAX_PLAN_SECONDS from issue to deadline (what an agent accepts)."""
    fabric = leaf_spine(2, nodes // 2)
    plan = plan_run(settings({"duration": "300s"}), fabric.candidates(), run_id="r", now=NOW,
                    seed=1)  # fmt: skip
    assert isinstance(plan, RunPlan)
    assert plan.stages[0].issued_at == NOW
    assert {s.kind for s in plan.stages} >= {WindowKind.INTRA, WindowKind.STORAGE}
    for stage in plan.stages:
        assert (stage.start - stage.issued_at).total_seconds() == lead
        assert 0 < (stage.deadline - stage.issued_at).total_seconds() <= MAX_PLAN_SECONDS
    if nodes <= 6:  # every task of the longest stages fits the model (and its bounds)
        for stage in plan.stages:
            for p in build_plans(plan, stage, term=1).values():
                assert decode_plan(encode(p)) == p


def test_the_plan_is_deterministic_for_a_seed() -> None:
    a, b, c = (
        east_west_plan(3, 4, seed=11),
        east_west_plan(3, 4, seed=11),
        east_west_plan(3, 4, seed=12),
    )
    assert a == b
    assert [w.flows for w in a.windows] != [w.flows for w in c.windows]


def test_node_plans_carry_their_own_tasks_cap_and_deadline_and_survive_the_wire() -> None:
    fabric = leaf_spine(2, 3)
    s = settings({"maxRateMbps": 25_000})
    plan = plan_run(s, fabric.candidates(), run_id="run-1", now=NOW, seed=5)
    assert isinstance(plan, RunPlan)
    _intra_stage, cross_stage, storage_a, storage_b = plan.stages
    plans = build_plans(plan, cross_stage, term=3)
    assert sorted(plans) == sorted(plan.domain_of)
    p = plans["node-0-00"]
    assert (p.run, p.stage, p.node, p.max_rate_mbps, p.deadline) == (
        "run-1",
        1,
        "node-0-00",
        25_000,
        cross_stage.deadline,
    )
    kinds = Counter(type(t) for t in p.tasks)
    # idle echo, then its flow and the server of the flow it receives, and a loaded echo
    assert kinds == {FlowTask: 1, ServeTask: 1, LatencyTask: 2}
    (flow,) = [t for t in p.tasks if isinstance(t, FlowTask)]
    assert plan.domain_of[flow.peer] != plan.domain_of["node-0-00"]
    assert decode_plan(encode(p)) == p
    # storage: every node reads at once; a few read alone afterwards, one at a time
    reads = build_plans(plan, storage_a, term=3)
    assert sorted(reads) == sorted(plan.domain_of)
    # every reader of the all-at-once read has its own part (its own byte range)
    parts = sorted(
        (t.part, t.parts)
        for r in reads.values()
        for t in r.tasks
        if isinstance(t, StorageTask) and t.window.endswith(":all")
    )
    assert parts == [(i, 6) for i in range(6)]
    singles = [w for w in plan.windows_of(storage_a) if w.kind is WindowKind.STORAGE_SINGLE]
    assert len(singles) == min(MAX_SINGLE_READS, 6) and all(len(w.flows) == 1 for w in singles)
    for w, nxt in itertools.pairwise(singles):
        assert w.end < nxt.start
    assert all(
        isinstance(t, StorageTask) and t.endpoint == "datasets" for t in reads["node-1-02"].tasks
    )
    assert plan.windows_of(storage_b)[0].endpoint == "ckpt"


def test_a_plan_carries_the_endpoints_of_exactly_the_nodes_it_exchanges_traffic_with() -> None:
    """Agents know only their epoch's peer set (issue 24): the plan says where its partners
    listen, and the sink admits load flows from those addresses."""
    fabric = leaf_spine(2, 3)
    plan = plan_run(settings({}), fabric.candidates(), run_id="run-1", now=NOW, seed=5)
    assert isinstance(plan, RunPlan)
    nodes = sorted(plan.domain_of)
    endpoints = {n: (f"10.0.0.{i + 1}", 7000 + i) for i, n in enumerate(nodes) if n != nodes[-1]}
    for stage in plan.stages:
        plans = build_plans(plan, stage, term=3, endpoints=endpoints)
        for node, p in plans.items():
            partners = {
                peer
                for w in plan.windows_of(stage)
                if w.kind is not WindowKind.STORAGE and w.kind is not WindowKind.STORAGE_SINGLE
                for a, b in w.flows
                for peer in ((b,) if a == node else (a,) if b == node else ())
            }
            # a node without an announced endpoint is left out (its flows fail, counted)
            assert set(p.peers) == partners - {nodes[-1]}
            for peer, where in p.peers.items():
                assert (str(where.address), where.port) == endpoints[peer]
            assert decode_plan(encode(p)) == p
    cross = build_plans(plan, plan.stages[1], term=3, endpoints=endpoints)["node-0-00"]
    (flow,) = [t for t in cross.tasks if isinstance(t, FlowTask)]
    assert flow.peer in cross.peers or flow.peer == nodes[-1]
    storage = build_plans(plan, plan.stages[2], term=3, endpoints=endpoints)
    assert storage["node-0-00"].peers == {}


def test_run_ids_are_safe_tokens() -> None:
    assert make_run_id("Fabric.Under_Load", NOW) == "fabric-under-load-20260301-020000"
    assert len(make_run_id("x" * 253, NOW)) <= 63
