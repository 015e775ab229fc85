"""The agent's side of NetworkLoadTest (`netval.agent.loadtest`) in one process on loopback:
plan intake (garbage and hostile-but-valid plans never crash and are counted; retained
redelivery, expired, foreign and older-term plans are ignored), real iperf3 flows between
two executors (the per-flow cap holds, the receiver's server and its CPU demand, one result
per plan with the engine's version, an abort kills the engines within 2 s), a missing
engine or RDMA device is EngineUnavailable end to end, a stranger taking a server is said,
and storage readers read their own object or byte range. The fabric-scale tests are
tests/test_loadtest_netns.py and its neighbours."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable
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
from netval.agent.loadtest.executor import LoadExecutor, coarsen, fit
from netval.agent.loadtest.plan_intake import (
    TERM_MEMORY_SECONDS,
    PlanIntake,
    Refusal,
    Refused,
    Run,
    Stop,
)
from netval.agent.metrics import AgentMetrics
from netval.agent.peers.responder import PeerResponder
from netval.agent.peers.service import PeerService
from netval.agent.publish import ReportPublisher
from netval.agent.storage.slots import SlotReader
from netval.infra.mqtt_settings import MqttSettings
from netval.model.loadplan import (
    MAX_RESULT_BYTES,
    SERVE_LEAD_SECONDS,
    SERVE_TAIL_SECONDS,
    Engine,
    FlowTask,
    LatencyEngine,
    LatencyResult,
    LatencyTask,
    LoadAbort,
    LoadPlan,
    LoadResult,
    PeerAddress,
    ServeTask,
    StorageTask,
    Task,
    decode_result,
    encode,
    latency_bucket,
)
from netval.model.snapshot import Gid, Netdev, RdmaDevice, RdmaPort, Sample
from netval.model.spec import NetworkValidationSpec

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SPEC = NetworkValidationSpec.model_validate({"checks": {"peers": {"enabled": True}}})
ADDRESS = {"a": "127.0.0.2", "b": "127.0.0.3"}
RAIL = {"a": "rail-a", "b": "rail-b"}  # each node's one rail (resolved to its address)
STRANGER = "127.0.0.9"
PORT = 7590


def _s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def plan_for(
    node: str,
    peer: str,
    *,
    run: str = "run-1",
    stage: int = 0,
    term: int = 5,
    lead: float = 0.8,
    warmup: float = 1.0,
    seconds: float = 2.0,
    cap: float = 0.0,
    streams: int = 2,
    engine: Engine = Engine.IPERF3,
    responders: dict[str, PeerResponder] | None = None,
    now: datetime | None = None,
) -> LoadPlan:
    """`node` sends to `peer` and serves `peer`'s flow to it (as the operator plans both
    directions of a pair), and echoes `peer` under load."""
    now = now or datetime.now(UTC)
    start = now + _s(lead)
    tasks: list[Task] = [
        FlowTask(window="r0:cross", peer=peer, engine=engine, port=PORT, streams=streams,
                 start=start, warmup_seconds=warmup, seconds=seconds),
        ServeTask(window="r0:cross", peer=peer, engine=engine, port=PORT, streams=streams,
                  start=start - _s(SERVE_LEAD_SECONDS),
                  warmup_seconds=SERVE_LEAD_SECONDS + warmup,
                  seconds=SERVE_LEAD_SECONDS + warmup + seconds + SERVE_TAIL_SECONDS,
                  client_seconds=seconds),
        LatencyTask(window="r0:cross", peer=peer, start=start + _s(warmup), seconds=seconds,
                    interval_ms=50, loaded=True),
    ]  # fmt: skip
    peers = {}
    if responders is not None:
        peers[peer] = PeerAddress.model_validate(
            {"address": ADDRESS[peer], "port": responders[peer].udp_port,
             "rails": [ADDRESS[peer]]}
        )  # fmt: skip
    return LoadPlan(
        term=term, run=run, stage=stage, validation="pool", node=node, issued_at=now - _s(1),
        deadline=start + _s(warmup + seconds + SERVE_TAIL_SECONDS + 1), max_rate_mbps=cap,
        interfaces=[RAIL[node]], tasks=tasks, peers=peers,
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


def test_a_plan_of_an_older_leader_is_dropped_after_the_new_leader_spoke() -> None:
    """A paused old leader's plan landing after the new leader's abort is dropped; an old
    term is forgotten only after a plan's whole life without a word of the newer one."""
    intake = PlanIntake("pool", "a")
    now = datetime.now(UTC)
    assert isinstance(intake.decide(encode(plan_for("a", "b", run="run-new", term=9, now=now)),
                                    now), Run)  # fmt: skip
    abort = LoadAbort(term=10, run="run-new", reason="the new leader aborts")
    assert isinstance(intake.decide(encode(abort), now), Stop) and intake.term == 10
    stale = plan_for("a", "b", run="run-old", term=7, now=now)
    dropped = intake.decide(encode(stale), now)
    assert isinstance(dropped, Refused) and dropped.reason is Refusal.OLD_TERM
    assert "term 7 (seen 10)" in dropped.detail
    # an abort of an older term still stops (stopping is always safe)
    assert isinstance(intake.decide(encode(LoadAbort(term=1, run="x")), now), Stop)
    assert intake.term == 10
    # a newer or equal term runs
    same = plan_for("a", "b", run="run-next", term=10, now=now)
    assert isinstance(intake.decide(encode(same), now), Run)
    # long silence of term 10: a lower term is taken again (a recreated Lease, a clock set
    # back must not lock the agent out for longer than a plan can live)
    later = now + timedelta(seconds=TERM_MEMORY_SECONDS + 1)
    fresh = plan_for("a", "b", run="run-after", term=3, now=later)
    assert isinstance(intake.decide(encode(fresh), later), Run) and intake.term == 3


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
                     "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", None, True, [], {},
                     "perftest", "lat", 65536, 2**63]),
    st.floats(), st.integers(), st.text(max_size=30),
)  # fmt: skip


