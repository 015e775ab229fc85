"""What the ingest keeps: parked reports fold at their own time (a node silent since before a
failover turns stale on time), parked tables are bounded and count what they drop, and a
deleted validation leaves nothing behind: no state, no metrics, no retained topics.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.model import Status
from netval.model.spec import NetworkValidationSpec
from netval.operator.ingest.decode import StateChange
from netval.operator.state import store as store_module
from netval.operator.state.aggregation import compute_status
from netval.operator.state.store import Store
from netval.operator.term_runtime import OperatorRuntime
from operator_env import GPU, NODES, NV, publish, report, report_msg, state_msg, validation
from test_broker_restart import retained_on
from test_operator import scrape

SPEC = NetworkValidationSpec.model_validate({"nodeSelector": GPU, "interval": "60s"})


def fresh_store() -> Store:
    store = Store(label_keys=GPU)
    for node in NODES:
        store.on_node(node, GPU)
    return store


def at(monkeypatch: pytest.MonkeyPatch, when: datetime) -> None:
    monkeypatch.setattr(store_module, "utcnow", lambda: when)


def test_parked_reports_count_from_their_own_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's failover case: reports parked while the validation was unknown were
    folded as received at the takeover, so a node silent for 170 s looked fresh for another
    180 s. Now a live one counts from its arrival, a retained one from its end time."""
    now = datetime.now(UTC)
    store = fresh_store()
    at(monkeypatch, now - timedelta(seconds=170))
    store.ingest_report(report("gpu-a"), False)  # live, 170 s ago
    at(monkeypatch, now - timedelta(seconds=5))
    old = report("gpu-b", started=now - timedelta(seconds=100))
    store.ingest_report(old, True)  # retained, replayed 5 s ago: ended 100 s ago (2 ms long)
    at(monkeypatch, now)
    store.ingest_report(report("gpu-c"), False)
    state = store.upsert_validation("pool-a", generation=1, spec=SPEC, body={}, status=None)
    assert state.nodes["gpu-a"].reported_at == now - timedelta(seconds=170)
    assert state.nodes["gpu-b"].reported_at == old.started_at + timedelta(milliseconds=2)
    assert state.nodes["gpu-c"].reported_at == now
    later = compute_status(state, now + timedelta(seconds=11), previous=None)
    assert later.nodes.reporting == 2  # gpu-a turned stale 180 s after its report, not later
    stale = compute_status(state, now + timedelta(seconds=81), previous=None)
    assert stale.nodes.reporting == 1


def test_silence_while_the_operator_could_not_hear_does_not_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker restart cuts every agent and the operator at once. The agents come back over
    their reconnect backoff, a few at a time, each batch below the breaker's cap: measured at
    10,000 nodes, 142-178 labels flipped healthy -> unknown -> healthy. After the operator's
    own connection returns, silence counts only from there plus the agents' backoff ceiling."""
    now = datetime.now(UTC)
    store = fresh_store()
    state = store.upsert_validation("pool-a", generation=1, spec=SPEC, body={}, status=None)
    at(monkeypatch, now)
    for node in ("gpu-a", "gpu-b"):
        store.ingest_report(report(node), False)
    window = state.stale_after  # 3 intervals: 180 s
    # the broker goes away 10 s later; the operator is back on it at +170 s
    back = now + timedelta(seconds=170)
    store.note_deaf(back, timedelta(seconds=30))
    # from +181 s both would have been stale (last heard at 0); gpu-a is back at +210 s
    mid = compute_status(state, now + timedelta(seconds=195), previous=None)
    assert mid.nodes.reporting == 2
    at(monkeypatch, now + timedelta(seconds=210))
    store.ingest_report(report("gpu-a"), False)
    mid = compute_status(state, now + timedelta(seconds=215), previous=None)
    assert mid.nodes.reporting == 2  # (the fixture's other nodes never reported)
    # gpu-b never returns: stale once the window has passed since the floor (+200 s)
    assert (
        compute_status(state, back + timedelta(seconds=30) + window, previous=None).nodes.reporting
        == 2
    )
    late = compute_status(state, back + timedelta(seconds=31) + window, previous=None)
    assert late.nodes.reporting == 1
    # an older reconnect never moves a newer one back
    store.note_deaf(now, timedelta(seconds=30))
    assert state.deafness.spells[0].floor == back + timedelta(seconds=30)


def test_parked_states_fold_at_their_own_time(monkeypatch: pytest.MonkeyPatch) -> None:
    now = datetime.now(UTC)
    store = fresh_store()
    at(monkeypatch, now - timedelta(seconds=30))
    store.on_state(StateChange("pool-a", "gpu-a", False))
    at(monkeypatch, now)
    state = store.upsert_validation("pool-a", generation=1, spec=SPEC, body={}, status=None)
    assert state.offline["gpu-a"] == now - timedelta(seconds=30)


def test_parked_tables_are_bounded_and_count_drops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "PENDING_LIMIT", 3)
    monkeypatch.setattr(store_module, "OFFLINE_PENDING_LIMIT", 2)
    store = fresh_store()
    for i in range(5):
        store.ingest_report(report("gpu-a", validation_name=f"ghost-{i}"), False)
        store.on_state(StateChange(f"ghost-{i}", "gpu-a", False))
    store.ingest_report(report("gpu-a", Status.FAIL, validation_name="ghost-0"), False)
    assert len(store.pending) == 3 and len(store.offline_pending) == 2
    assert store.dropped == {"pending": 2, "offline_pending": 3, "beats_pending": 0}
    # a key already parked is replaced by its newer message, never dropped
    assert store.pending[("ghost-0", "gpu-a")].report.status is Status.FAIL
    assert store.remove_validation("ghost-0") == {"gpu-a"}
    assert ("ghost-0", "gpu-a") not in store.pending


