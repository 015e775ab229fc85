"""Aggregation of agent reports into the NetworkValidation status (pure, explicit time)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from netval.model.ids import CheckGroup, CheckId, Status
from netval.model.results import CheckResult, Report
from netval.model.status import (
    MAX_FAILURES,
    Condition,
    ConditionType,
    NetworkValidationStatus,
)
from netval.operator.state.aggregation import compute_status
from netval.operator.state.validation import (
    IngestResult,
    ValidationState,
    agent_pods_detail,
    forget_node,
    ingest_report,
    is_fresh,
    next_deadline,
    node_offline,
    node_online,
    restore_since,
    set_agents_ready,
    set_spec,
    set_targeted,
)
from state_kit import node_health

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
INTERVAL = 10.0
NODES = ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]

Res = tuple[CheckId, str, Status] | tuple[CheckId, str, Status, str]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def result(check: CheckId, subject: str, status: Status, message: str = "") -> CheckResult:
    return CheckResult(check=check, subject=subject, status=status, message=message or status)


def report(
    node: str,
    *,
    started: float = 0.0,
    generation: int = 1,
    results: list[Res] | None = None,
    validation: str = "fabric",
) -> Report:
    rs = [result(*r) for r in results] if results is not None else [PASSING]
    status = max((r.status for r in rs), key=lambda s: s.severity, default=Status.SKIP)
    return Report(
        validation=validation,
        generation=generation,
        node=node,
        started_at=at(started),
        duration_ms=500,
        status=status,
        results=rs,
    )


PASSING = result(CheckId.LINK_CARRIER, "ens1np0", Status.PASS)
CARRIER_DOWN: Res = (CheckId.LINK_CARRIER, "ens1np0", Status.FAIL, "carrier down")
MTU_OK: Res = (CheckId.MTU_INTERFACE, "ens1np0", Status.PASS)
CARRIER_OK: Res = (CheckId.LINK_CARRIER, "ens1np0", Status.PASS)


def state(nodes: list[str] = NODES, *, generation: int = 1) -> ValidationState:
    s = ValidationState(name="fabric")
    set_spec(s, generation=generation, interval_seconds=INTERVAL)
    set_targeted(s, nodes, at(0))
    set_agents_ready(s, True, at(0))
    return s


def cond(status: NetworkValidationStatus, kind: ConditionType) -> Condition:
    c = status.condition(kind)
    assert c is not None
    return c


def test_three_of_four_reporting_names_the_stale_node() -> None:
    s = state()
    for node in NODES[:3]:
        assert ingest_report(s, report(node, started=1), at(2)) is IngestResult.ACCEPTED
    # within the first 3 intervals the silent node is awaited, not yet called stale
    st = compute_status(s, at(5), previous=None)
    assert (st.nodes.targeted, st.nodes.reporting, st.nodes.stale) == (4, 3, 1)
    ready = cond(st, ConditionType.READY)
    assert (ready.status, ready.reason) == ("False", "AwaitingReports")
    assert "gpu-d" in ready.message
    # the others keep reporting; gpu-d never does
    for node in NODES[:3]:
        ingest_report(s, report(node, started=30), at(31))
    st = compute_status(s, at(35), previous=st)
    assert (st.nodes.targeted, st.nodes.reporting, st.nodes.stale) == (4, 3, 1)
    assert st.nodes.passing == 3
    ready = cond(st, ConditionType.READY)
    assert (ready.status, ready.reason) == ("False", "NodesStale")
    assert ready.message.startswith("1 of 4 targeted nodes stale: gpu-d (never reported)")
    assert ready.observed_generation == 1
    healthy = cond(st, ConditionType.HEALTHY)
    assert (healthy.status, healthy.reason) == ("True", "AllChecksPassing")
    assert "1 targeted nodes without a fresh report" in healthy.message
    assert st.last_report_time == at(31)
    assert st.observed_generation == 1


def test_all_reporting_and_passing() -> None:
    s = state()
    for node in NODES:
        ingest_report(s, report(node, results=[CARRIER_OK, MTU_OK]), at(1))
    st = compute_status(s, at(2), previous=None)
    assert cond(st, ConditionType.READY).status == "True"
    assert cond(st, ConditionType.READY).reason == "AgentsReporting"
    assert cond(st, ConditionType.HEALTHY).status == "True"
    # (excluded and admissible are the node verdict's, filled in by status.compute)
    assert st.nodes.model_dump(exclude={"excluded", "admissible"}) == {
        "targeted": 4,
        "reporting": 4,
        "passing": 4,
        "warning": 0,
        "failing": 0,
        "stale": 0,
    }
    assert st.to_patch()["checks"] == {
        "link.carrier": {"pass": 4, "warn": 0, "fail": 0},
        "mtu.interface": {"pass": 4, "warn": 0, "fail": 0},
    }
    assert st.failures == []


def test_failing_report_and_since_tracking() -> None:
    s = state()
    for node in NODES:
        ingest_report(s, report(node), at(1))
    assert ingest_report(s, report("gpu-b", started=10, results=[CARRIER_DOWN, MTU_OK]), at(11))
    st = compute_status(s, at(12), previous=None)
    healthy = cond(st, ConditionType.HEALTHY)
    assert (healthy.status, healthy.reason) == ("False", "ChecksFailing")
    assert healthy.message == "1 of 4 reporting nodes failing: gpu-b (link.carrier)"
    assert st.nodes.failing == 1 and st.nodes.passing == 3
    assert [(f.node, f.check, f.subject, f.message, f.since) for f in st.failures] == [
        ("gpu-b", "link.carrier", "ens1np0", "carrier down", at(11))
    ]
    assert st.checks["link.carrier"].model_dump(by_alias=True) == {"pass": 3, "warn": 0, "fail": 1}
    assert node_health(s, "gpu-b", at(12)) == "unhealthy"
    assert node_health(s, "gpu-a", at(12)) == "healthy"

    # still failing: since is kept (and error counts as still failing)
    still = (CheckId.LINK_CARRIER, "ens1np0", Status.ERROR, "cannot read carrier")
    ingest_report(s, report("gpu-b", started=20, results=[still]), at(21))
    st2 = compute_status(s, at(22), previous=st)
    assert [(f.since, f.message) for f in st2.failures] == [(at(11), "cannot read carrier")]
    assert cond(st2, ConditionType.HEALTHY).last_transition_time == at(12)

    # passes: dropped; a later failure starts a new since
    ingest_report(s, report("gpu-b", started=30, results=[CARRIER_OK]), at(31))
    st3 = compute_status(s, at(32), previous=st2)
    assert st3.failures == []
    assert cond(st3, ConditionType.HEALTHY).status == "True"
    assert cond(st3, ConditionType.HEALTHY).last_transition_time == at(32)
    ingest_report(s, report("gpu-b", started=40, results=[CARRIER_DOWN]), at(41))
    st4 = compute_status(s, at(42), previous=st3)
    assert [f.since for f in st4.failures] == [at(41)]


def test_error_results_count_as_fail_and_skip_is_not_counted() -> None:
    s = state(["gpu-a", "gpu-b"])
    ingest_report(
        s,
        report(
            "gpu-a",
            results=[
                (CheckId.RDMA_ERRORS, "mlx5_0/1", Status.ERROR, "counter read failed"),
                (CheckId.PFC_DISCARDS, "ens1np0", Status.SKIP, "unknown driver"),
            ],
        ),
        at(1),
    )
    ingest_report(
        s,
        report("gpu-b", results=[(CheckId.PFC_DISCARDS, "ens1np0", Status.SKIP, "unknown")]),
        at(1),
    )
    st = compute_status(s, at(2), previous=None)
    assert st.nodes.failing == 1 and st.nodes.passing == 1  # skip-only node passes
    assert st.checks["rdma.errors"].fail == 1
    assert "pfc.discards" not in st.checks
    assert [(f.check, f.subject) for f in st.failures] == [("rdma.errors", "mlx5_0/1")]
    assert node_health(s, "gpu-b", at(2)) == "healthy"


def test_warning_node() -> None:
    s = state(["gpu-a"])
    warn: Res = (CheckId.PFC_PAUSE_STORM, "ens1np0/prio3", Status.WARN, "pause 7%")
    ingest_report(s, report("gpu-a", results=[warn, CARRIER_OK]), at(1))
    st = compute_status(s, at(2), previous=None)
    assert st.nodes.warning == 1
    assert st.checks["pfc.pause_storm"].warn == 1
    healthy = cond(st, ConditionType.HEALTHY)
    assert healthy.status == "True" and "1 warning: gpu-a" in healthy.message
    assert st.failures == []
    assert node_health(s, "gpu-a", at(2)) == "degraded"


def test_per_check_counts_count_nodes_at_their_worst_subject() -> None:
    s = state(["gpu-a"])
    results: list[Res] = [
        (CheckId.LINK_CARRIER, "ens1np0", Status.PASS),
        (CheckId.LINK_CARRIER, "ens2np0", Status.FAIL, "down"),
        (CheckId.LINK_CARRIER, "ens3np0", Status.PASS),
    ]
    ingest_report(s, report("gpu-a", results=results), at(1))
    st = compute_status(s, at(2), previous=None)
    assert st.checks["link.carrier"].model_dump(by_alias=True) == {"pass": 0, "warn": 0, "fail": 1}


def test_stale_after_three_missed_intervals_not_before() -> None:
    s = state(["gpu-a"])
    ingest_report(s, report("gpu-a", started=0), at(1))
    window = 3 * INTERVAL
    st = compute_status(s, at(1 + window), previous=None)
    assert st.nodes.reporting == 1 and st.nodes.stale == 0
    assert cond(st, ConditionType.READY).status == "True"
    assert is_fresh(s, "gpu-a", at(1 + window))
    assert next_deadline(s, at(5)) == at(1 + window) + timedelta(microseconds=1)

    st = compute_status(s, at(1 + window + 0.001), previous=st)
    assert st.nodes.reporting == 0 and st.nodes.stale == 1
    ready = cond(st, ConditionType.READY)
    assert (ready.status, ready.reason) == ("False", "NodesStale")
    assert "gpu-a (last report 30s ago)" in ready.message
    healthy = cond(st, ConditionType.HEALTHY)
    assert (healthy.status, healthy.reason) == ("Unknown", "NodesStale")
    assert node_health(s, "gpu-a", at(1 + window + 0.001)) == "unknown"
    assert st.last_report_time == at(1)


def test_offline_is_stale_at_once_and_online_plus_report_recovers() -> None:
    s = state(["gpu-a", "gpu-b"])
    ingest_report(s, report("gpu-a"), at(1))
    ingest_report(s, report("gpu-b"), at(1))
    s.dirty = False
    node_offline(s, "gpu-b", at(2))
    assert s.dirty
    st = compute_status(s, at(2), previous=None)
    assert (st.nodes.reporting, st.nodes.stale) == (1, 1)
    assert "gpu-b (offline)" in cond(st, ConditionType.READY).message
    assert node_health(s, "gpu-b", at(2)) == "unknown"
    # online alone needs a report to be fresh again... but the stored one still is fresh
    node_online(s, "gpu-b", at(3))
    assert compute_status(s, at(3), previous=st).nodes.reporting == 2
    # a live report clears offline too (the agent evidently runs)
    node_offline(s, "gpu-b", at(4))
    ingest_report(s, report("gpu-b", started=10), at(11))
    assert compute_status(s, at(12), previous=st).nodes.reporting == 2


def test_retained_report_freshness_uses_the_report_time() -> None:
    s = state(["gpu-a", "gpu-b"])
    # operator restarts at t=300: gpu-a's retained report is from t=290, gpu-b's from t=0
    now = at(300)
    ingest_report(s, report("gpu-a", started=290), now, retained=True)
    ingest_report(s, report("gpu-b", started=0), now, retained=True)
    st = compute_status(s, now, previous=None)
    assert st.nodes.reporting == 1
    assert "gpu-b" in cond(st, ConditionType.READY).message
    # the broker replays retained messages on reconnect: duplicates don't refresh
    assert ingest_report(s, report("gpu-b", started=0), at(301)) is IngestResult.DUPLICATE
    assert compute_status(s, at(301), previous=st).nodes.reporting == 1


def test_older_generation_accepted_until_the_new_one_reports() -> None:
    s = state(["gpu-a", "gpu-b"])
    ingest_report(s, report("gpu-a", generation=1), at(1))
    ingest_report(s, report("gpu-b", generation=1), at(1))
    set_spec(s, generation=2, interval_seconds=INTERVAL)
    # nobody runs generation 2 yet: generation 1 reports still count
    assert ingest_report(s, report("gpu-a", generation=1, started=10), at(11)) is (
        IngestResult.ACCEPTED
    )
    st = compute_status(s, at(12), previous=None)
    assert st.observed_generation == 2
    assert cond(st, ConditionType.READY).observed_generation == 2
    assert "2 still on a generation older than 2" in cond(st, ConditionType.READY).message
    # gpu-b's agent rolled and reports generation 2
    ok = ingest_report(s, report("gpu-b", generation=2, started=12), at(13))
    assert ok is IngestResult.ACCEPTED
    # from now on older generation reports are ignored, failing ones included
    old = report("gpu-a", generation=1, started=20, results=[CARRIER_DOWN])
    assert ingest_report(s, old, at(21)) is IngestResult.STALE_GENERATION
    st = compute_status(s, at(22), previous=st)
    assert st.failures == [] and st.nodes.failing == 0
    assert "1 still on a generation older than 2" in cond(st, ConditionType.READY).message
    # and a node never goes back to an older generation while its report is fresh
    back = report("gpu-b", generation=1, started=30)
    assert ingest_report(s, back, at(31)) is IngestResult.STALE_GENERATION


def test_newer_generation_than_the_cr_is_accepted() -> None:
    s = state(["gpu-a"], generation=3)
    assert ingest_report(s, report("gpu-a", generation=4), at(1)) is IngestResult.ACCEPTED
    assert compute_status(s, at(2), previous=None).nodes.reporting == 1


def test_out_of_order_and_recovery_once_stale() -> None:
    s = state(["gpu-a"])
    ingest_report(s, report("gpu-a", started=100), at(101))
    assert ingest_report(s, report("gpu-a", started=90), at(102)) is IngestResult.OUT_OF_ORDER
    # the agent's clock stepped back: once the stored report is stale, it recovers
    late = at(101 + 3 * INTERVAL + 1)
    assert ingest_report(s, report("gpu-a", started=50), late) is IngestResult.ACCEPTED
    assert is_fresh(s, "gpu-a", late)


def test_duplicate_report_is_idempotent() -> None:
    s = state(["gpu-a"])
    r = report("gpu-a", results=[CARRIER_DOWN])
    assert ingest_report(s, r, at(1)) is IngestResult.ACCEPTED
    first = compute_status(s, at(2), previous=None)
    s.dirty = False
    assert ingest_report(s, r, at(5)) is IngestResult.DUPLICATE
    assert not s.dirty
    again = compute_status(s, at(2), previous=first)
    assert again == first
    assert s.nodes["gpu-a"].reported_at == at(1)
    assert s.nodes["gpu-a"].ok_streak == 0


def test_non_targeted_report_is_stored_not_counted() -> None:
    s = state(["gpu-a"])
    s.dirty = False
    other = report("cpu-1", results=[CARRIER_DOWN])
    assert ingest_report(s, other, at(1)) is IngestResult.NOT_TARGETED
    assert not s.dirty
    st = compute_status(s, at(2), previous=None)
    assert st.nodes.targeted == 1 and st.nodes.reporting == 0 and st.nodes.failing == 0
    assert st.failures == [] and st.checks == {}
    assert node_health(s, "cpu-1", at(2)) == "unknown"
    assert st.last_report_time is None
    # relabelled into the selector: counts at once
    set_targeted(s, ["gpu-a", "cpu-1"], at(3))
    st = compute_status(s, at(3), previous=st)
    assert st.nodes.failing == 1 and st.failures[0].node == "cpu-1"
    # relabelled out again
    set_targeted(s, ["gpu-a"], at(4))
    assert compute_status(s, at(4), previous=st).nodes.failing == 0


def test_wrong_validation_is_rejected() -> None:
    s = state(["gpu-a"])
    r = report("gpu-a", validation="other")
    assert ingest_report(s, r, at(1)) is IngestResult.WRONG_VALIDATION
    assert "gpu-a" not in s.nodes


def test_failures_capped_at_50_and_ordered_deterministically() -> None:
    nodes = [f"gpu-{i:02d}" for i in range(30)]
    s = state(nodes)
    # reverse arrival order, three failing subjects per node, different since per batch
    for i, node in enumerate(reversed(nodes)):
        results: list[Res] = [
            (CheckId.PFC_DISCARDS, f"ens{j}np0", Status.FAIL, "rx_prio3_discards +12")
            for j in (2, 0, 1)
        ]
        ingest_report(s, report(node, results=results), at(1 if i % 2 else 2))
    st = compute_status(s, at(3), previous=None)
    assert len(st.failures) == MAX_FAILURES
    keys = [(f.since, f.node, f.check, f.subject) for f in st.failures]
    assert keys == sorted(keys)
    assert keys[0] == (at(1), "gpu-00", "pfc.discards", "ens0np0")
    odd = [n for i, n in enumerate(reversed(nodes)) if i % 2]
    assert {f.node for f in st.failures if f.since == at(1)} == set(odd)
    assert st.nodes.failing == 30
    assert st.checks["pfc.discards"].fail == 30
    healthy = cond(st, ConditionType.HEALTHY)
    assert healthy.message.endswith("and 25 more")
    assert compute_status(s, at(3), previous=None) == st
    assert len(st.model_dump_json()) < 64 * 1024


def test_long_failure_messages_are_truncated() -> None:
    s = state(["gpu-a"])
    long: Res = (CheckId.LINK_CARRIER, "ens1np0", Status.FAIL, "x" * 1000)
    ingest_report(s, report("gpu-a", results=[long]), at(1))
    st = compute_status(s, at(2), previous=None)
    assert len(st.failures[0].message) == 256


def test_last_transition_time_preserved_while_status_unchanged() -> None:
    s = state(["gpu-a", "gpu-b"])
    ingest_report(s, report("gpu-a"), at(1))
    st1 = compute_status(s, at(2), previous=None)
    ready1 = cond(st1, ConditionType.READY)
    assert (ready1.status, ready1.reason, ready1.last_transition_time) == (
        "False",
        "AwaitingReports",
        at(2),
    )
    # still False (reason changes to NodesStale): lastTransitionTime kept
    ingest_report(s, report("gpu-a", started=40), at(41))
    st2 = compute_status(s, at(42), previous=st1)
    ready2 = cond(st2, ConditionType.READY)
    assert (ready2.status, ready2.reason, ready2.last_transition_time) == (
        "False",
        "NodesStale",
        at(2),
    )
    # flips to True: now
    ingest_report(s, report("gpu-b", started=42), at(43))
    st3 = compute_status(s, at(44), previous=st2)
    assert cond(st3, ConditionType.READY).last_transition_time == at(44)
    assert cond(st3, ConditionType.HEALTHY).last_transition_time == at(2)


def test_other_conditions_of_previous_are_kept() -> None:
    s = state(["gpu-a"])
    gating = Condition(
        type=ConditionType.GATING,
        status="False",
        reason="BreakerTripped",
        message="x",
        last_transition_time=at(0),
        observed_generation=1,
    )
    previous = NetworkValidationStatus(conditions=[gating])
    st = compute_status(s, at(1), previous=previous)
    assert [c.type for c in st.conditions] == ["Ready", "Healthy", "Gating"]
    assert st.conditions[2] == gating


def test_agents_pending_no_targets_invalid_spec() -> None:
    s = ValidationState(name="fabric", interval_seconds=INTERVAL, generation=1)
    st = compute_status(s, at(0), previous=None)
    assert cond(st, ConditionType.READY).reason == "AgentsPending"
    assert cond(st, ConditionType.HEALTHY).status == "Unknown"
    set_agents_ready(s, False, at(0), detail="1/4 agent pods ready")
    st = compute_status(s, at(0), previous=None)
    assert cond(st, ConditionType.READY).message.endswith("1/4 agent pods ready")
    set_agents_ready(s, True, at(0))
    st = compute_status(s, at(0), previous=None)
    ready = cond(st, ConditionType.READY)
    assert (ready.status, ready.reason) == ("False", "NoTargetedNodes")
    healthy = cond(st, ConditionType.HEALTHY)
    assert (healthy.status, healthy.reason) == ("Unknown", "NoTargetedNodes")
    set_targeted(s, ["gpu-a"], at(0))
    st = compute_status(s, at(0), previous=None)
    healthy = cond(st, ConditionType.HEALTHY)
    assert (healthy.status, healthy.reason) == ("Unknown", "AwaitingReports")
    set_spec(s, generation=2, interval_seconds=INTERVAL, spec_error="spec.interval: bad")
    ready = cond(compute_status(s, at(0), previous=None), ConditionType.READY)
    assert (ready.reason, ready.message) == ("InvalidSpec", "invalid spec: spec.interval: bad")


def test_stale_message_lists_at_most_five_nodes() -> None:
    nodes = [f"gpu-{i}" for i in range(8)]
    s = state(nodes)
    st = compute_status(s, at(31), previous=None)
    msg = cond(st, ConditionType.READY).message
    assert msg.startswith("8 of 8 targeted nodes stale: gpu-0 (never reported), ")
    assert msg.endswith("gpu-4 (never reported) and 3 more")
    assert "gpu-5" not in msg


def test_forget_node() -> None:
    s = state(["gpu-a", "gpu-b"])
    ingest_report(s, report("gpu-a", results=[CARRIER_DOWN]), at(1))
    node_offline(s, "gpu-b", at(1))
    forget_node(s, "gpu-a")
    forget_node(s, "gpu-b")
    st = compute_status(s, at(2), previous=None)
    assert st.nodes.targeted == 0 and st.failures == []
    assert s.nodes == {} and s.offline == {}


def test_restore_since_after_restart() -> None:
    s = state(["gpu-a"])
    ingest_report(s, report("gpu-a", results=[CARRIER_DOWN]), at(1))
    written = compute_status(s, at(2), previous=None)
    # operator restart: new state, retained report replayed
    s2 = state(["gpu-a"])
    restore_since(s2, written)
    ingest_report(s2, report("gpu-a", started=190, results=[CARRIER_DOWN]), at(200), retained=True)
    st = compute_status(s2, at(200), previous=written)
    assert st.failures[0].since == at(1)
    assert cond(st, ConditionType.HEALTHY).last_transition_time == at(2)


def test_ok_streak_counts_reports_without_failures() -> None:
    s = state(["gpu-a"])
    ingest_report(s, report("gpu-a", results=[CARRIER_DOWN]), at(1))
    for i in range(1, 4):
        ingest_report(s, report("gpu-a", started=10 * i), at(10 * i + 1))
    assert s.nodes["gpu-a"].ok_streak == 3


def test_naive_now_is_refused() -> None:
    s = state(["gpu-a"])
    with pytest.raises(ValueError, match="timezone-aware"):
        compute_status(s, datetime(2025, 1, 1), previous=None)


def test_status_at_1000_nodes_stays_bounded() -> None:
    """Scale is measured in bench/aggregate_cost.py; here: counts right, failures capped."""
    nodes = [f"gpu-{i:04d}" for i in range(1000)]
    s = state(nodes)
    # fleet.* and topology.* are the operator's own verdicts: reports cannot carry them
    operator_side = (CheckGroup.PEER, CheckGroup.FLEET, CheckGroup.TOPOLOGY)
    checks = [c for c in CheckId if c.group not in operator_side]
    for n, node in enumerate(nodes):
        results: list[Res] = [
            (checks[i % len(checks)], f"s{i}", Status.FAIL if (n + i) % 97 == 0 else Status.PASS)
            for i in range(40)
        ]
        ingest_report(s, report(node, results=results), at(1))
    status = compute_status(s, at(2), previous=None)
    failing = sum(1 for n in range(1000) if any((n + i) % 97 == 0 for i in range(40)))
    assert status.nodes.targeted == status.nodes.reporting == 1000
    assert status.nodes.failing == failing
    assert status.nodes.passing == 1000 - failing
    assert len(status.failures) == 50


def test_failing_paths_degrade_the_prober_but_never_fail_it() -> None:
    """One lossy node makes every node that probes it fail peer.loss: the probers are
    victims, so path results make them degraded (no taint); eastWest names the suspect."""
    s = state(["gpu-a"])
    ingest_report(
        s,
        report("gpu-a", results=[(CheckId.PEER_LOSS, "gpu-z", Status.FAIL, "loss 12%"),
                                 (CheckId.MTU_INTERFACE, "ens1np0", Status.PASS, "MTU 9000")]),
        at(1),
    )  # fmt: skip
    st = compute_status(s, at(2), previous=None)
    assert (st.nodes.failing, st.nodes.warning) == (0, 1)
    assert st.checks["peer.loss"].fail == 1
    assert node_health(s, "gpu-a", at(2)) == "degraded"


def test_agent_pods_detail_says_only_what_explains_missing_reports() -> None:
    assert agent_pods_detail(desired=4, ready=4, targeted=4) == ""
    assert agent_pods_detail(desired=4, ready=1, targeted=4) == "1 of 4 agent pods ready"
    short = agent_pods_detail(desired=3, ready=3, targeted=4)
    assert "runs on 3 of the 4 targeted nodes" in short and "tolerate" in short


def test_operator_verdicts_fold_on_top_of_the_report_and_never_undo_each_other() -> None:
    """fleet.consistency and topology.agreement are both folded into a node's record; setting,
    changing or clearing one keeps the other and the report's own values."""
    from netval.operator.state.node_verdicts import fold_verdict

    s = state(["gpu-a"])
    ingest_report(s, report("gpu-a"), at(1))
    rec = s.nodes["gpu-a"]
    fleet, topo = CheckId.FLEET_CONSISTENCY.value, CheckId.TOPOLOGY_AGREEMENT.value
    failure = (at(1), "gpu-a", topo, "ens1np0", "sees switch sw-2, labelled leaf-1")
    assert fold_verdict(rec, topo, Status.FAIL, (failure,))
    assert fold_verdict(rec, fleet, Status.WARN, ())
    assert rec.status is Status.FAIL and rec.failing_checks == (topo,)
    assert dict(rec.check_buckets) == {"link.carrier": 0, topo: 2, fleet: 1}
    assert not fold_verdict(rec, fleet, Status.WARN, ())  # unchanged: nothing to do
    assert fold_verdict(rec, fleet, None, ())  # fleet verdict gone: topology's stays
    assert rec.status is Status.FAIL and rec.failures == (failure,)
    assert fold_verdict(rec, topo, None, ())  # and back to the report alone
    assert rec.status is Status.PASS and rec.failures == () and rec.failing_checks == ()
    assert dict(rec.check_buckets) == {"link.carrier": 0}
