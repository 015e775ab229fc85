"""Beats through the real operator (Kopf, the kmock API, a real broker), issue 23: simulated
agents publish one full report each, then only beats for several intervals. Steady state costs
no Node write and no status write (the status resync is the only one allowed); a beat whose
digest contradicts the held report makes the node stale until its full report arrives."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.model import Report, Status
from netval.model.beat import Beat, report_digest
from netval.model.spec import NetworkValidationSpec
from netval.operator.ingest.subscriber import ReportIngest
from netval.operator.state import validation as vs
from netval.operator.state.store import Store
from netval.operator.term_runtime import OperatorRuntime
from operator_env import GPU, NODES, publish, report, report_msg, validation, wait_status
from test_ingest_faults import until, with_ingest
from test_operator import scrape


def _beat_msg(r: Report, seq: int, at: datetime, digest: str = "") -> tuple[str, bytes]:
    beat = Beat(seq=seq, cycle_at=at, digest=digest or report_digest(r), worst=r.status)
    return (f"netval/v1/{r.validation}/{r.node}/beat", beat.to_json().encode())


def _patches(cluster: KubeCluster) -> tuple[int, int]:
    """(Node PATCHes, status PATCHes of pool-a) served so far."""
    requests = cluster.requests()
    nodes = sum(1 for m, p in requests if m == "PATCH" and p.startswith("/api/v1/nodes/"))
    status = sum(1 for m, p in requests if m == "PATCH" and p.endswith("pool-a/status"))
    return nodes, status


def _metric(runtime: OperatorRuntime, line_start: str) -> float:
    for line in scrape(runtime).splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[1])
    raise AssertionError(f"{line_start} is not exported")


def _round_over(runtime: OperatorRuntime) -> None:
    """A status round over what was ingested (it clears `dirty` when it computes)."""
    state = runtime.store.states["pool-a"]
    wait_for(lambda: not state.dirty and not runtime.status._inflight, what="a status round")


def test_beats_keep_nodes_fresh_without_api_writes_and_a_mismatch_waits_for_the_report(
    cluster: KubeCluster,
    operator: tuple[OperatorRuntime, InMemorySpanExporter],
    mosquitto_broker: MosquittoBroker,
) -> None:
    runtime, _ = operator
    # 5 s interval: a node not refreshed turns stale after 15 s, so the beats below are what
    # keeps them fresh over the intervals this test walks through
    cluster.create(validation(interval="5s"))
    base = datetime.now(UTC)
    reports = {n: report(n, started=base) for n in NODES}
    publish(mosquitto_broker, [report_msg(r) for r in reports.values()])
    wait_status(cluster, lambda s: s.get("nodes", {}).get("passing") == 4, "4 passing")
    state = runtime.store.states["pool-a"]
    wait_for(lambda: runtime.gating.writes >= len(NODES)
             and runtime.gating.condition_writes >= len(NODES),
             what="the fabric labels and conditions written")  # fmt: skip
    _round_over(runtime)
    nodes_before, status_before = _patches(cluster)
    writes_before = _metric(runtime, 'netval_operator_api_writes_total{kind="status_patch"}')

    # Several intervals of beats only: freshness moves, nothing is written.
    intervals = 4
    for seq in range(1, intervals + 1):
        at = base + timedelta(seconds=5 * seq)
        publish(mosquitto_broker, [_beat_msg(r, seq, at) for r in reports.values()])
        wait_for(
            lambda seq=seq: runtime.ingest.stats.beats["matched"] >= seq * len(NODES),
            what=f"beats of interval {seq} matched",
        )
        _round_over(runtime)
    stamps = [state.nodes[n].reported_at for n in NODES]
    assert all(t > base for t in stamps)
    assert all(state.nodes[n].ok_streak == 1 + intervals for n in NODES)
    assert _patches(cluster) == (nodes_before, status_before)
    assert _metric(runtime, 'netval_operator_beats_total{outcome="matched"}') == 16
    assert (
        _metric(runtime, 'netval_operator_api_writes_total{kind="status_patch"}') == writes_before
    )
    assert _metric(runtime, 'netval_operator_api_writes_total{kind="node_patch"}') == (
        runtime.gating.writes + runtime.topology_labels.writes
    )

    # A beat that does not match gpu-b's report: gpu-b is no longer counted fresh...
    at = base + timedelta(seconds=5 * (intervals + 1))
    changed = report("gpu-b", Status.FAIL, started=at)
    publish(mosquitto_broker, [_beat_msg(reports["gpu-b"], 99, at, report_digest(changed))])
    status = wait_status(cluster, lambda s: s["nodes"]["reporting"] == 3, "gpu-b not counted fresh")
    assert status["nodes"]["stale"] == 1 and status["nodes"]["failing"] == 0
    assert runtime.ingest.stats.beats["mismatched"] == 1
    # ... nor by its next beats, which vouch for the report the operator does not hold ...
    later = at + timedelta(seconds=5)
    publish(mosquitto_broker, [_beat_msg(reports["gpu-b"], 100, later, report_digest(changed))])
    wait_for(lambda: runtime.ingest.stats.beats["mismatched"] == 2, what="the second beat")
    _round_over(runtime)
    assert runtime.store.states["pool-a"].nodes["gpu-b"].unconfirmed
    # ... until its full report arrives, whose verdict then counts.
    publish(mosquitto_broker, [report_msg(changed)])
    status = wait_status(
        cluster,
        lambda s: s["nodes"]["reporting"] == 4 and s["nodes"]["failing"] == 1,
        "gpu-b's full report counted",
    )
    assert not state.nodes["gpu-b"].unconfirmed


def test_a_restarted_operator_counts_nodes_fresh_from_their_retained_beats(
    mosquitto_broker: MosquittoBroker,
) -> None:
    """The broker holds each node's full report from nine intervals ago (stale by its own
    time) and its last beat: an operator starting now (its real ingest against the real
    broker) counts every node fresh from the beat, before Kopf resumed the CR (parked) as well
    as after; a node whose retained beat speaks for another report is not counted."""
    now = datetime.now(UTC)
    old = now - timedelta(seconds=9 * 60)
    reports = {n: report(n, started=old) for n in NODES}
    messages = [report_msg(r) for r in reports.values()]
    messages += [
        _beat_msg(r, 9, now - timedelta(seconds=5)) for n, r in reports.items() if n != "gpu-d"
    ]
    lost = report("gpu-d", Status.FAIL, started=now - timedelta(seconds=30))
    messages.append(_beat_msg(reports["gpu-d"], 9, now - timedelta(seconds=5), report_digest(lost)))
    publish(mosquitto_broker, messages)
    spec = NetworkValidationSpec.model_validate({"nodeSelector": GPU, "interval": "60s"})

    for parked in (True, False):
        store = Store()
        for n in NODES:
            store.on_node(n, GPU)
        if not parked:
            store.upsert_validation("pool-a", generation=1, spec=spec, body={}, status=None)

        async def replay(ingest: ReportIngest) -> None:
            await until(lambda: sum(ingest.stats.beats.values()) == len(NODES), "the beats")

        ingest = asyncio.run(
            with_ingest(mosquitto_broker, store, replay, on_beat=store.ingest_beat)
        )
        if parked:
            assert ingest.stats.beats == {"parked": len(NODES)}
            store.upsert_validation("pool-a", generation=1, spec=spec, body={}, status=None)
        else:
            assert ingest.stats.beats == {"matched": len(NODES) - 1, "mismatched": 1}
        state = store.states["pool-a"]
        at = datetime.now(UTC)
        fresh = {n for n in NODES if vs.is_fresh(state, n, at)}
        assert fresh == set(NODES) - {"gpu-d"}, parked
