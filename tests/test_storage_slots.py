"""Storage throughput slots: the fleet budget of `maxConcurrentProbes` readers per endpoint.

- 100 agents' slot readers (compressed slots, clocks skewed within the tolerance) read one
  object from a real HTTP server that counts the transfers open at once: never more than N.
- The slot function (pure): the bound, fairness, determinism, and a hypothesis property over
  random fleets; the operator's assignments carry the positions; bad assignments are dropped.
- A probe cycle reports the last figure read in the slot (with its age), or says when the
  first slot comes; end to end, a `netval agent` process waits for its assignment on a real
  broker, then reads in its slot.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mosquitto
import netval
from netns import netval_script
from netval.agent.storage.probe import StorageProber
from netval.agent.storage.slots import SlotReader
from netval.model import Report
from netval.model.ids import CheckId, Status
from netval.model.spec import NetworkValidationSpec, StorageEndpoint
from netval.model.storage_slots import (
    SLOT_GUARD_SECONDS,
    SLOT_SECONDS,
    StorageAssignment,
    StorageSlot,
    fleet_positions,
    min_period_slots,
    next_read_slot,
    period_slots,
    reads_in,
)
from netval.operator.ingest.assignments import assignments
from netval.operator.state.store import Store
from test_agent import PREFIX, agent_config, stop_process, tail, write_agent_files

LOOPBACK = "127.0.0.1"
OBJECT_PATH = "/bucket/object"
CHUNK = 64 * 1024
CHUNKS = 20  # 1.25 MiB, sent over ~0.1 s: transfers of one slot overlap, of two never do
GPU = {"gpu": "true"}


class CountingHandler(BaseHTTPRequestHandler):
    """Serves the object slowly and counts the GETs whose body is being sent at once."""

    protocol_version = "HTTP/1.1"
    server: CountingServer

    def do_HEAD(self) -> None:
        self.send_response(200 if self.path == OBJECT_PATH else 404)
        self.send_header("Content-Length", str(CHUNK * CHUNKS))
        self.end_headers()

    def do_GET(self) -> None:
        if self.path != OBJECT_PATH:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(CHUNK * CHUNKS))
        self.end_headers()
        self.server.enter(self.headers.get("X-Node", ""))
        try:
            for _ in range(CHUNKS):
                self.wfile.write(bytes(CHUNK))
                time.sleep(0.005)
        except ConnectionError:
            pass
        finally:
            self.server.leave()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class CountingServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__((LOOPBACK, 0), CountingHandler)
        self.lock = threading.Lock()
        self.open = 0
        self.most = 0
        self.transfers = 0

    def enter(self, _node: str) -> None:
        with self.lock:
            self.open += 1
            self.transfers += 1
            self.most = max(self.most, self.open)

    def leave(self) -> None:
        with self.lock:
            self.open -= 1


@pytest.fixture
def counting_server() -> Iterator[CountingServer]:
    server = CountingServer()
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    )
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def objects(port: int, name: str = "objects") -> StorageEndpoint:
    fields = {"protocol": "http", "host": LOOPBACK, "port": port, "path": OBJECT_PATH}
    return StorageEndpoint.model_validate({"name": name, "minThroughputMBps": 1, **fields})


def spec_with(
    endpoints: list[StorageEndpoint], readers: int, every: int = 1
) -> NetworkValidationSpec:
    return NetworkValidationSpec.model_validate(
        {
            "interval": "5s",
            "checks": {
                "storage": {
                    "endpoints": [
                        e.model_dump(by_alias=True, exclude_none=True) for e in endpoints
                    ],
                    "throughputEveryCycles": every,
                    "maxConcurrentProbes": readers,
                }
            },
        }
    )


# -- 100 agents, one real server ------------------------------------------------------------


def run_fleet(
    server: CountingServer, fleet: list[str], positions: dict[str, StorageSlot], readers: int
) -> list[SlotReader]:
    """Every node's slot reader on the compressed clock until each has read once.

    The margin between one slot's cut-off and the next slot's first read is 2 x guard minus
    the pairwise skew (0.5 - 0.2 = 0.3 s): the readers, the server's threads and the rest of a
    loaded CI machine share one interpreter, and a 16 ms margin (0.4 s slots) was seen to
    count a late close as an overlap."""
    slot, guard = 1.0, 0.25
    spec = spec_with([objects(int(server.server_address[1]))], readers)
    rng = random.Random(7)

    async def scenario() -> list[SlotReader]:
        agents: list[SlotReader] = []
        for node in fleet:
            skew = rng.uniform(-0.4, 0.4) * guard  # pairwise skew well below 2 x guard
            agent = SlotReader(
                "pool-a", node, clock=lambda s=skew: time.time() + s,
                slot_seconds=slot, guard_seconds=guard, phase_timeout=2.0,
            )  # fmt: skip
            agent.handle_assignment(json.dumps({"storage": positions[node].model_dump()}).encode())
            agents.append(agent)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(a.run(lambda: spec, stop)) for a in agents]
        deadline = time.monotonic() + 60

        def waiting() -> bool:
            return any(a.reads == 0 for a in agents) and time.monotonic() < deadline

        while waiting():  # noqa: ASYNC110 - counters, polled with a deadline
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.gather(*tasks)
        return agents

    agents = asyncio.run(scenario())
    assert all(a.reads >= 1 for a in agents), [a.topic for a in agents if a.reads == 0]
    return agents


def test_a_hundred_agents_never_have_more_than_n_readers_at_once(
    counting_server: CountingServer,
) -> None:
    fleet = [f"gpu-{i:03d}" for i in range(100)]
    # one period is 10 slots of 1 s: every agent reads once in 10 s
    agents = run_fleet(counting_server, fleet, fleet_positions(fleet, "pool-a"), readers=10)
    assert counting_server.most <= 10, counting_server.most
    assert counting_server.most >= 2  # the counter saw the readers of one slot overlap
    assert counting_server.transfers >= len(fleet)
    for agent in agents:
        kept = agent.kept(objects(1))
        assert kept is not None and kept.status is Status.PASS, kept
        assert "measured in this node's slot" in kept.message


def test_the_counting_server_sees_a_fleet_that_reads_together(
    counting_server: CountingServer,
) -> None:
    """The control: 20 agents told they are alone (position 0 of 1) all read in every slot,
    as the fleet did on cycle 0 before slots; the server counts them together."""
    fleet = [f"gpu-{i:03d}" for i in range(30)]
    alone = dict.fromkeys(fleet, StorageSlot(position=0, of=1))
    run_fleet(counting_server, fleet, alone, readers=10)
    assert counting_server.most > 10, counting_server.most


# -- the slot function ------------------------------------------------------------------------


def readers_per_slot(
    positions: dict[str, StorageSlot], period: int, endpoint: str, slots: range
) -> Counter[int]:
    return Counter(
        s for s in slots for p in positions.values() if reads_in(p.position, period, endpoint, s)
    )


def test_the_bound_fairness_and_the_period() -> None:
    fleet = [f"node-{i}" for i in range(1000)]
    positions = fleet_positions(fleet, "pool-a")
    assert sorted(p.position for p in positions.values()) == list(range(1000))
    assert {p.of for p in positions.values()} == {1000}
    period = period_slots(1000, 4)
    assert period == 250  # 250 slots of 20 s: every node reads each endpoint every 83 min
    counts = readers_per_slot(positions, period, "objects", range(10**6, 10**6 + period))
    assert set(counts.values()) == {4} and len(counts) == period
    # a small fleet keeps throughputEveryCycles' spacing: 10 cycles of 30 s = 15 slots
    assert period_slots(3, 4, min_period_slots(10, 30.0, SLOT_SECONDS)) == 15
    assert period_slots(1, 1) == 1
    with pytest.raises(ValueError):
        period_slots(0, 4)


def test_positions_are_deterministic_and_endpoints_take_turns() -> None:
    fleet = [f"node-{i}" for i in range(50)]
    assert fleet_positions(fleet, "a") == fleet_positions(reversed(fleet), "a")
    assert fleet_positions(fleet, "a") != fleet_positions(fleet, "b")  # per validation
    # one node's endpoints are not all read in the same slot
    firsts = {next_read_slot(0, 50, f"ep-{i}", 0) for i in range(8)}
    assert len(firsts) > 1


def test_slot_guard_leaves_room_for_a_full_read() -> None:
    # request phase (5 s) + THROUGHPUT_MAX_SECONDS (10 s) between the guards
    assert SLOT_SECONDS - 2 * SLOT_GUARD_SECONDS >= 15.0


@settings(max_examples=150, deadline=None)
@given(
    fleet=st.sets(
        st.text("abcdefgh-0123456789", min_size=1, max_size=12), min_size=1, max_size=200
    ),
    readers=st.integers(1, 64),
    every=st.integers(1, 20),
    interval=st.floats(5, 600),
    endpoints=st.lists(st.text("abcxyz.-", min_size=1, max_size=8), min_size=1, max_size=3),
    base=st.integers(0, 10**9),
)
def test_slot_assignment_property(
    fleet: set[str], readers: int, every: int, interval: float, endpoints: list[str], base: int
) -> None:
    positions = fleet_positions(fleet, "pool")
    period = period_slots(len(fleet), readers, min_period_slots(every, interval, SLOT_SECONDS))
    assert period >= math.ceil(len(fleet) / readers)
    window = range(base, base + period)
    for endpoint in endpoints:
        counts = readers_per_slot(positions, period, endpoint, window)
        assert max(counts.values()) <= readers  # the budget, in every slot
        for p in positions.values():
            # fairness: exactly one read per period, and next_read_slot finds it
            mine = [s for s in window if reads_in(p.position, period, endpoint, s)]
            assert mine == [next_read_slot(p.position, period, endpoint, base)]


# -- the operator's assignment and the agent's reading of it ------------------------------


def test_the_operator_assigns_storage_positions_to_every_targeted_node() -> None:
    store = Store(label_keys=GPU)
    for node in ("gpu-a", "gpu-b", "gpu-c"):
        store.on_node(node, GPU)
    with_storage = spec_with([objects(80)], 2).model_copy(update={"node_selector": GPU})
    store.upsert_validation("pool-a", generation=1, spec=with_storage, body={}, status=None)
    payloads = {t: json.loads(p) for t, p in assignments(store).items()}
    slots = {t.split("/")[3]: StorageSlot.model_validate(p["storage"]) for t, p in payloads.items()}
    assert set(slots) == {"gpu-a", "gpu-b", "gpu-c"}
    assert sorted(s.position for s in slots.values()) == [0, 1, 2]
    assert all("domain" not in p for p in payloads.values())  # peers are off
    store.on_node("gpu-d", GPU)  # the fleet grew: every position is recomputed
    grown = {json.loads(p)["storage"]["of"] for p in assignments(store).values()}
    assert grown == {4}


@pytest.mark.parametrize(
    "payload",
    [b"{", b'{"storage": {"position": 3, "of": 3}}', b'{"storage": {"position": -1, "of": 2}}',
     b'{"storage": {"position": 0, "of": 1, "x": 1}}', b"[]", b'{"storage": 5}',
     # above MAX_ASSIGNMENT_BYTES (1 MiB: the assignment carries the peer set too)
     b'{"storage": {"position": 0, "of": 1}, "pad": "' + b"x" * (1 << 20) + b'"}'],
)  # fmt: skip
def test_a_bad_assignment_is_dropped_and_stops_reading(payload: bytes) -> None:
    reader = SlotReader("pool-a", "gpu-a")
    reader.handle_assignment(b'{"storage": {"position": 0, "of": 1}}')
    assert reader.assignment == StorageSlot(position=0, of=1)
    reader.handle_assignment(payload)
    assert reader.assignment is None and reader.dropped == 1
    reader.handle_assignment(b'{"domain": "rack-1"}')  # peers only: no storage slot
    assert reader.assignment is None and reader.dropped == 1


@settings(max_examples=200, deadline=None)
@given(
    st.binary(max_size=300) | st.from_regex(rb'\{"storage": \{"position": -?\d+, "of": -?\d+\}\}')
)
def test_assignment_payloads_never_raise(payload: bytes) -> None:
    reader = SlotReader("pool-a", "gpu-a")
    reader.handle_assignment(payload)
    if reader.assignment is not None:
        assert StorageAssignment.model_validate_json(payload).storage == reader.assignment


# -- what a probe cycle reports -----------------------------------------------------------------


def test_a_cycle_reports_the_slot_figure_and_keeps_it_between_slots(
    counting_server: CountingServer,
) -> None:
    port = int(counting_server.server_address[1])
    spec = spec_with([objects(port)], 4, every=10)  # 10 cycles of 5 s: one slot in 3
    checks = spec.checks.storage
    now = [1_000_000.0]
    reader = SlotReader("pool-a", "gpu-a", clock=lambda: now[0], phase_timeout=2.0)
    prober = StorageProber(reader)

    def throughput() -> Any:
        results = asyncio.run(prober.probe(checks, interval_seconds=5.0, timeout=2.0))
        assert results[0].check is CheckId.STORAGE_REACHABLE
        return next(r for r in results if r.check is CheckId.STORAGE_THROUGHPUT)

    waiting = throughput()
    assert waiting.status is Status.SKIP and "from the operator" in waiting.message
    reader.handle_assignment(b'{"storage": {"position": 0, "of": 1}}')
    first = throughput()
    assert first.status is Status.SKIP and "storage slot for it starts at" in first.message
    assert counting_server.transfers == 0  # a cycle never reads the object

    period = reader.period(checks, 5.0)
    assert period == 3
    slot = next_read_slot(0, period, "objects", 10**5)
    now[0] = slot * SLOT_SECONDS + SLOT_GUARD_SECONDS
    assert not reader.due(slot + 1, checks, 5.0)
    read = asyncio.run(reader.read_slot(slot, checks, 5.0))
    assert [r.status for r in read] == [Status.PASS] and counting_server.transfers == 1
    # woken too late in a slot: no cut-short read, the figure stands
    now[0] = (slot + period) * SLOT_SECONDS + SLOT_SECONDS * 0.6
    assert asyncio.run(reader.read_slot(slot + period, checks, 5.0)) == []
    now[0] = slot * SLOT_SECONDS + 3 * SLOT_SECONDS + SLOT_GUARD_SECONDS
    kept = throughput()
    assert kept.status is Status.PASS and kept.observed == read[0].observed
    assert "measured in this node's slot 60 s ago" in kept.message
    assert counting_server.transfers == 1


def test_an_agent_process_waits_for_its_slot_then_reads_in_it(
    tmp_path: Path, counting_server: CountingServer, mosquitto_broker: mosquitto.MosquittoBroker
) -> None:
    broker = mosquitto_broker
    endpoint = objects(int(counting_server.server_address[1]))
    storage = {
        "endpoints": [endpoint.model_dump(mode="json", by_alias=True, exclude_none=True)],
        "throughputEveryCycles": 1,  # a fleet of one with a 5 s interval: every 20 s slot
    }
    env = write_agent_files(tmp_path, broker, agent_config({"storage": storage}, interval="5s"))
    env["PYTHONPATH"] = str(Path(netval.__file__).parents[1])  # the netval this test imports
    log_file = tmp_path / "agent.log"

    def throughput_of(message: aiomqtt.Message) -> Any:
        report = Report.model_validate_json(bytes(message.payload))  # type: ignore[arg-type]
        return next(r for r in report.results if r.check is CheckId.STORAGE_THROUGHPUT)

    async def next_throughput(
        client: aiomqtt.Client, matches: Callable[[Any], bool], within: float
    ) -> Any:
        async with asyncio.timeout(within):
            async for message in client.messages:
                result = throughput_of(message)
                if matches(result):
                    return result
        raise AssertionError("the subscription ended")

    async def scenario() -> tuple[Any, Any]:
        async with aiomqtt.Client(
            broker.host, broker.port, username=broker.username, password=broker.password
        ) as client:
            await client.subscribe(f"{PREFIX}/report", qos=1)
            waiting = await next_throughput(client, lambda r: r.status is Status.SKIP, 20)
            assert counting_server.transfers == 0  # no assignment: no read
            slot = {"storage": {"position": 0, "of": 1}}
            await client.publish(
                f"{PREFIX}/assignment", json.dumps(slot).encode(), qos=1, retain=True
            )
            # one slot of 20 s, then the next report (5 s)
            read = await next_throughput(client, lambda r: r.status is Status.PASS, 60)
            return waiting, read

    with log_file.open("ab") as log:
        agent = subprocess.Popen(
            [netval_script(), "agent"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        try:
            waiting, read = asyncio.run(scenario())
        except TimeoutError:
            raise AssertionError(f"no such report\n{tail(log_file)}") from None
        assert "from the operator" in waiting.message, waiting.message
        assert read.subject == endpoint.name and "measured in this node's slot" in read.message
        assert counting_server.transfers >= 1 and counting_server.most == 1
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(10) == 0, tail(log_file)
    finally:
        stop_process(agent)
    assert "Traceback" not in tail(log_file, 20000), tail(log_file, 20000)
