"""Test MQTT clients that play a validation's agents in a NetworkLoadTest: they read the
operator's retained plans on `netval/v1/<validation>/+/loadplan` and answer each stage
with the LoadResults of tests/loadtest_fabric.py's synthetic fabric, stamped with the time
they are sent (the operator checks each message's clock against its own).

Two ways to make the results: `answer(fabric, plan)` (tests/loadtest_fabric.py) when the
test can read the operator's `RunPlan` (in-process operator), or `answer_plans` from the
per-node plans alone (a real `netval operator` process), which needs every node's plan of
the stage: it answers once `expected` nodes' plans of a stage arrived.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import aiomqtt

from loadtest_fabric import IDLE_MS, Fabric, _samples, answer
from mosquitto import MosquittoBroker
from netval.model.loadplan import (
    FlowResult,
    FlowTask,
    LatencyResult,
    LatencyTask,
    LoadAbort,
    LoadPlan,
    LoadResult,
    StorageResult,
    StorageTask,
    decode_plan,
    encode,
)
from netval.operator.loadtest.plan import RunPlan


def answer_plans(fabric: Fabric, plans: dict[str, LoadPlan]) -> list[LoadResult]:
    """One stage's results from every node's plan of it (`answer` without the RunPlan)."""
    by_window: dict[str, list[tuple[str, str]]] = {}
    readers: dict[str, int] = {}
    for node, plan in plans.items():
        for task in plan.tasks:
            if isinstance(task, FlowTask) and task.rail == 0:  # each plane alike
                by_window.setdefault(task.window, []).append((node, task.peer))
            elif isinstance(task, StorageTask):
                readers[task.window] = readers.get(task.window, 0) + 1
    rates = {w: fabric.flow_rates(SimpleNamespace(flows=f)) for w, f in by_window.items()}  # type: ignore[arg-type]
    out: list[LoadResult] = []
    for node, plan in sorted(plans.items()):
        flows: list[FlowResult] = []
        latency: list[LatencyResult] = []
        storage: list[StorageResult] = []
        for task in plan.tasks:
            if isinstance(task, FlowTask):
                mbps = rates[task.window][(node, task.peer)]
                begin = task.start + _seconds(task.warmup_seconds)
                flows.append(FlowResult(window=task.window, peer=task.peer, rail=task.rail,
                                        bytes=int(mbps * 1e6 / 8 * task.seconds),
                                        start=begin, end=task.end,
                                        port_mbps=fabric.port_mbps))  # fmt: skip
            elif isinstance(task, LatencyTask):
                if task.loaded:
                    mbps = rates[task.window][(node, task.peer)]
                    ms = IDLE_MS * (1 + 10 * mbps / fabric.port_mbps)
                    latency.append(LatencyResult(window=task.window, peer=task.peer, loaded=True,
                                                 sent=100, received=99, histogram=_samples(ms, 99)))  # fmt: skip
                else:
                    latency.append(LatencyResult(window=task.window, peer=task.peer, loaded=False,
                                                 sent=30, received=30, histogram=_samples(IDLE_MS, 30)))  # fmt: skip
            elif isinstance(task, StorageTask):
                mbps = min(fabric.port_mbps, fabric.storage_mbps / readers[task.window])
                storage.append(StorageResult(window=task.window, endpoint=task.endpoint,
                                             bytes=int(mbps * 1e6 / 8 * task.seconds),
                                             start=task.start + _seconds(task.warmup_seconds),
                                             end=task.end))  # fmt: skip
        out.append(LoadResult(run=plan.run, stage=plan.stage, validation=plan.validation,
                              node=node, sent_at=datetime.now(UTC), flows=flows,
                              latency=latency, storage=storage))  # fmt: skip
    return out


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


class FakeAgents:
    """Answers plans from a thread of its own; records the plans and aborts it saw."""

    def __init__(
        self,
        broker: MosquittoBroker,
        validation: str,
        fabric: Fabric,
        *,
        run_plan: Callable[[str], RunPlan | None] | None = None,
        expected: int = 0,
        answering: bool = True,
    ) -> None:
        self.broker = broker
        self.validation = validation
        self.fabric = fabric
        self.run_plan = run_plan
        self.expected = expected
        self.answering = answering
        self.plans: dict[tuple[str, int], dict[str, LoadPlan]] = {}
        self.aborts: dict[str, LoadAbort] = {}  # node -> the abort on its plan topic
        self.cleared: set[str] = set()  # nodes whose plan topic was cleared
        self.answered: set[tuple[str, int]] = set()
        self.subscribed = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        b = self.broker
        async with aiomqtt.Client(b.host, b.port, username=b.username, password=b.password) as c:
            await c.subscribe(f"netval/v1/{self.validation}/+/loadplan", qos=1)
            self.subscribed.set()
            reader = asyncio.create_task(self._read(c))
            await self._stop.wait()
            reader.cancel()

    async def _read(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            node = message.topic.value.split("/")[3]
            payload = message.payload if isinstance(message.payload, bytes) else b""
            if not payload:
                self.cleared.add(node)
                continue
            decoded = decode_plan(payload)
            if isinstance(decoded, LoadAbort):
                self.aborts[node] = decoded
                continue
            key = (decoded.run, decoded.stage)
            self.plans.setdefault(key, {})[node] = decoded
            if self.answering and key not in self.answered:
                results = self._results(key)
                if results is not None:
                    self.answered.add(key)
                    for r in results:
                        name = f"netval/v1/{r.validation}/{r.node}/loadresult"
                        await client.publish(name, encode(r), qos=1)

    def _results(self, key: tuple[str, int]) -> list[LoadResult] | None:
        run, stage = key
        if self.run_plan is not None:
            plan = self.run_plan(run)
            if plan is None:
                return None
            now = datetime.now(UTC)
            return [
                r.result.model_copy(update={"sent_at": now})
                for r in answer(self.fabric, plan)
                if r.result.stage == stage
            ]
        if len(self.plans[key]) < self.expected:
            return None
        return answer_plans(self.fabric, self.plans[key])


@contextmanager
def fake_agents(*args: Any, **kwargs: Any) -> Iterator[FakeAgents]:
    agents = FakeAgents(*args, **kwargs)
    thread = threading.Thread(target=lambda: asyncio.run(agents._main()), daemon=True)
    thread.start()
    if not agents.subscribed.wait(10):
        raise TimeoutError("the fake agents did not subscribe")
    try:
        yield agents
    finally:
        loop, stop = agents._loop, agents._stop
        if loop is not None and stop is not None:
            loop.call_soon_threadsafe(stop.set)
        thread.join(10)