def _paths(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in _paths(v, (*path, k))]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in _paths(v, (*path, i))] or [path]
    return [path]


def _rich_plan(now: datetime) -> dict[str, Any]:
    """A plan with every task kind and field: flows and servers of both engines, a
    perftest latency probe, a storage read with a range, peers with rails."""
    base = plan_for("a", "b", now=now)
    start = base.tasks[0].start
    extra: list[Task] = [
        FlowTask(window="r0:cross", peer="b", rail=1, engine=Engine.PERFTEST, port=PORT + 1,
                 streams=4, dscp=26, start=start, warmup_seconds=1, seconds=2),
        ServeTask(window="r0:cross", peer="b", rail=1, engine=Engine.PERFTEST, test="lat",
                  port=PORT + 16, start=start, warmup_seconds=0.5, seconds=4, client_seconds=2),
        LatencyTask(window="r0:cross", peer="b", rail=1, engine=LatencyEngine.PERFTEST,
                    port=PORT + 16, start=start, seconds=2, loaded=True),
        StorageTask(window="s1:d:all", endpoint="d", start=start, warmup_seconds=0.5,
                    seconds=2, part=1, parts=3),
    ]  # fmt: skip
    peers = {"b": PeerAddress.model_validate(
        {"address": "10.0.0.2", "port": 7471, "rails": ["10.1.0.2", None, "fd00::2"]})}  # fmt: skip
    plan = base.model_copy(update={"tasks": [*base.tasks, *extra], "peers": peers})
    doc: dict[str, Any] = json.loads(encode(plan))
    return doc


@FUZZ
@given(st.data())
def test_hostile_but_schema_shaped_plans_never_crash(data: st.DataObject) -> None:
    now = datetime.now(UTC)
    doc = _rich_plan(now)
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
        assert all(plan.issued_at <= t.start and t.end <= plan.deadline for t in plan.tasks)
    elif isinstance(decision, Refused):
        assert sum(intake.refused.values()) == 1


