"""Two real Mosquitto brokers as shards (mqtt.shards: 2). The operator's ingest keeps each
retained message on the shard of the node it names; the whole operator (in-process Kopf, the
test API) ingests from both, with simulated agents that pick their broker the way the agent
does (`mqtt_env_for_node`). One broker SIGKILLed: only its nodes turn stale, the other shard's
stay fresh and the health answer names the shard that is down; restarted: they come back.

The brokers listen on the same port of two loopback addresses (127.0.0.1, 127.0.1.1), so one
URL pattern, ``mqtt://127.0.{shard}.1:PORT``, names both, as the chart's does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiomqtt
import kopf
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import mosquitto
from kopf_harness import kopf_operator
from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.infra.mqtt_settings import mqtt_env_for_node, mqtt_settings_from_env
from netval.model.shards import shard_of
from netval.model.topics import TopicKind, topic
from netval.operator.ingest.shards import ShardedIngest, broker_health
from netval.operator.settings import OperatorSettings, operator_settings_from_env
from netval.operator.state.store import utcnow
from netval.operator.state.validation import is_fresh
from netval.operator.term_runtime import OperatorRuntime
from operator_env import NODES, NS, report, validation, wait_status
from test_ingest_faults import store_with_pool, until

pytestmark = pytest.mark.skipif(not mosquitto.available(), reason=mosquitto.MISSING_REASON)

SHARDS = 2


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[list[MosquittoBroker]]:
    """Broker i on 127.0.i.1, all on one port."""
    out: list[MosquittoBroker] = []
    try:
        for i in range(SHARDS):
            workdir = tmp_path / f"shard-{i}"
            workdir.mkdir()
            broker = MosquittoBroker(workdir)
            if out:
                old = f"listener {broker.port} {broker.host}"
                broker.host, broker.port = f"127.0.{i}.1", out[0].port
                text = broker.config.read_text()
                broker.config.write_text(text.replace(old, f"listener {broker.port} {broker.host}"))
            broker.start()
            out.append(broker)
        yield out
    finally:
        for broker in out:
            broker.stop()


def shard_env(brokers: list[MosquittoBroker], tmp_path: Path) -> dict[str, str]:
    password = tmp_path / "mqtt-password"
    password.write_text(brokers[0].password + "\n")
    return {
        "NETVAL_MQTT_SHARDS": str(len(brokers)),
        "NETVAL_MQTT_URL_PATTERN": f"mqtt://127.0.{{shard}}.1:{brokers[0].port}",
        "NETVAL_MQTT_USERNAME": brokers[0].username,
        "NETVAL_MQTT_PASSWORD_FILE": str(password),
        "NETVAL_NAMESPACE": NS,
        "NETVAL_STATUS_WINDOW_SECONDS": "0.2",
    }


def sigkill(broker: MosquittoBroker) -> None:
    proc = broker.proc
    assert proc is not None
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


# -- retained messages go to the node's shard ----------------------------------------------


async def retained_on(broker: MosquittoBroker, kind: TopicKind) -> set[str]:
    """The nodes whose `kind` topic the broker retains (replayed until quiet)."""
    nodes: set[str] = set()
    async with aiomqtt.Client(
        broker.host, broker.port, username=broker.username, password=broker.password
    ) as client:
        await client.subscribe(f"netval/v1/+/+/{kind.value}", qos=1)
        with contextlib.suppress(TimeoutError):
            while True:
                async with asyncio.timeout(1.0):
                    message = await anext(aiomqtt_messages(client))
                if message.payload:
                    nodes.add(message.topic.value.split("/")[3])
    return nodes


async def aiomqtt_messages(client: aiomqtt.Client) -> Any:
    async for message in client.messages:
        yield message


def test_retained_messages_go_to_the_nodes_shard(
    brokers: list[MosquittoBroker], tmp_path: Path
) -> None:
    settings = operator_settings_from_env(shard_env(brokers, tmp_path))
    store = store_with_pool()
    ingest = ShardedIngest(
        settings.mqtt_shards, on_report=store.ingest_report, on_state=store.on_state
    )
    nodes = [f"gpu-{i}" for i in range(12)]
    wanted = {topic("pool-a", n, TopicKind.ASSIGNMENT): b'{"domain":"d"}' for n in nodes}

    async def main() -> None:
        task = asyncio.create_task(ingest.run())
        try:
            await until(lambda: ingest.synced.is_set(), "both shards synced")
            ingest.set_retained(wanted)
            for i, broker in enumerate(brokers):
                mine = {n for n in nodes if shard_of(n, SHARDS) == i}
                assert mine, "12 names reach both shards"
                await until_async(lambda b=broker, m=mine: retained_nodes_are(b, m))
            ingest.set_retained({})  # no longer wanted: cleared on each shard
            for broker in brokers:
                await until_async(lambda b=broker: retained_nodes_are(b, set()))
            # a deleted validation's leftovers (the agents' reports) are cleared where they are
            for i, broker in enumerate(brokers):
                mine = [n for n in nodes if shard_of(n, SHARDS) == i]
                await publish_reports(broker, mine)
                assert await retained_on(broker, TopicKind.REPORT) == set(mine)
            ingest.clear_retained([topic("pool-a", n, TopicKind.REPORT) for n in nodes])
            for broker in brokers:
                await until_async(lambda b=broker: reports_gone(b))
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(main())


async def publish_reports(broker: MosquittoBroker, nodes: list[str]) -> None:
    async with aiomqtt.Client(
        broker.host, broker.port, username=broker.username, password=broker.password
    ) as client:
        for node in nodes:
            name = topic("pool-a", node, TopicKind.REPORT)
            await client.publish(name, report(node).to_json().encode(), qos=1, retain=True)


async def reports_gone(broker: MosquittoBroker) -> bool:
    return not await retained_on(broker, TopicKind.REPORT)


async def retained_nodes_are(broker: MosquittoBroker, nodes: set[str]) -> bool:
    return await retained_on(broker, TopicKind.ASSIGNMENT) == nodes


async def until_async(check: Any, limit: float = 20.0) -> None:
    async with asyncio.timeout(limit):
        while True:
            if await check():
                return
            await asyncio.sleep(0.1)


# -- the whole operator: a shard's loss -----------------------------------------------------


class ShardAgents:
    """One simulated agent per node, each on its node's shard (as `netval agent` chooses it),
    publishing a retained report every `every` seconds and reconnecting when its broker goes."""

    def __init__(self, env: dict[str, str], nodes: list[str], every: float = 0.5) -> None:
        self.settings = {n: mqtt_settings_from_env(mqtt_env_for_node(env, n)) for n in nodes}
        self.every = every
        self.published: dict[str, int] = dict.fromkeys(nodes, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> ShardAgents:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(20)

    async def _main(self) -> None:
        await asyncio.gather(*(self._agent(n) for n in self.settings))

    async def _agent(self, node: str) -> None:
        s = self.settings[node]
        while not self._stop.is_set():
            try:
                async with aiomqtt.Client(
                    s.host, s.port, username=s.username, password=s.password, timeout=2
                ) as client:
                    while not self._stop.is_set():
                        r = report(node)
                        name = topic(r.validation, node, TopicKind.REPORT)
                        await client.publish(name, r.to_json().encode(), qos=1, retain=True)
                        self.published[node] += 1
                        await asyncio.sleep(self.every)
            except aiomqtt.MqttError:
                await asyncio.sleep(0.2)


@pytest.fixture
def sharded_operator(
    cluster: KubeCluster, brokers: list[MosquittoBroker], tmp_path: Path
) -> Iterator[tuple[OperatorRuntime, dict[str, str]]]:
    env = shard_env(brokers, tmp_path)
    settings: OperatorSettings = operator_settings_from_env(env)
    assert settings.shard_count == SHARDS
    memo = kopf.Memo(
        settings=settings, span_exporter=InMemorySpanExporter(), metrics_addr=("127.0.0.1", 0)
    )
    with kopf_operator(
        cluster, modules=["netval.operator.handlers"], memo=memo, fail_level=logging.CRITICAL
    ):
        runtime = wait_for(lambda: memo.get("runtime"), timeout=30, what="operator runtime")
        assert isinstance(runtime, OperatorRuntime)
        assert isinstance(runtime.ingest, ShardedIngest)
        wait_for(lambda: runtime.ingest.synced.is_set(), timeout=30, what="both shards synced")
        yield runtime, env


def test_losing_a_shard_makes_only_its_nodes_stale(
    cluster: KubeCluster,
    brokers: list[MosquittoBroker],
    sharded_operator: tuple[OperatorRuntime, dict[str, str]],
) -> None:
    runtime, env = sharded_operator
    on = {i: [n for n in NODES if shard_of(n, SHARDS) == i] for i in range(SHARDS)}
    assert all(on.values()), on  # gpu-b, gpu-c on shard 0; gpu-a, gpu-d on shard 1
    # the shortest interval (5 s): a node without a report for 15 s is stale
    cluster.create(validation(interval="5s"))

    def fresh(nodes: list[str]) -> bool:
        state = runtime.store.states.get("pool-a")
        now = utcnow()
        return state is not None and all(is_fresh(state, n, now) for n in nodes)

    def stale(nodes: list[str]) -> bool:
        state = runtime.store.states.get("pool-a")
        now = utcnow()
        return state is not None and not any(is_fresh(state, n, now) for n in nodes)

    with ShardAgents(env, NODES):
        wait_for(lambda: fresh(NODES), timeout=30, what="every node fresh over both shards")
        wait_status(cluster, lambda s: s.get("nodes", {}).get("reporting") == 4, "4 reporting")

        sigkill(brokers[1])
        wait_for(
            lambda: broker_health(runtime.ingest)[1].startswith("not connected to MQTT shard(s) 1"),
            timeout=20,
            what="the health answer names shard 1",
        )
        wait_for(lambda: stale(on[1]), timeout=60, what="shard 1's nodes stale")
        # the other shard's nodes kept reporting all along
        assert fresh(on[0])
        status = wait_status(
            cluster,
            lambda s: s.get("nodes", {}).get("stale") == len(on[1]),
            "status counts shard 1's nodes stale",
        )
        assert status["nodes"]["reporting"] == len(on[0])
        assert runtime.ingest.sessions[0].stats.connected

        brokers[1].start()  # same address, empty (no persistence): the agents publish again
        wait_for(lambda: fresh(NODES), timeout=60, what="shard 1's nodes fresh again")
        wait_status(cluster, lambda s: s.get("nodes", {}).get("reporting") == 4, "4 reporting")
        assert broker_health(runtime.ingest) == (True, "ok")
