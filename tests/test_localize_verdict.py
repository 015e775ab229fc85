"""Observers, through the status computation on a real Store: the nodes whose failing
paths all point at a suspect node or link elsewhere stay healthy (`PathObserver`); the
culprit's own node, and both ends of a failing path nothing explains, are degraded once the
warning lasts a second report."""

from __future__ import annotations

from datetime import UTC, datetime

from fleet_sim import node_report
from netval.model import CheckResult, Report, Status
from netval.model.keys import FabricHealth
from netval.operator.gating.facts import verdict_of
from netval.operator.gating.verdict import ValidationVerdict, Why
from netval.operator.state.store import Store
from netval.operator.status.compute import validation_status
from test_east_west import latency, loss
from test_retries_attribution import NODES, POOL, store_with


def reports(bad: object) -> list[Report]:
    assert callable(bad)
    out = []
    for node in NODES:
        results: list[CheckResult] = []
        for p in NODES:
            if p != node:
                results += [latency(p), loss(p, 5.0 if bad(node, p) else 0.0)]
        out.append(node_report(node, Status.PASS, POOL, extra=tuple(results)))
    return out


def judge(store: Store) -> ValidationVerdict:
    state, spec = store.states[POOL], store.specs[POOL]
    now = datetime.now(UTC)
    validation_status(state, spec, node_labels=store.node_labels, previous=None, now=now,
                      node_fabric=store.node_fabric)  # fmt: skip
    verdict = verdict_of(POOL, state, spec, store.node_fabric, now)
    state.verdict = verdict
    return verdict


def test_the_peers_of_a_lossy_node_observe_and_only_it_is_degraded() -> None:
    store = store_with({"checks": {"peers": {"enabled": True}}})
    for round_ in range(2):
        for report in reports(lambda a, b: "n3" in (a, b)):
            store.ingest_report(report, False)
        verdict = judge(store)
        if round_ == 0:  # a first report of failing paths: everybody waits for witnesses
            assert {d.why for d in verdict.nodes.values()} == {Why.OBSERVER}
    assert verdict.nodes["n3"].label is FabricHealth.DEGRADED
    assert verdict.nodes["n3"].why is Why.WARNING
    for node in set(NODES) - {"n3"}:
        assert verdict.nodes[node].label is FabricHealth.HEALTHY, node
        assert verdict.nodes[node].why is Why.OBSERVER and verdict.nodes[node].admissible


def test_a_failing_path_nothing_explains_degrades_both_ends() -> None:
    store = store_with({"checks": {"peers": {"enabled": True}}})
    for _ in range(2):
        for report in reports(lambda a, b: {a, b} == {"n0", "n1"}):
            store.ingest_report(report, False)
        verdict = judge(store)
    status = store.states[POOL]
    assert status.observers == frozenset()
    assert {n for n, d in verdict.nodes.items() if d.label is FabricHealth.DEGRADED} == {
        "n0",
        "n1",
    }


def sample(peer: str) -> CheckResult:
    from netval.model.ids import CheckId

    return CheckResult(check=CheckId.PEER_THROUGHPUT, subject=peer, status=Status.FAIL,
                       message="connect timed out", observed={})  # fmt: skip


def test_a_failed_sample_towards_the_suspect_is_an_observers_warning_too() -> None:
    from netval.operator.state.east_west_matrix import analyse

    results: dict[str, list[CheckResult]] = {}
    for node in NODES:
        rs: list[CheckResult] = []
        for p in NODES:
            if p != node:
                rs += [latency(p), loss(p, 5.0 if "n3" in (node, p) else 0.0)]
        results[node] = rs
    results["n5"] = [r for r in results["n5"] if r.subject != "n3"] + [sample("n3")]
    domains = dict.fromkeys(NODES, "rack-1")
    got = analyse(results, domains, min_throughput_ratio=0.5)
    assert "n5" in got.observers and "n3" not in got.observers
    # a failed sample towards a healthy node is nobody's suspect: n0 warns on its own
    results["n0"] = [*results["n0"], sample("n1")]
    assert "n0" not in analyse(results, domains, min_throughput_ratio=0.5).observers


def test_a_faults_last_failing_results_stay_explained_for_a_while() -> None:
    from netval.operator.state.east_west_matrix import analyse

    # after the repair only n4 still reports its old failing path to n3: alone, no suspect
    results = {n: [loss(p, 0.0) for p in NODES if p != n] for n in NODES}
    results["n4"] = [loss(p, 5.0 if p == "n3" else 0.0) for p in NODES if p != "n4"]
    domains = dict.fromkeys(NODES, "rack-1")
    alone = analyse(results, domains, min_throughput_ratio=0.5)
    assert alone.observers == frozenset() and alone.summary.suspects == []
    remembered = analyse(results, domains, min_throughput_ratio=0.5, recent={("n3", "n4"): "n3"})
    assert remembered.observers == {"n4"}
    linked = analyse(results, domains, min_throughput_ratio=0.5, recent={("n3", "n4"): None})
    assert linked.observers == {"n3", "n4"} and linked.summary.suspects == []
