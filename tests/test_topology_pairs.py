"""status.topology.domainPairs: per cross-domain pair the path-capacity ratio, latency and
loss of the continuous samples and, when a NetworkLoadTest ran, its oversubscription and
loaded latency. Bounded: one entry per domain pair, at most 32, worst first."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from netval.model import Report, Status
from netval.model.loadtest import LoadCell, LoadEastWest, LoadRun
from netval.model.spec import NetworkValidationSpec
from netval.model.topology import MAX_DOMAIN_PAIRS
from netval.operator.state.east_west_matrix import east_west
from netval.operator.state.store import Store
from netval.operator.state.validation import (
    ValidationState,
    ingest_report,
    set_agents_ready,
    set_targeted,
)
from netval.operator.status.compute import validation_status
from netval.operator.topology.pairs import domain_pairs
from test_east_west import DOMAINS, RACK_A, RACK_B, healthy, mesh, same_rack, throughput

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def probe(n: str, p: str) -> list:  # type: ignore[type-arg]
    return [*healthy(n, p), throughput(p, 400.0 if same_rack(n, p) else 100.0)]


def load_run(oversubscription: float, finished: datetime = NOW, run: str = "r1") -> LoadRun:
    cells = [
        LoadCell(a="rack-a", b="rack-a", flows=6, oversubscription=None),
        LoadCell(
            a="rack-b", b="rack-a", flows=9, oversubscription=oversubscription,
            loaded_latency_p99_ms=0.9,
        ),
        LoadCell(a="rack-a", b="rack-c", flows=9, oversubscription=1.5),
    ]  # fmt: skip
    return LoadRun(
        id=run, started_at=finished - timedelta(minutes=1), finished_at=finished,
        east_west=LoadEastWest(cells=cells),
    )  # fmt: skip


def test_samples_and_load_figures_join_per_pair_worst_first() -> None:
    ew = east_west(mesh(RACK_A + RACK_B, probe), DOMAINS, min_throughput_ratio=0.5)
    pairs, omitted = domain_pairs(ew, load_run(3.2).east_west.cells)  # type: ignore[union-attr]
    assert omitted == 0
    assert [(p.a, p.b) for p in pairs] == [("rack-a", "rack-b"), ("rack-a", "rack-c")]
    ab = pairs[0]
    assert (ab.capacity_ratio, ab.pairs, ab.oversubscription, ab.loaded_latency_p99_ms) == (
        4.0, 9, 3.2, 0.9,
    )  # fmt: skip
    assert ab.latency_p99_ms is not None and ab.loss_percent == 0.0
    only_load = pairs[1]  # no continuous samples between them: load figures only
    assert (only_load.capacity_ratio, only_load.oversubscription) == (None, 1.5)
    assert domain_pairs(None) == ([], 0)


def test_bounded_at_32_pairs() -> None:
    cells = [
        LoadCell(a=f"r{i:03}", b=f"r{j:03}", flows=1, oversubscription=1.0 + i / 100)
        for i in range(20)
        for j in range(i + 1, 20)
    ]
    pairs, omitted = domain_pairs(None, cells)
    assert len(pairs) == MAX_DOMAIN_PAIRS and omitted == len(cells) - MAX_DOMAIN_PAIRS
    assert pairs[0].oversubscription == 1.18  # worst first (i = 18 is the last with a j > i)
    assert len(json.dumps([p.model_dump(mode="json", by_alias=True) for p in pairs])) < 8192


def test_the_status_carries_them_and_the_newest_load_run_wins() -> None:
    spec = NetworkValidationSpec.model_validate(
        {"topology": {"levels": ["x/leaf"]}, "checks": {"peers": {"enabled": True}}}
    )
    state = ValidationState(name="v", generation=1)
    nodes = RACK_A + RACK_B
    set_targeted(state, nodes, NOW)
    set_agents_ready(state, True, NOW)
    for node, results in mesh(nodes, probe).items():
        report = Report(
            validation="v", generation=1, node=node, started_at=NOW, duration_ms=1.0,
            status=Status.PASS, results=results,
        )  # fmt: skip
        ingest_report(state, report, NOW)
    labels = {n: {"x/leaf": DOMAINS[n] or ""} for n in nodes}
    store = Store()
    store.note_load_run("v", "nightly", load_run(3.2, NOW, "r1"))
    store.note_load_run("v", "adhoc", load_run(2.0, NOW - timedelta(hours=1), "r0"))  # older
    status = validation_status(
        state, spec, node_labels=labels, previous=None, now=NOW,
        load_run=store.load_runs.get("v"),
    )  # fmt: skip
    topo = status.topology
    assert topo is not None and topo.pairs_key == "x/leaf" and topo.load_test == "nightly/r1"
    first = topo.domain_pairs[0]
    assert (first.a, first.b, first.capacity_ratio, first.oversubscription) == (
        "rack-a", "rack-b", 4.0, 3.2,
    )  # fmt: skip
    patch = status.to_patch()["topology"]
    assert patch["domainPairs"][0]["capacityRatio"] == 4.0  # type: ignore[index]
    # without a load test: the samples' figures alone
    plain = validation_status(state, spec, node_labels=labels, previous=None, now=NOW)
    assert plain.topology is not None and plain.topology.load_test is None
    assert plain.topology.domain_pairs[0].oversubscription is None
