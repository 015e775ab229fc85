"""Poison input against the operator's MQTT ingest and a real Mosquitto: retained reports that
used to crash-loop the session (OverflowError on a legal year-9999 report), non-finite
numbers, oversized and non-UTF-8 payloads, a 5,000-message burst, a raising callback. The
ingest keeps its one session, counts each drop by reason, and the legitimate nodes stay right.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import aiomqtt
import pytest

from mosquitto import MosquittoBroker
from netval.model import Status
from netval.model.results import Report
from netval.model.spec import NetworkValidationSpec
from netval.model.topics import DropReason
from netval.operator.ingest.decode import BeatMessage, StateChange
from netval.operator.ingest.subscriber import ReportIngest
from netval.operator.state.store import Store, utcnow
from netval.operator.state.validation import is_fresh
from operator_env import GPU, NODES, report, settings_for

POOL = "pool-a"


def store_with_pool() -> Store:
    store = Store(label_keys=GPU)
    for node in NODES:
        store.on_node(node, GPU)
    spec = NetworkValidationSpec.model_validate({"nodeSelector": GPU, "interval": "60s"})
    store.upsert_validation(POOL, generation=1, spec=spec, body={}, status=None)
    return store


def poison(**changes: Any) -> bytes:
    """gpu-c's report with legal JSON types and hostile values."""
    body: dict[str, Any] = json.loads(report("gpu-c", Status.FAIL).to_json())
    for key, value in changes.items():
        if key == "observed":
            body["results"][0]["observed"] = value
        else:
            body[key] = value
    return json.dumps(body).encode()


def topic(node: str, kind: str = "report") -> str:
    return f"netval/v1/{POOL}/{node}/{kind}"


async def publish(
    broker: MosquittoBroker, messages: list[tuple[str, bytes]], *, retain: bool = True
) -> None:
    async with aiomqtt.Client(
        broker.host,
        broker.port,
        username=broker.username,
        password=broker.password,
        max_queued_outgoing_messages=0,
    ) as client:
        for name, payload in messages:
            await client.publish(name, payload, qos=1, retain=retain)


