"""A simulated fleet for the operator process tests: Nodes put in the test API's store
directly (kmock takes minutes to create 2,000 over HTTP; the operator lists and watches them
as any), and agents that publish over MQTT what real ones do -- a report per node every
period, retained at QoS 1, on the node's broker shard -- one client for the many, and one
client of its own with the last will `offline` for a node whose crash a test needs."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import paho.mqtt.client as paho

import kube as kube_module
from kube import KubeCluster
from mosquitto import MosquittoBroker
from netval.model import CheckId, CheckResult, Report, Status
from netval.model.attribution import Attribution, ErrorsKey
from netval.model.shards import shard_of

REQUESTER_COUNTERS = {"local_ack_timeout_err": 120, "req_transport_retries_exceeded": 3}


def add_nodes(kube: KubeCluster, labels: Iterable[tuple[str, dict[str, str]]]) -> None:
    """Store Nodes (name, labels) as the API server would and tell the watchers."""
    api = kube.api
    items = list(labels)

    async def add() -> None:
        async with api._lock:
            for name, node_labels in items:
                body = {"apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": name, "labels": dict(node_labels)}}  # fmt: skip
                stored = api._store_new(kube_module.NODES, None, body)
                await api._emit(kube_module.NODES, "ADDED", stored, None)

    kube.call(add, timeout=120)


def requester_warning() -> CheckResult:
    """What the agent's rdma.errors reports for retries without evidence on its own port
    (netval.model.attribution)."""
    return CheckResult(
        check=CheckId.RDMA_ERRORS,
        subject="mlx5_0/1",
        status=Status.WARN,
        message="requester-side retries: local_ack_timeout_err +120, "
        "req_transport_retries_exceeded +3 (24.6/s); no error on this port: a peer's",
        observed={
            ErrorsKey.ATTRIBUTION.value: Attribution.REQUESTER.value,
            ErrorsKey.COUNTERS.value: dict(REQUESTER_COUNTERS),
            ErrorsKey.RATE_PER_SECOND.value: 24.6,
        },
        expected={"maxRetryErrorsPerSecond": 0.1},
    )


def node_report(
    node: str, status: Status, validation: str = "pool-a", extra: tuple[CheckResult, ...] = ()
) -> Report:
    mtu = CheckResult(
        check=CheckId.MTU_INTERFACE,
        subject="ens1np0",
        status=Status.FAIL if status is Status.FAIL else Status.PASS,
        message="MTU 1500, expected 9000" if status is Status.FAIL else "MTU 9000",
        observed={"mtu": 1500 if status is Status.FAIL else 9000},
        expected={"mtu": 9000},
    )
    results = [mtu, *extra]
    if status is Status.WARN and not extra:
        results.append(requester_warning())
    worst = max((r.status for r in results), key=lambda s: s.severity)
    return Report(validation=validation, generation=1, node=node,
                  started_at=datetime.now(UTC), duration_ms=2.0, status=worst,
                  results=results)  # fmt: skip


def _client(broker: MosquittoBroker, client_id: str = "", will: str | None = None) -> Any:
    client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=client_id,
                         protocol=paho.MQTTv311)  # fmt: skip
    client.username_pw_set(broker.username, broker.password)
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    if will is not None:
        client.will_set(will, b"offline", qos=1, retain=True)
    connected = threading.Event()
    client.on_connect = lambda *a: connected.set()
    client.connect(broker.host, broker.port, keepalive=60)
    client.loop_start()
    if not connected.wait(10):
        raise RuntimeError(f"no MQTT connection to {broker.host}:{broker.port}")
    return client


class Watcher:
    def __init__(self, client: Any, topic_filter: str) -> None:
        self.client = client
        self._latest: dict[str, bytes] = {}
        self._lock = threading.Lock()
        client.on_message = self._on_message
        done = threading.Event()
        client.on_subscribe = lambda *a: done.set()
        client.subscribe(topic_filter, qos=1)
        if not done.wait(10):
            raise RuntimeError(f"no SUBACK for {topic_filter}")

    def _on_message(self, _c: Any, _u: Any, message: Any) -> None:
        with self._lock:
            self._latest[message.topic] = bytes(message.payload)

    def latest(self, topic: str) -> bytes | None:
        with self._lock:
            return self._latest.get(topic)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


class Agents:
    """Publishes every node's report (what `reports` says for it) every `period` seconds
    while started; `crash` ends a node's own client without a DISCONNECT, so the broker
    sends its last will."""

    def __init__(self, brokers: list[MosquittoBroker], *, validation: str = "pool-a",
                 period: float = 2.0) -> None:  # fmt: skip
        self.brokers = brokers
        self.validation = validation
        self.period = period
        self.reports: dict[str, Callable[[], Report] | None] = {}
        self._clients: dict[int, Any] = {}
        self._own: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.rounds = 0

    def shard(self, node: str) -> int:
        return shard_of(node, len(self.brokers))

    def client(self, node: str) -> Any:
        own = self._own.get(node)
        if own is not None:
            return own
        shard = self.shard(node)
        if shard not in self._clients:
            self._clients[shard] = _client(self.brokers[shard])
        return self._clients[shard]

    def set(self, nodes: Iterable[str], status: Status | None, **kw: Any) -> None:
        """What the nodes report from now on (None: they are silent)."""
        with self._lock:
            for node in nodes:
                self.reports[node] = (
                    None if status is None
                    else (lambda n=node, s=status: node_report(n, s, self.validation, **kw))
                )  # fmt: skip

    def own_client(self, node: str) -> None:
        """`node` gets a client of its own, with its last will, online."""
        topic = f"netval/v1/{self.validation}/{node}/state"
        client = _client(self.brokers[self.shard(node)], f"agent-{node}", will=topic)
        client.publish(topic, b"online", qos=1, retain=True).wait_for_publish(10)
        self._own[node] = client

    def crash(self, node: str) -> None:
        """The node's agent dies: its connection drops without DISCONNECT (the will goes)."""
        client = self._own.pop(node)
        self.set([node], None)
        client.loop_stop()
        sock = client.socket()
        if sock is not None:
            sock.close()

    def publish(self, report: Report) -> None:
        topic = f"netval/v1/{report.validation}/{report.node}/report"
        self.client(report.node).publish(topic, report.to_json().encode(), qos=1,
                                         retain=True).wait_for_publish(20)  # fmt: skip

    def publish_raw(self, shard: int, topic: str, payload: bytes) -> None:
        if shard not in self._clients:
            self._clients[shard] = _client(self.brokers[shard])
        self._clients[shard].publish(topic, payload, qos=1, retain=True).wait_for_publish(20)

    def publish_all(self) -> None:
        with self._lock:
            makers = [m for m in self.reports.values() if m is not None]
        infos = []
        for make in makers:
            report = make()
            topic = f"netval/v1/{report.validation}/{report.node}/report"
            infos.append(self.client(report.node).publish(topic, report.to_json().encode(),
                                                          qos=1, retain=True))  # fmt: skip
        for info in infos:
            info.wait_for_publish(30)
        self.rounds += 1

    def start(self) -> Agents:
        def run() -> None:
            while not self._stop.is_set():
                started = time.monotonic()
                # a broker restarting under the test: the next round publishes again
                with contextlib.suppress(RuntimeError, ValueError, OSError):
                    self.publish_all()
                self._stop.wait(max(0.0, self.period - (time.monotonic() - started)))

        self._thread = threading.Thread(target=run, name="simulated-agents", daemon=True)
        self._thread.start()
        return self

    def watch(self, topic_filter: str, shard: int = 0) -> Watcher:
        """A subscriber (the broker's login, a client id of its own) keeping the newest
        payload of each topic `topic_filter` matches."""
        return Watcher(_client(self.brokers[shard], f"watcher-{time.monotonic_ns()}"), topic_filter)

    def reconnect(self, shard: int) -> None:
        """The shared client of `shard` again (after its broker restarted)."""
        old = self._clients.pop(shard, None)
        if old is not None:
            old.loop_stop()
            old.disconnect()

    def __enter__(self) -> Agents:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        for client in [*self._clients.values(), *self._own.values()]:
            client.loop_stop()
            client.disconnect()
