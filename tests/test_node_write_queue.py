"""Node writes at a bounded rate (issue 23): a burst of transitions is queued per node (the
latest wish, FIFO) and written at the operator's token-bucket rate, never dropped.

First the queue and the bucket on their own (a fake clock, a recording writer), then the node
writer end to end: 1,000 Nodes in kmock's Kubernetes API turn failing within a few rounds,
the real `NodeGating` writes their labels through the official client, and the test counts
kmock's requests per second: none has more than the rate plus the burst, every Node ends up
labelled, and a node that flips fail -> pass -> fail while queued is written once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from kube import KubeCluster
from netval.model import Status
from netval.model.keys import FabricHealth, LabelKey
from netval.model.spec import NetworkValidationSpec
from netval.operator.gating.decisions import NodeChange
from netval.operator.gating.node_writer import NodeGating
from netval.operator.gating.write_queue import NodeWriteQueue, TokenBucket
from netval.operator.kube.api import KubeApi
from netval.operator.settings import (
    DEFAULT_NODE_WRITE_BURST,
    DEFAULT_NODE_WRITES_PER_SECOND,
    OperatorConfigError,
    operator_settings_from_env,
)
from netval.operator.state.store import Store
from netval.operator.status.events import Events
from operator_env import report

UNHEALTHY = FabricHealth.UNHEALTHY
HEALTHY = FabricHealth.HEALTHY


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def change(node: str, label: FabricHealth | None = UNHEALTHY, taint: bool = False) -> NodeChange:
    return NodeChange(node, label, taint)


async def until(check: Callable[[], bool], what: str, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


# -- the bucket and the queue -------------------------------------------------------------------


def test_token_bucket_allows_the_burst_then_the_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=10, burst=3, clock=clock)
    for _ in range(3):
        assert bucket.wait_time() == 0
        bucket._tokens -= 1
    assert math.isclose(bucket.wait_time(), 0.1)
    clock.now += 0.25  # 2.5 tokens back
    assert bucket.wait_time() == 0
    clock.now += 100  # never more than the burst saved up
    bucket._refill()
    assert bucket._tokens == 3


def _queue(
    writes: list[NodeChange], result: Callable[[NodeChange], bool | None] = lambda _: True
) -> NodeWriteQueue:
    async def write(c: NodeChange) -> bool | None:
        writes.append(c)
        return result(c)

    return NodeWriteQueue(write, TokenBucket(1000, 1000), concurrency=4)


def _drain(queue: NodeWriteQueue, until_done: Callable[[], bool]) -> None:
    async def main() -> None:
        task = asyncio.create_task(queue.run())
        try:
            await until(lambda: until_done() and not queue.inflight, "the queue drained", 10)
        finally:
            task.cancel()

    asyncio.run(main())


def test_queue_coalesces_per_node_keeps_fifo_and_drops_wishes_already_met() -> None:
    async def main() -> None:
        writes: list[NodeChange] = []
        queue = _queue(writes)
        queue.want(change("a"))
        queue.want(change("b"))
        queue.want(change("c"))
        queue.want(change("b", UNHEALTHY, taint=True))  # b again: replaced in place
        assert list(queue.pending) == ["a", "b", "c"] and queue.coalesced == 1
        # a again, no longer excluding: replaced, behind every exclusion
        queue.want(change("a", FabricHealth.SUSPECT))
        assert list(queue.pending) == ["b", "c", "a"] and queue.coalesced == 2
        queue.reconcile({"c": change("c"), "a": change("a", FabricHealth.SUSPECT)})
        assert list(queue.pending) == ["c", "a"]  # b carries what it should now
        task = asyncio.create_task(queue.run())
        await until(lambda: len(writes) == 2 and not queue.inflight, "two writes", 10)
        task.cancel()
        assert writes == [change("c"), change("a", FabricHealth.SUSPECT)]
        assert queue.written == 2 and sum(queue.latency.counts) == 2

    asyncio.run(main())


def test_exclusions_are_written_before_inclusions() -> None:
    """A relabel queued first (healthy, unknown, a label removed), then a node that starts
    failing: its exclusion is the next write; `pending_exclusions` names it until written."""

    async def main() -> None:
        writes: list[NodeChange] = []
        queue = _queue(writes)
        for i in range(50):
            queue.want(change(f"n{i:02d}", HEALTHY))
        queue.want(change("n10", None))  # a relabel entry that becomes a removal: stays put
        queue.want(change("bad", UNHEALTHY))
        queue.want(change("tainted", HEALTHY, taint=True))
        assert list(queue.pending)[:2] == ["bad", "tainted"]
        assert queue.pending_exclusions() == {"bad", "tainted"}
        task = asyncio.create_task(queue.run())
        await until(lambda: len(writes) == 52 and not queue.inflight, "every write", 10)
        task.cancel()
        assert [c.node for c in writes[:2]] == ["bad", "tainted"]
        assert writes[12] == change("n10", None)  # its place among the inclusions kept
        assert queue.pending_exclusions() == set()

    asyncio.run(main())


def test_queue_puts_a_failed_write_back_and_forgets_a_gone_node() -> None:
    failures = {"a": 2}
    writes: list[NodeChange] = []

    def result(c: NodeChange) -> bool | None:
        if c.node == "gone":
            return False
        if failures.get(c.node, 0) > 0:
            failures[c.node] -= 1
            return None
        return True

    queue = _queue(writes, result)
    queue.want(change("a"))
    queue.want(change("gone"))
    _drain(queue, lambda: queue.written == 1 and not queue.pending)
    assert [c.node for c in writes].count("a") == 3 and queue.retried == 2
    assert [c.node for c in writes].count("gone") == 1


def test_a_failed_write_whose_wish_was_withdrawn_meanwhile_is_not_put_back() -> None:
    async def main() -> None:
        release = asyncio.Event()
        writes: list[NodeChange] = []

        async def write(c: NodeChange) -> bool | None:
            writes.append(c)
            await release.wait()
            return None  # failed

        queue = NodeWriteQueue(write, TokenBucket(1000, 1000), concurrency=4)
        task = asyncio.create_task(queue.run())
        queue.want(change("a"))
        await until(lambda: "a" in queue.inflight, "a in flight", 10)
        queue.reconcile({})  # a round: a carries what it should after all
        release.set()
        await until(lambda: not queue.inflight, "the write ended", 10)
        task.cancel()
        assert not queue.pending and queue.retried == 0 and writes == [change("a")]

    asyncio.run(main())


def test_node_write_rate_settings() -> None:
    base = {"NETVAL_MQTT_URL": "mqtt://broker:1883"}
    defaults = operator_settings_from_env(base)
    assert defaults.node_writes_per_second == DEFAULT_NODE_WRITES_PER_SECOND == 20
    assert defaults.node_write_burst == DEFAULT_NODE_WRITE_BURST == 40
    tuned = operator_settings_from_env(
        {**base, "NETVAL_NODE_WRITES_PER_SECOND": "5.5", "NETVAL_NODE_WRITE_BURST": "7"}
    )
    assert (tuned.node_writes_per_second, tuned.node_write_burst) == (5.5, 7)
    for bad in (
        {"NETVAL_NODE_WRITES_PER_SECOND": "0"},
        {"NETVAL_NODE_WRITES_PER_SECOND": "fast"},
        {"NETVAL_NODE_WRITE_BURST": "0"},
        {"NETVAL_NODE_WRITE_BURST": "2.5"},
    ):
        try:
            operator_settings_from_env({**base, **bad})
        except OperatorConfigError:
            continue
        raise AssertionError(f"{bad} accepted")


# -- end to end: 1,000 Nodes in kmock ---------------------------------------------------------

N = 1000
POOL = "pool-a"
FLEET = {"netval.example/fleet": "a"}
NODES = [f"node-{i:04d}" for i in range(N)]
# Faster than the default so the run takes ~20 s, slow enough that kmock (~15 ms a PATCH on
# this machine) is not what limits the rate.
RATE = 50.0
BURST = 10


def _fleet_store() -> Store:
    store = Store(label_keys=FLEET)
    for node in NODES:
        store.on_node(node, {**FLEET, LabelKey.FABRIC.value: HEALTHY.value})
    spec = NetworkValidationSpec.model_validate(
        {
            "nodeSelector": FLEET,
            "interval": "60s",
            # every failing node labelled unhealthy: no breaker turning some into suspect;
            # one passing report releases a node
            "gating": {
                "nodeLabel": True,
                "taint": False,
                "maxUnhealthyPercent": 100,
                "recoveryReports": 1,
            },
        }
    )
    store.upsert_validation(POOL, generation=1, spec=spec, body={}, status=None)
    store.expected_validations = {POOL}
    for node in NODES:
        store.ingest_report(report(node, Status.PASS), False)
    return store


def _node_patches(cluster: KubeCluster) -> list[tuple[float, str]]:
    async def read() -> list[tuple[float, str]]:
        return [
            (at, path.split("?")[0].rsplit("/", 1)[-1])
            for at, method, path in cluster.api.stamps
            if method == "PATCH" and path.startswith("/api/v1/nodes/")
        ]

    return cluster.call(read)


def test_a_thousand_nodes_failing_are_written_at_the_rate_latest_value_once(
    tmp_path: Path,
) -> None:
    with KubeCluster(tmp_path) as cluster:
        cluster.api.keep_requests = 10
        for node in NODES:
            labels = {**FLEET, LabelKey.FABRIC.value: HEALTHY.value}
            cluster.create({"apiVersion": "v1", "kind": "Node",
                            "metadata": {"name": node, "labels": labels}})  # fmt: skip
        store = _fleet_store()
        settings = dataclasses.replace(
            operator_settings_from_env({"NETVAL_MQTT_URL": "mqtt://unused:1883"}),
            node_writes_per_second=RATE,
            node_write_burst=BURST,
        )
        flipped: list[str] = []

        async def main() -> None:
            kube = KubeApi(cluster.api_client())
            gating = NodeGating(settings, kube, store, Events(kube, store))
            drain = asyncio.create_task(gating.queue.run())
            try:
                # the fleet turns failing in four batches, a gating round after each
                for batch in range(4):
                    for node in NODES[batch * 250 : (batch + 1) * 250]:
                        store.ingest_report(report(node, Status.FAIL), False)
                    await gating.apply(datetime.now(UTC))
                queued = list(gating.queue.pending)
                assert len(queued) > N // 2, "the burst is queued, not written at once"
                node = queued[-1]
                flipped.append(node)
                # fail -> pass -> fail while queued: out of the queue, back at its tail
                store.ingest_report(report(node, Status.PASS), False)
                await gating.apply(datetime.now(UTC))
                assert node not in gating.queue.pending
                store.ingest_report(report(node, Status.FAIL), False)
                await gating.apply(datetime.now(UTC))
                assert list(gating.queue.pending)[-1] == node
                await until(
                    lambda: not gating.queue.pending and not gating.queue.inflight,
                    "every queued node written",
                )
                await gating.apply(datetime.now(UTC))  # nothing left to want
                assert not gating.queue.pending and gating.writes == N
                assert sum(gating.queue.latency.counts) == N  # every write's dirty->written
            finally:
                drain.cancel()
                await asyncio.gather(drain, return_exceptions=True)
                kube.close()

        asyncio.run(main())

        labels = Counter(
            (n["metadata"].get("labels") or {}).get(LabelKey.FABRIC.value)
            for n in cluster.list("v1", "nodes")
        )
        assert labels == Counter({UNHEALTHY.value: N})
        patches = _node_patches(cluster)
        per_node = Counter(node for _, node in patches)
        assert per_node[flipped[0]] == 1
        assert set(per_node.values()) == {1} and len(per_node) == N
        # the contract: in every second no more than the rate plus what the bucket saved up
        start = patches[0][0]
        per_second = Counter(int(at - start) for at, _ in patches)
        assert max(per_second.values()) <= RATE + BURST, per_second