async def until(check: Callable[[], bool], what: str, limit: float = 15.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def with_ingest(
    broker: MosquittoBroker,
    store: Store,
    body: Callable[[ReportIngest], Awaitable[None]],
    *,
    on_report: Callable[[Report, bool], Any] | None = None,
    on_state: Callable[[StateChange], Any] | None = None,
    on_beat: Callable[[BeatMessage, bool], Any] = lambda message, retained: None,
) -> ReportIngest:
    ingest = ReportIngest(
        settings_for(broker).mqtt,
        on_report=on_report or store.ingest_report,
        on_state=on_state or store.on_state,
        on_beat=on_beat,
        backoff_base=0.05,
        backoff_cap=0.2,
    )
    task = asyncio.create_task(ingest.run())
    try:
        await until(ingest.synced.is_set, "ingest synced")
        await body(ingest)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return ingest


def drops(ingest: ReportIngest) -> dict[str, int]:
    return {reason.value: n for reason, n in ingest.stats.dropped.items()}


def test_retained_poison_reports_do_not_crash_loop_the_session(
    mosquitto_broker: MosquittoBroker,
) -> None:
    """The reproduced crash-loop: a retained report with legal types (year 9999, a huge
    durationMs) raised OverflowError outside any guard, the broker replayed it on every
    reconnect and `synced` never came. Now each poison is one counted drop."""
    store = store_with_pool()
    now = datetime.now(UTC)
    retained = [
        (topic("gpu-a"), report("gpu-a").to_json().encode()),
        (topic("gpu-b"), report("gpu-b", Status.FAIL).to_json().encode()),
        (topic("gpu-c"), poison(startedAt="9999-12-31T23:59:59Z", durationMs=1e15)),
        (topic("gpu-d"), poison(node="gpu-d", durationMs=1e400)),  # json: Infinity
    ]
    asyncio.run(publish(mosquitto_broker, retained))

    async def body(ingest: ReportIngest) -> None:
        await until(lambda: sum(ingest.stats.dropped.values()) >= 2, "both poisons dropped")
        await asyncio.sleep(0)  # nothing to wait for: the session must simply still be up

    ingest = asyncio.run(with_ingest(mosquitto_broker, store, body))
    assert ingest.stats.reconnects == 0
    assert drops(ingest) == {"invalid_report": 2}
    state = store.states[POOL]
    assert set(state.nodes) == {"gpu-a", "gpu-b"}
    assert state.nodes["gpu-b"].status is Status.FAIL
    assert is_fresh(state, "gpu-a", now)


@pytest.fixture
def chart_limits_broker(tmp_path: Any) -> Any:
    """A real Mosquitto with the chart's per-client limits (a burst must not be dropped by
    the broker before the operator gets to count it)."""
    import mosquitto

    if not mosquitto.available():
        pytest.skip(mosquitto.MISSING_REASON)
    broker = mosquitto.MosquittoBroker(tmp_path, extra_config=mosquitto.CHART_LIMITS)
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


def test_hostile_live_messages_are_each_one_counted_drop(mosquitto_broker: MosquittoBroker) -> None:
    """Non-finite numbers, times and durations out of bounds, deep nesting, int64 overflow,
    10 MB, invalid UTF-8, garbage: one drop each, reasons named, gpu-a and gpu-b right."""
    store = store_with_pool()
    hostile = [
        poison(observed={"mtu": float("nan")}),  # json.dumps writes NaN
        poison(observed={"mtu": float("inf")}),  # Infinity
        poison(observed={"mtu": -float("inf")}),
        poison(observed={"x": 10**400}),
        poison(observed={"deep": json.loads("[" * 40 + "]" * 40)}),
        poison(startedAt="2001-01-01T00:00:00Z"),  # older than a day
        poison(startedAt="2999-01-01T00:00:00Z"),  # far in the future
        poison(durationMs=-1),
        poison(generation=2**64),
        poison(traceparent="x" * 10_000),
    ]
    garbage = [b"\xff\xfe\xfd", b"{not json", b"[]", b"null", b"{" + b" " * (10 << 20) + b"}"]
    good = [
        (topic("gpu-a"), report("gpu-a").to_json().encode()),
        (topic("gpu-b"), report("gpu-b", Status.FAIL).to_json().encode()),
    ]
    messages = [(topic("gpu-c"), p) for p in hostile + garbage] + good
    messages.append((topic("gpu-d", "state"), b"\xff" * 50))

    async def body(ingest: ReportIngest) -> None:
        await publish(mosquitto_broker, messages, retain=False)
        await until(lambda: ingest.stats.reports == 2, "the good reports")
        await until(lambda: sum(ingest.stats.dropped.values()) == 16, "every drop")

    ingest = asyncio.run(with_ingest(mosquitto_broker, store, body))
    assert drops(ingest) == {"invalid_report": 13, "not_utf8": 1, "too_large": 1, "bad_state": 1}
    assert ingest.stats.reconnects == 0
    state = store.states[POOL]
    assert set(state.nodes) == {"gpu-a", "gpu-b"}
    assert state.nodes["gpu-b"].status is Status.FAIL
    assert state.nodes["gpu-a"].status is Status.PASS


def test_a_raising_handler_is_an_internal_error_drop_not_a_new_session(
    mosquitto_broker: MosquittoBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever raises while a message is handled (a bug downstream of the decoder) is one
    `internal_error` drop naming the topic, logged once per topic, and the session stays."""
    store = store_with_pool()

    def on_report(r: Report, retained: bool) -> Any:
        if r.node == "gpu-c":
            raise RuntimeError("boom")
        return store.ingest_report(r, retained)

    retained = [(topic(n), report(n).to_json().encode()) for n in ("gpu-a", "gpu-c")]
    asyncio.run(publish(mosquitto_broker, retained))

    async def body(ingest: ReportIngest) -> None:
        await until(lambda: ingest.stats.dropped[DropReason.INTERNAL_ERROR] == 1, "the replay")
        live = [(topic("gpu-c"), report("gpu-c").to_json().encode())] * 3
        live.append((topic("gpu-b"), report("gpu-b").to_json().encode()))
        await publish(mosquitto_broker, live, retain=False)
        await until(lambda: "gpu-b" in store.states[POOL].nodes, "gpu-b after the errors")

    ingest = asyncio.run(with_ingest(mosquitto_broker, store, body, on_report=on_report))
    assert drops(ingest) == {"internal_error": 4}
    assert ingest.stats.reconnects == 0
    assert set(store.states[POOL].nodes) == {"gpu-a", "gpu-b"}
    logged = [r for r in caplog.records if "internal_error" in r.getMessage()]
    assert len(logged) == 1  # rate-limited per topic
    assert topic("gpu-c") in logged[0].getMessage() and logged[0].exc_info is not None


BURST = 5000


def test_a_burst_of_bad_messages_is_counted_to_the_last(
    chart_limits_broker: MosquittoBroker,
) -> None:
    """5,000 messages as fast as one publisher can send them, one in five good: every bad one
    counted, every good one folded (the broker runs the chart's limits, so none is lost)."""
    store = store_with_pool()
    good = report("gpu-a").to_json().encode()
    messages = [
        (topic("gpu-a"), good) if i % 5 == 0 else (topic("gpu-c"), b"{bad %d" % i)
        for i in range(BURST)
    ]

    async def body(ingest: ReportIngest) -> None:
        async with aiomqtt.Client(
            chart_limits_broker.host,
            chart_limits_broker.port,
            username=chart_limits_broker.username,
            password=chart_limits_broker.password,
            max_inflight_messages=1000,
        ) as client:
            await asyncio.gather(*(client.publish(t, p, qos=1) for t, p in messages))
        await until(
            lambda: ingest.stats.reports + sum(ingest.stats.dropped.values()) == BURST,
            "the whole burst",
            limit=30,
        )

    ingest = asyncio.run(with_ingest(chart_limits_broker, store, body))
    assert ingest.stats.reports == BURST // 5
    assert drops(ingest) == {"invalid_report": BURST - BURST // 5}
    assert ingest.stats.reconnects == 0
    assert is_fresh(store.states[POOL], "gpu-a", utcnow())
