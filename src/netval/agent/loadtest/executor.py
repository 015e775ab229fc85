"""Run this node's load plans: the async orchestration of `netval.agent.loadtest`.

- `handle(payload)` takes a message of this node's ``loadplan`` topic (`plan_intake`): a new
  plan starts at once (its tasks wait for their absolute start times), an abort (whatever
  its run: one run per validation at a time, and silence is the safe answer) or a cleared
  plan stops everything that runs within `STOP_SECONDS`; a stage's plan may arrive while the previous
  stage's last seconds run, so several plans may run at once.
- Every plan stops by itself at its `deadline` (an agent that lost the operator stops on its
  own), then its `LoadResult` goes out (QoS 1, not retained), one per plan, within
  `RESULT_BUDGET_BYTES` (latency samples are thinned to fit).
- `busy()` is True while a plan runs: the continuous peer samples and storage slot reads
  pause (docs/loadtest.md, "The agent's side").
- `admit_flow(source, token)` is the peer sink's gate for load flows: accepted only from an
  announced peer address, for a (run, window) this node itself runs now; the answer is how
  long the flow may last (to the window's end plus the clock tolerance).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

import aiomqtt

from netval.agent.loadtest.flows import FlowOutcome, send_flow
from netval.agent.loadtest.latency import echo_samples
from netval.agent.loadtest.plan_intake import PlanIntake, Refusal, Refused, Run, Stop
from netval.agent.loadtest.storage import read_endpoint
from netval.agent.peers.endpoints import Endpoint
from netval.agent.peers.target import PeerTarget
from netval.agent.peers.wire import load_token
from netval.model.loadplan import (
    CLOCK_TOLERANCE_SECONDS,
    MAX_RESULT_BYTES,
    FlowResult,
    FlowTask,
    LatencyResult,
    LatencyTask,
    LoadPlan,
    LoadResult,
    StorageResult,
    StorageTask,
    encode,
)
from netval.model.spec import NetworkValidationSpec
from netval.model.topics import TopicKind, topic

log = logging.getLogger("netval.agent.loadtest")

STOP_SECONDS: Final = 2.0  # abort to silence (docs/loadtest.md)
MAX_FLOW_THREADS: Final = 32
# The model's limit: under the chart broker's packet limit with room for the topic.
RESULT_BUDGET_BYTES: Final = MAX_RESULT_BYTES
_LOG_EVERY: Final = 60.0


@dataclass
class LoadStats:
    plans_run: int = 0
    plans_aborted: int = 0
    bytes_sent: int = 0
    results_published: int = 0


@dataclass
class _Running:
    plan: LoadPlan
    halt: threading.Event = field(default_factory=threading.Event)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    aborted: bool = False
    task: asyncio.Task[None] | None = None
    windows: dict[int, tuple[float, float]] = field(default_factory=dict)  # token -> span
    sources: set[str] = field(default_factory=set)  # addresses this stage exchanges with

    def stop(self, aborted: bool) -> None:
        self.aborted = self.aborted or aborted
        self.halt.set()
        self.stopped.set()


class LoadExecutor:
    def __init__(
        self,
        *,
        validation: str,
        node: str,
        endpoints: Callable[[], dict[str, Endpoint]],
        source: Callable[[], str | None],
        spec: Callable[[], NetworkValidationSpec],
    ) -> None:
        self.validation = validation
        self.node = node
        self.topic = topic(validation, node, TopicKind.LOAD_PLAN)
        self.intake = PlanIntake(validation, node)
        self.stats = LoadStats()
        # set by the agent once its publisher exists; results before that are dropped
        self.publish: Callable[[bytes], None] = lambda _payload: None
        self.spec = spec  # the spec in force (the agent points it at its runner's)
        self._endpoints = endpoints
        self._source = source
        self._runs: dict[tuple[str, int], _Running] = {}
        self._threads = ThreadPoolExecutor(MAX_FLOW_THREADS, thread_name_prefix="netval-load")
        self._last_log: dict[str, float] = {}

    # -- MQTT in -------------------------------------------------------------------------

    def on_message(self, message: aiomqtt.Message) -> None:
        if message.topic.value != self.topic:
            return
        payload = message.payload
        self.handle(payload if isinstance(payload, bytes) else str(payload or "").encode())

    def handle(self, payload: bytes) -> None:
        """One message of this node's loadplan topic; never raises for bad input."""
        decision = self.intake.decide(payload, datetime.now(UTC))
        if isinstance(decision, Refused) and decision.reason is Refusal.REPEATED:
            # the retained plan again after a reconnect: expected, not worth a warning
            log.debug("load plan already taken: %s", decision.detail)
        elif isinstance(decision, Refused):
            self._log(decision.reason.value, f"load plan ignored ({decision.reason.value}): "
                      f"{decision.detail}")  # fmt: skip
        elif isinstance(decision, Stop):
            self.stop(decision.run, decision.reason)
        elif isinstance(decision, Run):
            self._start(decision.plan)

    def _log(self, key: str, message: str) -> None:
        now = time.monotonic()
        if now - self._last_log.get(key, float("-inf")) >= _LOG_EVERY:
            self._last_log[key] = now
            log.warning("%s", message)

    # -- what runs -----------------------------------------------------------------------

    def busy(self) -> bool:
        return bool(self._runs)

    def stop(self, run: str | None, reason: str) -> None:
        """Stop every plan (an abort names its run: logged)."""
        for (run_id, stage), running in self._runs.items():
            log.info("load plan %s stage %d stopped (abort of %s): %s", run_id, stage,
                     run or "everything", reason[:200])  # fmt: skip
            running.stop(aborted=True)

    async def close(self) -> None:
        self.stop(None, "agent stopping")
        tasks = [r.task for r in self._runs.values() if r.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_SECONDS + 1)
        self._threads.shutdown(wait=False, cancel_futures=True)

    def admit_flow(self, source: str, token: int) -> float | None:
        """Seconds a load flow from `source` with header `token` may last, or None."""
        now = time.time()
        announced: set[str] | None = None
        for running in self._runs.values():
            span = running.windows.get(token)
            if span is None or not span[0] - CLOCK_TOLERANCE_SECONDS <= now < span[1]:
                continue
            if source in running.sources:
                return span[1] - now
            if announced is None:
                announced = {e.address for e in self._endpoints().values()}
            if source in announced:
                return span[1] - now
        return None

    def _start(self, plan: LoadPlan) -> None:
        running = _Running(plan)
        # the plan names the addresses of the nodes it exchanges traffic with in this stage
        running.sources = {str(p.address) for p in plan.peers.values()}
        for t in plan.tasks:
            if isinstance(t, FlowTask):
                end = t.end.timestamp() + CLOCK_TOLERANCE_SECONDS
                running.windows[load_token(plan.run, t.window)] = (t.start.timestamp(), end)
        key = (plan.run, plan.stage)
        self._runs[key] = running
        self.stats.plans_run += 1
        log.info("load plan %s stage %d: %d task(s) until %s", plan.run, plan.stage,
                 len(plan.tasks), plan.deadline.isoformat())  # fmt: skip
        running.task = asyncio.create_task(self._run(key, running), name=f"netval-load {key}")

    async def _run(self, key: tuple[str, int], running: _Running) -> None:
        loop = asyncio.get_running_loop()
        plan = running.plan
        # safety: whatever still runs stops at the deadline, operator or not
        watchdog = loop.call_later(
            max(0.0, plan.deadline.timestamp() - time.time()), running.stop, False
        )
        try:
            results = await self._execute(running)
            if running.aborted:
                self.stats.plans_aborted += 1
            self._send(plan, *results)
        except Exception:
            log.exception("load plan %s stage %d failed", *key)
            self._send(plan, [], [], [], error="the agent failed running the plan")
        finally:
            watchdog.cancel()
            running.stop(aborted=False)
            self._runs.pop(key, None)

    async def _execute(
        self, running: _Running
    ) -> tuple[list[FlowResult], list[LatencyResult], list[StorageResult]]:
        plan = running.plan
        flows = [t for t in plan.tasks if isinstance(t, FlowTask)]
        echoes = [t for t in plan.tasks if isinstance(t, LatencyTask)]
        reads = [t for t in plan.tasks if isinstance(t, StorageTask)]
        endpoints = {e.name: e for e in self.spec().checks.storage.endpoints}
        flow_results = asyncio.gather(*(self._flow(running, t) for t in flows))
        echo_results = asyncio.gather(*(self._echo(running, t) for t in echoes))
        read_results = asyncio.gather(
            *(read_endpoint(t, endpoints.get(t.endpoint), t.start.timestamp(), running.stopped)
              for t in reads)
        )  # fmt: skip
        f, e, r = await asyncio.gather(flow_results, echo_results, read_results)
        return list(f), list(e), list(r)

    def _target(self, plan: LoadPlan, peer: str) -> PeerTarget | None:
        given = plan.peers.get(peer)
        if given is not None:  # the operator's view of the peer's endpoint, for this stage
            return PeerTarget(peer, str(given.address), given.port, None)
        endpoint = self._endpoints().get(peer)  # an operator older than plan peers
        if endpoint is None:
            return None
        return PeerTarget(peer, endpoint.address, endpoint.port, endpoint.domain)

    async def _flow(self, running: _Running, task: FlowTask) -> FlowResult:
        start = task.start.timestamp()
        measure = start + task.warmup_seconds
        end = measure + task.seconds
        target = self._target(running.plan, task.peer)
        if target is None:
            outcome = FlowOutcome(0, measure, end, f"{task.peer} has announced no endpoint")
        else:
            loop = asyncio.get_running_loop()
            outcome = await loop.run_in_executor(
                self._threads,
                lambda: send_flow(
                    target.address, target.port, source=self._source(),
                    token=load_token(running.plan.run, task.window), start=start,
                    measure_start=measure, end=end, cap_mbps=running.plan.max_rate_mbps,
                    halt=running.halt,
                ),
            )  # fmt: skip
        self.stats.bytes_sent += outcome.sent
        return FlowResult(
            window=task.window,
            peer=task.peer,
            bytes=outcome.bytes,
            start=datetime.fromtimestamp(outcome.start, UTC),
            end=datetime.fromtimestamp(max(outcome.end, outcome.start + 1e-3), UTC),
            error=outcome.error,
        )

    async def _echo(self, running: _Running, task: LatencyTask) -> LatencyResult:
        target = self._target(running.plan, task.peer)
        if target is None:
            return LatencyResult(window=task.window, peer=task.peer, loaded=task.loaded,
                                 sent=0, received=0)  # fmt: skip
        return await echo_samples(
            task, target, self._source(), task.start.timestamp(), running.stopped
        )

    # -- MQTT out ------------------------------------------------------------------------

    def _send(
        self,
        plan: LoadPlan,
        flows: list[FlowResult],
        latency: list[LatencyResult],
        storage: list[StorageResult],
        *,
        error: str | None = None,
    ) -> None:
        result = fit(
            LoadResult(
                run=plan.run, stage=plan.stage, validation=self.validation, node=self.node,
                sent_at=datetime.now(UTC), flows=flows, latency=latency, storage=storage,
                error=error,
            )
        )  # fmt: skip
        self.publish(encode(result))
        self.stats.results_published += 1


def fit(result: LoadResult, budget: int = RESULT_BUDGET_BYTES) -> LoadResult:
    """`result` with its latency samples thinned (every other one dropped) until it encodes
    within `budget` bytes; without samples and still too big, its flows as they are."""
    while len(encode(result)) > budget and any(r.samples_ms for r in result.latency):
        thinned = [
            r.model_copy(update={"samples_ms": r.samples_ms[::2] if len(r.samples_ms) > 1 else []})
            for r in result.latency
        ]
        result = result.model_copy(update={"latency": thinned})
    return result