def test_parked_reports_have_a_byte_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The count alone would allow 100,000 reports of up to 1 MiB: the bytes are bounded
    too, a drop is counted, and the bytes come back when the parked reports go."""
    one = len(report("gpu-a", validation_name="ghost-0").model_dump_json())
    monkeypatch.setattr(store_module, "PENDING_BYTES", 3 * one + one // 2)
    store = fresh_store()
    for i in range(5):
        store.ingest_report(report("gpu-a", validation_name=f"ghost-{i}"), False)
    assert len(store.pending) == 3 and store.dropped["pending"] == 2
    assert store.pending_bytes == 3 * one
    # a newer report of a parked key replaces it within the budget
    store.ingest_report(report("gpu-a", Status.FAIL, validation_name="ghost-0"), False)
    assert store.pending[("ghost-0", "gpu-a")].report.status is Status.FAIL
    store.remove_validation("ghost-0")
    store.upsert_validation("ghost-1", generation=1, spec=SPEC, body={}, status=None)
    assert len(store.pending) == 1 and store.pending_bytes == one


def test_parked_messages_of_a_validation_that_never_comes_are_let_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = datetime.now(UTC)
    store = fresh_store()
    at(monkeypatch, now)
    store.ingest_report(report("gpu-a", validation_name="gone"), True)
    store.on_state(StateChange("gone", "gpu-b", False))
    store.ingest_report(report("gpu-a", validation_name="pool-a"), True)
    later = now + timedelta(seconds=store_module.UNKNOWN_GRACE_SECONDS)
    assert store.take_unknown(later) == {}  # the validations at start are not all loaded
    store.expected_validations = {"pool-a"}
    assert store.take_unknown(later) == {}  # pool-a may still come
    store.upsert_validation("pool-a", generation=1, spec=SPEC, body={}, status=None)
    assert store.take_unknown(later - timedelta(seconds=1)) == {}  # within the grace
    assert store.take_unknown(later) == {"gone": {"gpu-a", "gpu-b"}}
    assert not store.pending and not store.offline_pending and store.pending_bytes == 0


def test_retained_topics_of_a_validation_deleted_while_no_operator_ran_are_cleared(
    cluster: KubeCluster,
    operator: tuple[OperatorRuntime, InMemorySpanExporter],
    mosquitto_broker: MosquittoBroker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(store_module, "UNKNOWN_GRACE_SECONDS", 0.5)
    cluster.create(validation())
    publish(mosquitto_broker, [report_msg(report(n)) for n in NODES])
    gone = report("gpu-a", validation_name="gone")
    publish(mosquitto_broker, [report_msg(gone), ("netval/v1/gone/gpu-a/state", b"offline")])
    wait_for(
        lambda: not asyncio.run(retained_on(mosquitto_broker, "netval/v1/gone/#")),
        timeout=30,
        what="the retained topics of the unknown validation cleared",
    )
    kept = asyncio.run(retained_on(mosquitto_broker, "netval/v1/pool-a/+/report"))
    assert len(kept) == len(NODES)  # the known validation's are not touched


def test_delete_clears_state_metrics_and_retained_topics(
    cluster: KubeCluster,
    operator: tuple[OperatorRuntime, InMemorySpanExporter],
    mosquitto_broker: MosquittoBroker,
) -> None:
    runtime, _ = operator
    cluster.create(validation(checks={"peers": {"enabled": True}}))
    endpoint = json.dumps({"host": "10.0.0.1", "port": 7471}).encode()
    msgs = [report_msg(report(n)) for n in NODES]
    msgs += [state_msg(n, b"online") for n in NODES]
    msgs += [(f"netval/v1/pool-a/{n}/endpoint", endpoint) for n in NODES]
    publish(mosquitto_broker, msgs)
    wait_for(
        lambda: (
            (cluster.stored(NV, "networkvalidations", "pool-a") or {})
            .get("status", {})
            .get("nodes", {})
            .get("reporting")
            == 4
        ),
        timeout=30,
        what="4 nodes reporting",
    )
    kinds = {t.rsplit("/", 1)[1] for t in asyncio.run(retained_on(mosquitto_broker, "netval/#"))}
    assert kinds == {"report", "state", "endpoint", "assignment"}
    assert 'validation="pool-a"' in scrape(runtime)
    cluster.delete(NV, "networkvalidations", "pool-a")
    wait_for(
        lambda: not asyncio.run(retained_on(mosquitto_broker, "netval/#")),
        timeout=30,
        what="the broker retains nothing of pool-a",
    )
    assert "pool-a" not in runtime.store.states and not runtime.store.pending
    assert 'validation="pool-a"' not in scrape(runtime)
    # the agents' last words (a clean stop publishes a retained offline) are cleared too
    publish(mosquitto_broker, [state_msg("gpu-a", b"offline"), report_msg(report("gpu-b"))])
    wait_for(lambda: runtime.ingest.stats.cleared_late == 2, timeout=30, what="late messages")
    wait_for(
        lambda: not asyncio.run(retained_on(mosquitto_broker, "netval/#")),
        timeout=30,
        what="the late messages cleared",
    )
    assert not runtime.store.pending and not runtime.store.offline_pending
