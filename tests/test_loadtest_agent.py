"""The agent's side of NetworkLoadTest (`netval.agent.loadtest`) in one process on loopback:
plan intake (garbage and hostile-but-valid plans never crash and are counted; retained
redelivery, expired and foreign plans are ignored), real flows between two executors through
real peer responders (the per-flow cap holds, one result per plan, an abort stops the flows
within 2 s), and the sink's gate (an unplanned load flow is refused). The fabric-scale test
is tests/test_loadtest_netns.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aiomqtt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

import mosquitto
from netval.agent.loadtest.executor import LoadExecutor, fit
from netval.agent.loadtest.flows import send_flow
from netval.agent.loadtest.latency import subsample
from netval.agent.loadtest.plan_intake import PlanIntake, Refusal, Refused, Run, Stop
from netval.agent.metrics import AgentMetrics
from netval.agent.peers.endpoints import Endpoint
from netval.agent.peers.responder import PeerResponder
from netval.agent.peers.service import PeerService
from netval.agent.peers.wire import TCP_HELLO, load_token
from netval.agent.publish import ReportPublisher
from netval.agent.storage.slots import SlotReader
from netval.infra.mqtt_settings import MqttSettings
from netval.model.loadplan import (
    MAX_LATENCY_SAMPLES,
    MAX_RESULT_BYTES,
    FlowTask,
    LatencyResult,
    LatencyTask,
    LoadAbort,
    LoadPlan,
    LoadResult,
    PeerAddress,
    StorageTask,
    decode_result,
    encode,
)
from netval.model.spec import NetworkValidationSpec

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SPEC = NetworkValidationSpec.model_validate({"checks": {"peers": {"enabled": True}}})
ADDRESS = {"a": "127.0.0.2", "b": "127.0.0.3"}
STRANGER = "127.0.0.9"


def plan_for(
    node: str,
    peer: str,
    *,
    run: str = "run-1",
    stage: int = 0,
    lead: float = 0.5,
    warmup: float = 0.5,
    seconds: float = 2.0,
    cap: float = 0.0,
    now: datetime | None = None,
) -> LoadPlan:
    now = now or datetime.now(UTC)
    start = now + timedelta(seconds=lead)
    return LoadPlan(
        run=run,
        stage=stage,
        validation="pool",
        node=node,
        issued_at=now,
        deadline=start + timedelta(seconds=warmup + seconds + 2),
        max_rate_mbps=cap,
        tasks=[
            FlowTask(window="r0:cross", peer=peer, start=start, warmup_seconds=warmup,
                     seconds=seconds),
            LatencyTask(window="r0:cross", peer=peer, start=start + timedelta(seconds=warmup),
                        seconds=seconds, interval_ms=50, loaded=True),
        ],
    )  # fmt: skip


# -- intake --------------------------------------------------------------------------------


def test_intake_runs_a_plan_once_and_ignores_redelivery_expiry_and_foreign_plans() -> None:
    intake = PlanIntake("pool", "a")
    now = datetime.now(UTC)
    plan = plan_for("a", "b", now=now)
    assert isinstance(intake.decide(encode(plan), now), Run)
    repeated = intake.decide(encode(plan), now)  # the retained plan after a reconnect
    assert isinstance(repeated, Refused) and repeated.reason is Refusal.REPEATED
    later = plan_for("a", "b", stage=1, now=now - timedelta(seconds=60))
    expired = intake.decide(encode(later), now)
    assert isinstance(expired, Refused) and expired.reason is Refusal.EXPIRED
    foreign = intake.decide(encode(plan_for("b", "a", stage=2, now=now)), now)
    assert isinstance(foreign, Refused) and foreign.reason is Refusal.NOT_MINE
    assert intake.decide(encode(LoadAbort(run="run-1", reason="deleted")), now) == Stop(
        "run-1", "deleted"
    )
    assert intake.decide(b"", now) == Stop(None, "the retained plan was cleared")
    assert dict(intake.refused) == {
        Refusal.REPEATED: 1,
        Refusal.EXPIRED: 1,
        Refusal.NOT_MINE: 1,
    }


@FUZZ
@given(st.binary(max_size=400))
def test_garbage_plans_never_crash_and_are_counted(payload: bytes) -> None:
    intake = PlanIntake("pool", "a")
    decision = intake.decide(payload, datetime.now(UTC))
    if isinstance(decision, Refused):
        assert intake.refused[decision.reason] == 1
    else:
        assert isinstance(decision, Stop)  # only the empty payload stops without decoding


HOSTILE = st.one_of(
    st.sampled_from([float("nan"), float("inf"), 1e308, 10**400, -1, 0, "", "x" * 3000,
                     "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", None, True, [], {}]),
    st.floats(), st.integers(), st.text(max_size=30),
)  # fmt: skip


def _paths(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in _paths(v, (*path, k))]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in _paths(v, (*path, i))] or [path]
    return [path]


@FUZZ
@given(st.data())
def test_hostile_but_schema_shaped_plans_never_crash(data: st.DataObject) -> None:
    now = datetime.now(UTC)
    doc = json.loads(encode(plan_for("a", "b", now=now)))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_paths(doc)))
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = data.draw(HOSTILE)
    try:
        payload = json.dumps(doc).encode()
    except ValueError:
        payload = repr(doc).encode()
    intake = PlanIntake("pool", "a")
    decision = intake.decide(payload, now)
    if isinstance(decision, Run):
        plan = decision.plan
        assert plan.node == "a" and plan.validation == "pool" and plan.deadline > now
        assert (plan.deadline - plan.issued_at).total_seconds() <= 600
    elif isinstance(decision, Refused):
        assert sum(intake.refused.values()) == 1


def test_results_are_thinned_to_fit_and_samples_subsampled_evenly() -> None:
    assert subsample(list(range(1000)))[:3] == [0, 4, 8]
    assert len(subsample([float(i) for i in range(1000)])) == MAX_LATENCY_SAMPLES
    latency = [
        LatencyResult(window=f"w{i}", peer="b", loaded=True, sent=256, received=256,
                      samples_ms=[1.23456789 + i] * MAX_LATENCY_SAMPLES)
        for i in range(512)
    ]  # fmt: skip
    big = LoadResult(run="run-1", stage=0, validation="pool", node="a",
                     sent_at=datetime.now(UTC), latency=latency)  # fmt: skip
    small = fit(big, budget=500_000)
    assert len(encode(small)) <= 500_000
    assert decode_result(encode(small)).latency[0].sent == 256
    assert 0 < len(small.latency[0].samples_ms) < MAX_LATENCY_SAMPLES
    assert len(encode(big)) > MAX_RESULT_BYTES  # by default: the model's (the broker's) limit
    assert len(encode(fitted := fit(big))) <= MAX_RESULT_BYTES
    assert decode_result(encode(fitted)).latency[511].sent == 256


# -- two executors on loopback -------------------------------------------------------------


@dataclass
class Node:
    name: str
    executor: LoadExecutor
    responder: PeerResponder
    results: list[LoadResult]


@asynccontextmanager
async def pair(*, announced: bool = True) -> AsyncIterator[dict[str, Node]]:
    """`announced=False`: the agents know no peer endpoint (not in their epoch's peer set):
    only a plan's own `peers` say where to send."""
    responders = {n: PeerResponder(a, 0) for n, a in ADDRESS.items()}
    for r in responders.values():
        await r.start()
    nodes: dict[str, Node] = {}
    try:
        for name, responder in responders.items():
            peers = {
                n: Endpoint(ADDRESS[n], r.udp_port, "d") for n, r in responders.items() if n != name
            }
            executor = LoadExecutor(
                validation="pool",
                node=name,
                endpoints=(lambda peers=peers: peers) if announced else dict,  # type: ignore[misc]
                source=lambda name=name: ADDRESS[name],  # type: ignore[misc]
                spec=lambda: SPEC,
            )
            results: list[LoadResult] = []
            executor.publish = lambda p, results=results: results.append(decode_result(p))  # type: ignore[misc]
            responder.load_gate = executor.admit_flow
            nodes[name] = Node(name, executor, responder, results)
        yield nodes
    finally:
        for node in nodes.values():
            await node.executor.close()
        for r in responders.values():
            await r.close()


async def until(what: str, done: Any, within: float) -> None:
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_planned_flows_hold_the_cap_and_give_one_result_per_plan() -> None:
    cap = 80.0
    async with pair() as nodes:
        now = datetime.now(UTC)
        for a, b in (("a", "b"), ("b", "a")):
            nodes[a].executor.handle(encode(plan_for(a, b, cap=cap, seconds=2.0, now=now)))
        await until("both results", lambda: all(n.results for n in nodes.values()), 10)
        for node in nodes.values():
            [result] = node.results
            [flow] = result.flows
            assert flow.error is None, flow
            seconds = (flow.end - flow.start).total_seconds()
            mbps = flow.bytes * 8 / seconds / 1e6
            print(f"\n{node.name}: {mbps:.1f} Mbit/s over {seconds:.2f} s (cap {cap:g})")
            assert 1.8 <= seconds <= 2.5
            assert 0.7 * cap <= mbps <= 1.05 * cap
            [echo] = result.latency
            assert echo.loaded and echo.sent >= 20 and echo.received >= 0.9 * echo.sent
            assert node.responder.stats.tcp_load_streams == 1
            assert not node.executor.busy()
        # the retained plan again (a reconnect): not run twice
        nodes["a"].executor.handle(encode(plan_for("a", "b", cap=cap, now=now)))
        assert not nodes["a"].executor.busy()
        assert nodes["a"].executor.stats.plans_run == 1


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_a_plan_names_where_its_peers_listen_when_the_agent_has_not_heard_of_them() -> None:
    async with pair(announced=False) as nodes:
        now = datetime.now(UTC)
        plans = {}
        for a, b in (("a", "b"), ("b", "a")):
            where = PeerAddress.model_validate(
                {"address": ADDRESS[b], "port": nodes[b].responder.udp_port}
            )
            plans[a] = plan_for(a, b, seconds=1.0, now=now).model_copy(update={"peers": {b: where}})
        # without the plan's peers: nowhere to send, said per flow
        lost = plan_for("a", "b", run="run-0", seconds=1.0, now=now)
        nodes["a"].executor.handle(encode(lost))
        for a, p in plans.items():
            nodes[a].executor.handle(encode(p))
        await until("the results", lambda: len(nodes["a"].results) == 2 and nodes["b"].results, 10)
        by_run = {r.run: r for r in nodes["a"].results}
        assert by_run["run-0"].flows[0].error == "b has announced no endpoint"
        for result in (by_run["run-1"], nodes["b"].results[0]):
            [flow] = result.flows
            assert flow.error is None and flow.bytes > 0, flow
        # the sink admitted them from the plan's peers only
        assert nodes["a"].responder.stats.tcp_load_streams == 1


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_an_abort_stops_the_flows_within_two_seconds() -> None:
    async with pair() as nodes:
        now = datetime.now(UTC)
        for a, b in (("a", "b"), ("b", "a")):
            nodes[a].executor.handle(encode(plan_for(a, b, seconds=60, cap=200, now=now)))
        received = nodes["b"].responder.stats
        await until("load flowing", lambda: received.tcp_load_streams == 1, 5)
        await asyncio.sleep(1.0)  # into the measured part
        nodes["a"].executor.handle(encode(LoadAbort(run="run-1", reason="test deleted")))
        nodes["b"].executor.handle(b"")  # a cleared retained plan stops too
        stopped = time.monotonic()
        await until("the executors to stop", lambda: not any(
            n.executor.busy() for n in nodes.values()), 2.0)  # fmt: skip
        print(f"\nstopped {time.monotonic() - stopped:.2f} s after the abort")
        for node in nodes.values():
            [result] = node.results
            assert result.flows[0].error == "stopped early"
            assert node.executor.stats.plans_aborted == 1


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_the_sink_refuses_load_flows_nobody_planned() -> None:
    async with pair() as nodes:
        b = nodes["b"]
        now = datetime.now(UTC)
        # b runs nothing: a well-formed load flow from its known peer is refused
        halt = threading.Event()
        start = time.time()
        token = load_token("run-1", "r0:cross")
        common = {"token": token, "start": start, "measure_start": start + 0.2,
                  "end": start + 1.0, "cap_mbps": 0.0, "halt": halt}  # fmt: skip
        outcome = await asyncio.to_thread(
            send_flow, ADDRESS["b"], b.responder.tcp_port, source=ADDRESS["a"], **common
        )
        assert outcome.error is not None and outcome.bytes == 0
        assert b.responder.stats.tcp_load_refused == 1
        # b runs the window now: a stranger (not an announced peer) and a wrong token are
        # still refused, while the planned sender gets in
        b.executor.handle(encode(plan_for("b", "a", lead=0.0, seconds=3, cap=50, now=now)))
        for source, tok in ((STRANGER, token), (ADDRESS["a"], token ^ 1)):
            start = time.time()
            wrong = {**common, "token": tok, "start": start, "measure_start": start + 0.2,
                     "end": start + 1.0}  # fmt: skip
            outcome = await asyncio.to_thread(
                send_flow, ADDRESS["b"], b.responder.tcp_port, source=source, **wrong
            )
            assert outcome.error is not None and outcome.bytes == 0, (source, outcome)
        assert b.responder.stats.tcp_load_refused == 3
        assert b.responder.stats.tcp_load_streams == 0


# -- storage reads -------------------------------------------------------------------------

OBJECT = b"x" * (256 * 1024)


async def _object_server() -> asyncio.Server:
    """HTTP/1.1: every GET answers the same 256 KiB object, then closes."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while await reader.readline() not in (b"\r\n", b""):
                pass
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(OBJECT)}\r\n\r\n".encode()
            writer.write(head + OBJECT)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_storage_reads_are_bound_by_time_and_a_missing_endpoint_is_an_error() -> None:
    server = await _object_server()
    port = server.sockets[0].getsockname()[1]
    spec = NetworkValidationSpec.model_validate(
        {"checks": {"storage": {"endpoints": [
            {"name": "datasets", "protocol": "http", "host": "127.0.0.1", "port": port,
             "path": "/object"}]}}}
    )  # fmt: skip
    executor = LoadExecutor(validation="pool", node="a", endpoints=dict, source=lambda: None,
                            spec=lambda: spec)  # fmt: skip
    results: list[LoadResult] = []
    executor.publish = lambda p: results.append(decode_result(p))
    now = datetime.now(UTC)
    start = now + timedelta(seconds=0.3)
    plan = LoadPlan(
        run="run-s", stage=3, validation="pool", node="a", issued_at=now,
        deadline=start + timedelta(seconds=4),
        tasks=[
            StorageTask(window="s3:datasets:all", endpoint=name, start=start,
                        warmup_seconds=0.5, seconds=1.5)
            for name in ("datasets", "nope")
        ],
    )  # fmt: skip
    try:
        executor.handle(encode(plan))
        await until("the storage result", lambda: results, 10)
    finally:
        await executor.close()
        server.close()
    read, missing = results[0].storage
    assert read.error is None, read
    seconds = (read.end - read.start).total_seconds()
    assert 1.3 <= seconds <= 1.6, seconds
    assert read.bytes > 10 * len(OBJECT)  # the object read again and again, not once
    assert missing.error == "no storage endpoint named 'nope' in the validation"
    assert missing.bytes == 0


# -- while a plan runs: pause, metrics; a stalled sink ---------------------------------------


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_continuous_samples_pause_while_a_plan_runs_and_metrics_count_it() -> None:
    endpoint = {"name": "d", "protocol": "http", "host": "127.0.0.1", "port": 9, "path": "/o",
                "minThroughputMBps": 1}  # fmt: skip
    spec = NetworkValidationSpec.model_validate(
        {"checks": {"peers": {"enabled": True}, "storage": {"endpoints": [endpoint]}}}
    )
    async with pair() as nodes:
        a = nodes["a"].executor
        slots = SlotReader("pool", "a")
        slots.handle_assignment(b'{"storage": {"position": 0, "of": 1}}')
        slots.paused = a.busy
        peers = PeerService(validation="pool", node="a", spec=spec)
        peers.paused = a.busy
        slot = next(s for s in range(100) if slots.due(s, spec.checks.storage, 60))
        a.handle(encode(plan_for("a", "b", lead=0.2, seconds=1.0, now=datetime.now(UTC))))
        assert a.busy()
        assert await slots.read_slot(slot, spec.checks.storage, 60) == []  # skipped
        assert await peers.sample_throughput(0) is None
        metrics = AgentMetrics(interval_seconds=60)
        metrics.attach_loadtest(a)
        a.handle(b"garbage")
        text = generate_latest(metrics.registry).decode()
        assert "netval_agent_loadtest_running 1.0" in text
        assert 'netval_agent_loadtest_plans_refused_total{reason="invalid"} 1.0' in text
        await until("the plan to end", lambda: not a.busy(), 10)
        text = generate_latest(metrics.registry).decode()
        assert "netval_agent_loadtest_plans_run_total 1.0" in text
        assert "netval_agent_loadtest_running 0.0" in text
        sent = [line for line in text.splitlines() if line.startswith(
            "netval_agent_loadtest_bytes_sent_total")]  # fmt: skip
        assert sent and float(sent[0].split()[1]) > 0


def test_a_flow_to_a_sink_that_stops_reading_still_ends_on_time() -> None:
    """The sender never waits on the network past its end: a stalled receiver (full window)
    cannot keep an agent's flow, or its thread, alive."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        stalled: list[socket.socket] = []

        def accept() -> None:
            conn, _ = server.accept()
            conn.sendall(TCP_HELLO)  # then never reads
            stalled.append(conn)

        threading.Thread(target=accept, daemon=True).start()
        start = time.time()
        outcome = send_flow(
            "127.0.0.1", server.getsockname()[1], source=None, token=1, start=start,
            measure_start=start + 0.3, end=start + 1.5, cap_mbps=0.0, halt=threading.Event(),
        )  # fmt: skip
        overrun = time.time() - (start + 1.5)
        for conn in stalled:
            conn.close()
    assert overrun < 0.5, overrun
    assert outcome.error is None and outcome.end - outcome.start >= 1.0


# -- the result's way out: QoS 1, not retained, queued across a broker outage ---------------


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_results_go_out_once_not_retained_even_when_the_broker_was_down(
    mosquitto_broker: mosquitto.MosquittoBroker,
) -> None:
    broker = mosquitto_broker
    settings = MqttSettings(host=broker.host, port=broker.port, username=broker.username,
                            password=broker.password)  # fmt: skip
    publisher = ReportPublisher(settings, "pool", "a", backoff_base=0.05, backoff_cap=0.3,
                                timeout=3.0, keepalive=5)  # fmt: skip
    topic_name = "netval/v1/pool/a/loadresult"
    broker.stop()
    await publisher.start()
    try:
        publisher.publish_message("loadresult", b"first")  # queued: no broker
        publisher.publish_message("loadresult", b"second")
        broker.restart()
        async with aiomqtt.Client(
            broker.host, broker.port, username=broker.username, password=broker.password
        ) as client:
            await client.subscribe(topic_name, qos=1)
            got: list[tuple[bytes, bool]] = []

            async def read() -> None:
                async for m in client.messages:
                    assert isinstance(m.payload, bytes)
                    got.append((m.payload, m.retain))
                    if len(got) == 2:
                        return

            await asyncio.wait_for(read(), 10)
        assert got == [(b"first", False), (b"second", False)]
        with pytest.raises(ValueError, match="reserved"):
            publisher.publish_message("report", b"x")
    finally:
        await publisher.stop()
    # nothing retained: a late subscriber sees nothing
    broker_client = aiomqtt.Client(
        broker.host, broker.port, username=broker.username, password=broker.password
    )
    async with broker_client as late:
        await late.subscribe(topic_name, qos=1)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(aiter(late.messages)), 0.5)


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_an_agent_stops_at_the_plan_deadline_by_itself() -> None:
    """The safety net: whatever still runs at the deadline stops, operator or not. A valid
    plan ends its tasks by the deadline, so this one is built past the model's check."""
    async with pair() as nodes:
        now = datetime.now(UTC)
        valid = plan_for("a", "b", lead=0.2, seconds=30, now=now)
        plan = LoadPlan.model_construct(
            **{**dict(valid), "deadline": now + timedelta(seconds=2.0)}  # tasks end at 30 s
        )
        nodes["b"].executor.handle(encode(plan_for("b", "a", lead=0.2, seconds=30, now=now)))
        nodes["a"].executor._start(plan)
        await until("a's plan to stop at its deadline", lambda: nodes["a"].results, 4.0)
        stopped = datetime.now(UTC)
        assert (stopped - plan.deadline).total_seconds() < 1.0
        [result] = nodes["a"].results
        assert result.flows[0].error == "stopped early"
        assert nodes["a"].executor.stats.plans_aborted == 0  # not an abort: the deadline