def test_results_are_coarsened_to_fit_never_losing_the_count() -> None:
    histogram = [(latency_bucket(0.01 * 1.011**i), 3) for i in range(2400)]
    assert sum(c for _, c in coarsen(histogram, 3)) == 3 * 2400
    assert len(coarsen(histogram, 3)) <= len(histogram) // 8 + 2
    latency = [
        LatencyResult(window=f"w{i}", peer="b", loaded=True, sent=8000, received=7200,
                      histogram=histogram)
        for i in range(100)
    ]  # fmt: skip
    big = LoadResult(run="run-1", stage=0, validation="pool", node="a",
                     sent_at=datetime.now(UTC), latency=latency)  # fmt: skip
    assert len(encode(big)) > MAX_RESULT_BYTES  # by default: the model's (the broker's) limit
    small = fit(big)
    assert len(encode(small)) <= MAX_RESULT_BYTES
    decoded = decode_result(encode(small))
    assert decoded.latency[99].received == 7200
    assert sum(c for _, c in decoded.latency[0].histogram) == 7200  # every round trip kept


# -- two executors on loopback, real iperf3 -------------------------------------------------


@dataclass
class Node:
    name: str
    executor: LoadExecutor
    responder: PeerResponder
    results: list[LoadResult]


def _resolver(name: str) -> Callable[[str], str | None]:
    return lambda ifname: ADDRESS[name] if ifname == RAIL[name] else None


@asynccontextmanager
async def pair(
    *, which: Callable[[str], str | None] | None = None, sample: Sample | None = None
) -> AsyncIterator[dict[str, Node]]:
    responders = {n: PeerResponder(a, 0) for n, a in ADDRESS.items()}
    for r in responders.values():
        await r.start()
    nodes: dict[str, Node] = {}
    try:
        for name, responder in responders.items():
            executor = LoadExecutor(
                validation="pool", node=name, endpoints=dict,
                source=lambda name=name: ADDRESS[name],  # type: ignore[misc]
                spec=lambda: SPEC, sample=lambda: sample, resolve=_resolver(name), which=which,
            )  # fmt: skip
            results: list[LoadResult] = []
            executor.publish = lambda p, results=results: results.append(decode_result(p))  # type: ignore[misc]
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


def _engines_running() -> list[str]:
    """iperf3 processes this test started (children of this process)."""
    out = subprocess.run(["ps", "-o", "pid=,ppid=,comm=", "-e"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    me = str(os.getpid())
    return [line for line in out.splitlines() if line.split()[1:2] == [me] and "iperf3" in line]


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_iperf3_flows_hold_the_cap_and_give_one_result_per_plan_with_evidence() -> None:
    cap = 80.0
    async with pair() as nodes:
        responders = {n.name: n.responder for n in nodes.values()}
        now = datetime.now(UTC)
        for a, b in (("a", "b"), ("b", "a")):
            plan = plan_for(a, b, cap=cap, seconds=3.0, responders=responders, now=now)
            nodes[a].executor.handle(encode(plan))
        await until("both results", lambda: all(n.results for n in nodes.values()), 20)
        for node in nodes.values():
            [result] = node.results
            assert result.engines == {"iperf3": "3.12"} and result.unavailable is None
            [flow] = result.flows
            assert flow.error is None, flow
            seconds = (flow.end - flow.start).total_seconds()
            mbps = flow.bytes * 8 / seconds / 1e6
            print(f"\n{node.name}: {mbps:.1f} Mbit/s over {seconds:.2f} s (cap {cap:g}), "
                  f"cpu {flow.cpu_percent} % demand {flow.cpu_demand_percent} %")  # fmt: skip
            assert 2.8 <= seconds <= 3.5 and flow.streams == 2
            assert 0.7 * cap <= mbps <= 1.05 * cap
            assert flow.cpu_demand_percent is not None and flow.cpu_demand_percent < 50
            assert flow.retransmits is not None and flow.cpu_percent is not None
            [served] = result.serves
            assert served.error is None and served.cpu_demand_percent is not None
            [echo] = result.latency
            assert echo.loaded and echo.sent >= 40 and echo.received >= 0.9 * echo.sent
            assert sum(c for _, c in echo.histogram) == echo.received  # every echo
            assert not node.executor.busy()
            assert node.executor.stats.engine_runs == 2
        # the retained plan again (a reconnect): not run twice
        nodes["a"].executor.handle(encode(plan_for("a", "b", cap=cap, now=now)))
        assert not nodes["a"].executor.busy()
        assert nodes["a"].executor.stats.plans_run == 1
    assert not _engines_running()


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_an_abort_kills_the_engines_within_two_seconds() -> None:
    async with pair() as nodes:
        responders = {n.name: n.responder for n in nodes.values()}
        now = datetime.now(UTC)
        for a, b in (("a", "b"), ("b", "a")):
            plan = plan_for(a, b, seconds=60, cap=200, responders=responders, now=now)
            nodes[a].executor.handle(encode(plan))
        await until("four engines", lambda: len(_engines_running()) == 4, 10)
        await asyncio.sleep(2.0)  # into the measured part
        nodes["a"].executor.handle(encode(LoadAbort(term=5, run="run-1", reason="deleted")))
        nodes["b"].executor.handle(b"")  # a cleared retained plan stops too
        stopped = time.monotonic()
        await until("the engines to be gone", lambda: not _engines_running(), 2.0)
        await until("the executors to stop", lambda: not any(
            n.executor.busy() for n in nodes.values()), 2.0)  # fmt: skip
        print(f"\nengines gone {time.monotonic() - stopped:.2f} s after the abort")
        for node in nodes.values():
            [result] = node.results
            assert result.flows[0].error == "stopped early"
            assert node.executor.stats.plans_aborted == 1
        # nothing listens any more on the servers' port
        with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
            probe.connect((ADDRESS["b"], PORT))


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_without_the_peer_s_rail_address_a_flow_says_so() -> None:
    async with pair() as nodes:
        nodes["a"].executor.handle(encode(plan_for("a", "b", seconds=1.0)))  # no peers
        await until("the result", lambda: nodes["a"].results, 15)
        [flow] = nodes["a"].results[0].flows
        assert flow.error == "b announced no address on rail 0" and flow.bytes == 0


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_missing_engine_is_engine_unavailable_end_to_end() -> None:
    async with pair(which=lambda _name: None) as nodes:
        responders = {n.name: n.responder for n in nodes.values()}
        nodes["a"].executor.handle(encode(plan_for("a", "b", seconds=1.0,
                                                   responders=responders)))  # fmt: skip
        await until("the result", lambda: nodes["a"].results, 15)
        [result] = nodes["a"].results
        assert result.unavailable == "iperf3 is not installed (Debian package iperf3)"
        assert result.flows[0].error == (
            "EngineUnavailable: iperf3 is not installed (Debian package iperf3)"
        )
        assert result.serves[0].error is not None
        assert result.serves[0].error.startswith("EngineUnavailable")
        assert nodes["a"].executor.stats.engines_unavailable == 1


def _rdma_sample(device: str, netdev: str) -> Sample:
    gid = Gid(index=3, gid="0000:0000:0000:0000:0000:ffff:7f00:0002", type="RoCE v2",
              ndev=netdev)  # fmt: skip
    port = RdmaPort(device=device, port=1, state="4: ACTIVE", rate="200 Gb/sec (4X HDR)",
                    link_layer="Ethernet", gids=(gid,), default_roce_tos=106)  # fmt: skip
    return Sample(
        netdevs={netdev: Netdev(name=netdev, speed_mbps=200_000)},
        rdma={device: RdmaDevice(name=device, ports={1: port})},
    )


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_perftest_without_an_rdma_device_or_port_is_engine_unavailable() -> None:
    """No RDMA kernel here: a perftest flow on a rail without an RDMA port, or on a port
    whose device this container cannot open, names what is missing, never falling back."""
    async with pair() as nodes:
        responders = {n.name: n.responder for n in nodes.values()}
        plan = plan_for("a", "b", seconds=1.0, engine=Engine.PERFTEST, responders=responders)
        nodes["a"].executor.handle(encode(plan))
        await until("the result", lambda: nodes["a"].results, 15)
        [result] = nodes["a"].results
        assert result.unavailable == "perftest: rail rail-a has no RoCE or InfiniBand port"
        assert not result.engines  # nothing ran
    async with pair(sample=_rdma_sample("mlx5_7", "rail-a")) as nodes:
        responders = {n.name: n.responder for n in nodes.values()}
        plan = plan_for("a", "b", seconds=1.0, engine=Engine.PERFTEST, responders=responders)
        nodes["a"].executor.handle(encode(plan))
        await until("the result", lambda: nodes["a"].results, 15)
        [result] = nodes["a"].results
        assert result.unavailable == "perftest: no RDMA device mlx5_7 (/sys/class/infiniband)"
        assert result.flows[0].error is not None
        assert result.flows[0].error.startswith("EngineUnavailable: perftest: no RDMA device")
        assert result.flows[0].port_mbps == 200_000.0  # the RDMA port's rate, not the netdev's


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_stranger_taking_a_server_is_said_and_the_server_ends_with_its_window() -> None:
    """The server runs only in its window, bound to the rail's address, for one client:
    a client from another address takes it, the receiver's result says so (and the planned
    sender's flow would fail: not measured, never a wrong figure)."""
    async with pair() as nodes:
        responders = {n.name: n.responder for n in nodes.values()}
        plan = plan_for("b", "a", seconds=2.0, responders=responders)
        only_serve = plan.model_copy(update={"tasks": [plan.tasks[1]]})
        serve = plan.tasks[1]
        nodes["b"].executor.handle(encode(only_serve))
        await asyncio.sleep(max(0.0, (serve.start - datetime.now(UTC)).total_seconds()) + 0.3)
        stranger = await asyncio.create_subprocess_exec(
            "iperf3", "-c", ADDRESS["b"], "-B", STRANGER, "-p", str(PORT), "-t", "1", "-J",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await stranger.wait()
        await until("b's result", lambda: nodes["b"].results, 20)
        [served] = nodes["b"].results[0].serves
        assert (
            served.error == f"a client other than the planned sender ({STRANGER}) took the server"
        )
    assert not _engines_running()


# -- storage reads -------------------------------------------------------------------------

OBJECT = bytes(range(256)) * 1024  # 256 KiB


@dataclass
class Store:
    server: asyncio.Server
    port: int
    requests: list[tuple[str, str | None]]  # (path, Range header)


async def _object_server(*, ranges: bool = True) -> Store:
    """HTTP/1.1: GETs of /object, /object-<node> (their own), with byte ranges when
    `ranges`; records what was asked."""
    requests: list[tuple[str, str | None]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            line = (await reader.readline()).decode()
            path = line.split()[1] if len(line.split()) > 1 else "/"
            wanted = None
            while (header := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = header.decode().partition(":")
                if name.lower() == "range":
                    wanted = value.strip()
            requests.append((path, wanted))
            if wanted and ranges:
                first, last = (int(v) for v in wanted.removeprefix("bytes=").split("-"))
                body = OBJECT[first : last + 1]
                head = (f"HTTP/1.1 206 Partial Content\r\nContent-Length: {len(body)}\r\n"
                        f"Content-Range: bytes {first}-{last}/{len(OBJECT)}\r\n\r\n")  # fmt: skip
            else:
                body = OBJECT
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n"
            writer.write(head.encode() + body)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return Store(server, server.sockets[0].getsockname()[1], requests)


def _storage_spec(port: int, path: str) -> NetworkValidationSpec:
    return NetworkValidationSpec.model_validate(
        {"checks": {"storage": {"endpoints": [
            {"name": "datasets", "protocol": "http", "host": "127.0.0.1", "port": port,
             "path": path}]}}}
    )  # fmt: skip


async def _read(spec: NetworkValidationSpec, node: str, tasks: list[StorageTask],
                now: datetime) -> LoadResult:  # fmt: skip
    executor = LoadExecutor(validation="pool", node=node, endpoints=dict, source=lambda: None,
                            spec=lambda: spec)  # fmt: skip
    results: list[LoadResult] = []
    executor.publish = lambda p: results.append(decode_result(p))
    plan = LoadPlan(term=1, run="run-s", stage=3, validation="pool", node=node, issued_at=now,
                    deadline=now + timedelta(seconds=5), tasks=tasks)  # fmt: skip
    try:
        executor.handle(encode(plan))
        await until("the storage result", lambda: results, 10)
    finally:
        await executor.close()
    return results[0]


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_storage_reads_are_bound_by_time_and_a_missing_endpoint_is_an_error() -> None:
    store = await _object_server()
    now = datetime.now(UTC)
    start = now + timedelta(seconds=0.3)
    tasks = [
        StorageTask(window="s3:datasets:all", endpoint=name, start=start, warmup_seconds=0.5,
                    seconds=1.5)
        for name in ("datasets", "nope")
    ]  # fmt: skip
    try:
        result = await _read(_storage_spec(store.port, "/object"), "a", tasks, now)
    finally:
        store.server.close()
    read, missing = result.storage
    assert read.error is None, read
    seconds = (read.end - read.start).total_seconds()
    assert 1.3 <= seconds <= 1.6, seconds
    assert read.bytes > 10 * len(OBJECT)  # the object read again and again, not once
    assert missing.error == "no storage endpoint named 'nope' in the validation"
    assert missing.bytes == 0


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_concurrent_readers_read_their_own_object_or_byte_range() -> None:
    store = await _object_server()
    now = datetime.now(UTC)
    start = now + timedelta(seconds=0.3)

    def task(part: int) -> StorageTask:
        return StorageTask(window="s3:datasets:all", endpoint="datasets", start=start,
                           warmup_seconds=0.2, seconds=1.0, part=part, parts=3)  # fmt: skip

    try:
        ranged = await asyncio.gather(*(
            _read(_storage_spec(store.port, "/object"), f"n{i}", [task(i)], now)
            for i in range(3)
        ))  # fmt: skip
        now = datetime.now(UTC)
        start = now + timedelta(seconds=0.3)
        own = await _read(_storage_spec(store.port, "/data/{node}.bin"), "n7", [task(0)], now)
    finally:
        store.server.close()
    spans = sorted((r.storage[0].range_first, r.storage[0].range_last) for r in ranged)
    third = len(OBJECT) // 3
    assert spans == [(0, third - 1), (third, 2 * third - 1), (2 * third, len(OBJECT) - 1)]
    assert all(r.storage[0].error is None and r.storage[0].bytes > 0 for r in ranged)
    assert own.storage[0].own_object and own.storage[0].range_first is None
    asked = {path for path, _ in store.requests}
    assert "/data/n7.bin" in asked and not any("{node}" in p for p in asked)
    # every ranged GET of a reader stayed within its share
    assert {r for _, r in store.requests if r and r != "bytes=0-0"} == {
        f"bytes={a}-{b}" for a, b in spans
    }


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_a_store_that_ignores_ranges_fails_the_read_rather_than_share_one_object() -> None:
    store = await _object_server(ranges=False)
    now = datetime.now(UTC)
    task = StorageTask(window="s3:datasets:all", endpoint="datasets", start=now + _s(0.3),
                       warmup_seconds=0.2, seconds=1.0, part=1, parts=4)  # fmt: skip
    try:
        result = await _read(_storage_spec(store.port, "/object"), "a", [task], now)
    finally:
        store.server.close()
    [read] = result.storage
    assert read.error is not None and "ignores byte ranges" in read.error and read.bytes == 0


# -- while a plan runs: pause, metrics ------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.timeout(60)
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
        await until("the plan to end", lambda: not a.busy(), 15)
        text = generate_latest(metrics.registry).decode()
        assert "netval_agent_loadtest_plans_run_total 1.0" in text
        assert "netval_agent_loadtest_running 0.0" in text
        assert "netval_agent_loadtest_engine_runs_total 2.0" in text


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
        responders = {n.name: n.responder for n in nodes.values()}
        now = datetime.now(UTC)
        valid = plan_for("a", "b", lead=0.2, seconds=30, responders=responders, now=now)
        plan = LoadPlan.model_construct(
            **{**dict(valid), "deadline": now + timedelta(seconds=3.0)}  # tasks end at 30 s
        )
        nodes["b"].executor.handle(encode(plan_for("b", "a", lead=0.2, seconds=30,
                                                   responders=responders, now=now)))  # fmt: skip
        nodes["a"].executor._start(plan)
        await until("a's plan to stop at its deadline", lambda: nodes["a"].results, 5.0)
        stopped = datetime.now(UTC)
        assert (stopped - plan.deadline).total_seconds() < 1.0
        [result] = nodes["a"].results
        assert result.flows[0].error == "stopped early"
        assert nodes["a"].executor.stats.plans_aborted == 0  # not an abort: the deadline
